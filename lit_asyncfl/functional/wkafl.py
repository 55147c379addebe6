"""WKAFL (Zhou et al., IEEE TPDS 2022): two-stage weighted K-asynchronous aggregation with an adaptive rate.

Symbols: :math:`g_i` a buffered pseudo-gradient (:math:`-\\Delta_i` plus the momentum term), :math:`\\tau_i` its
staleness counted from 1 (the authors' counter: 1 for a gradient of the current model), :math:`C_1` the first
clipping factor, :math:`B` the second-stage clipping factor, :math:`\\theta` the consistency threshold.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor


def clip_norm(vector: Tensor, bound: float) -> Tensor:
    r""":math:`v \cdot \min(1, bound / \|v\|)`: the vector scaled down to norm ``bound`` when longer.

    Example:
        >>> clip_norm(torch.tensor([3.0, 4.0]), 2.5).tolist(), clip_norm(torch.tensor([3.0, 4.0]), 9.0).tolist()
        ([1.5, 2.0], [3.0, 4.0])
    """
    norm = float(vector.norm())
    return vector * (bound / norm) if bound < norm else vector


def staleness_weights(staleness: Sequence[float]) -> list[float]:
    r"""Stage one's weights :math:`w_i = (e/2)^{-\tau_i} / \sum_j (e/2)^{-\tau_j}`.

    Example:
        >>> [round(w, 4) for w in staleness_weights([1, 2])]  # (e/2)^-1 : (e/2)^-2 = 1.359 : 1
        [0.5761, 0.4239]
    """
    raw = [(math.e / 2) ** (-float(t)) for t in staleness]
    total = sum(raw)
    return [r / total for r in raw]


def cosine(a: Tensor, b: Tensor) -> float:
    """Cosine similarity (1 for a zero ``a``, as the authors' code; 0 for a zero ``b``).

    Example:
        >>> cosine(torch.tensor([1.0, 0.0]), torch.tensor([1.0, 1.0]))  # doctest: +ELLIPSIS
        0.7071...
    """
    na, nb = float(a.norm()), float(b.norm())
    if na == 0:
        return 1.0
    if nb == 0:
        return 0.0
    return float(torch.dot(a, b)) / (na * nb)


def two_stage_aggregate(
    gradients: Sequence[Tensor],
    staleness: Sequence[float],
    first_clip: float = 100.0,
    second_clip: float = 10.0,
    threshold: float = 0.3,
    temperature: float = 10.0,
    clip_in_place: bool = True,
) -> tuple[Tensor, Tensor, list[bool]]:
    r"""WKAFL's two stages over the :math:`K` buffered gradients.

    Stage one estimates the global direction from all of them, staleness-weighted, each clipped to
    :math:`C_1 \|g_{f}\|` (:math:`g_f` the freshest gradient):
    :math:`\tilde G = \sum_i w_i\, \mathrm{clip}(g_i, C_1 \|g_f\|)`. Stage two keeps the *consistent* gradients,
    :math:`\cos(g_i, \tilde G) > \theta`, weighted by :math:`\hat w_i \propto e^{\,T \cos(g_i, \tilde G)}\, w_i`,
    each clipped to :math:`B \|\tilde G\|`:
    :math:`G = \sum_{i\ \mathrm{kept}} \hat w_i\, \mathrm{clip}(g_i, B \|\tilde G\|)`; :math:`G = \tilde G` when none is
    consistent.

    With ``clip_in_place`` (the default), stage two reads each :math:`g_i` as stage one clipped it,
    :math:`\mathrm{clip}(g_i, C_1 \|g_f\|)`, as the authors' code does (its ``TensorClip`` rewrites the buffered
    gradients in place); ``False``: the gradients as they came. Cosines do not depend on it, the final sum does.

    Returns:
        :math:`G`, :math:`\tilde G` and which gradients stage two kept.

    Example:
        >>> g = [torch.tensor([1.0, 0.0]), torch.tensor([-1.0, 0.2])]
        >>> G, est, kept = two_stage_aggregate(g, [1, 3])
        >>> kept, G.tolist() == g[0].tolist()  # the second points the other way: only the first is kept
        ([True, False], True)
    """
    weights = staleness_weights(staleness)
    fresh = min(range(len(gradients)), key=lambda i: (staleness[i], i))
    bound = first_clip * float(gradients[fresh].norm())
    clipped = [clip_norm(g, bound) for g in gradients]
    estimate = sum(w * g for w, g in zip(weights, clipped))
    assert isinstance(estimate, Tensor)
    if clip_in_place:
        gradients = clipped
    sims = [cosine(g, estimate) for g in gradients]
    kept = [s > threshold for s in sims]
    if not any(kept):
        return estimate, estimate, kept
    raw = [math.exp(temperature * s) * w if k else 0.0 for s, w, k in zip(sims, weights, kept)]
    total = sum(raw)
    bound = second_clip * float(estimate.norm())
    out = sum((r / total) * clip_norm(g, bound) for r, g, k in zip(raw, gradients, kept) if k)
    assert isinstance(out, Tensor)
    return out, estimate, kept


def adaptive_lr(lr: float, min_staleness: float, c: float = 0.1) -> float:
    r""":math:`\eta_t = \eta / (1 + c\, \tau_{min})`, :math:`\tau_{min}` the smallest staleness of the buffer.

    Example:
        >>> adaptive_lr(1.0, 1), adaptive_lr(0.5, 10)
        (0.9090909090909091, 0.25)
    """
    return lr / (1.0 + c * min_staleness)
