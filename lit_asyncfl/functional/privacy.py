"""Client-level differential privacy as pure functions: clipping, Gaussian noise and the RDP and PRV accountants
(DP-FedAvg, McMahan et al., 2018; DP-FedBuff: FedBuff, Nguyen et al., 2022, and Papaya, Huba et al., 2022)."""

from __future__ import annotations

import importlib.util
import math
import sys
import warnings
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lit_asyncfl.checks import check_choice, check_number

INSTALL_HINT = "pip install lit-asyncfl[privacy]"

#: The accountants that compose the subsampled Gaussian mechanism's steps (Opacus's ``RDPAccountant`` and
#: ``PRVAccountant``).
ACCOUNTANTS = ("rdp", "prv")
#: The :math:`\delta` the PRV accountant accepts: below, Opacus's discretization drowns in floating-point error
#: (``ValueError``); above, :math:`\varepsilon` comes out negative or cannot be computed.
PRV_DELTA_RANGE = (1e-10, 1e-2)
#: The largest discretization (points of the PRV's domain) computed: its cost grows with :math:`\varepsilon` and
#: :math:`\sqrt{\text{steps}}` (about 1 s and 200 MB at this size); beyond it the RDP bound is reported instead.
PRV_MAX_DOMAIN = 2**21
#: What the ``RuntimeWarning`` of :func:`prv_epsilon` says when it reports the RDP bound instead.
RDP_FALLBACK = "reporting the RDP bound"
#: Opacus's default additive error of the PRV's :math:`\varepsilon` (its ``eps_error``).
PRV_EPS_ERROR = 0.01


def require_opacus(what: str) -> None:
    """Raise ``ImportError`` with the install hint unless Opacus (the accountant) can be imported: called at
    construction, so that a run never fails at its first :math:`\\varepsilon`, mid-event and without a checkpoint.

    Example:
        >>> require_opacus("GaussianAggregateNoise")  # doctest: +SKIP
    """
    if importlib.util.find_spec("opacus") is None:
        raise ImportError(f"{what} with noise_multiplier > 0 accounts its epsilon with opacus: {INSTALL_HINT}")


def clip_delta(delta: Tensor, clip_norm: float) -> tuple[Tensor, float]:
    r"""Scale a model delta to L2 norm at most :math:`C`: :math:`\Delta \cdot \min(1, C / \lVert\Delta\rVert_2)`.

    Returns the clipped delta and the norm before clipping (computed in float64).

    Example:
        >>> clipped, norm = clip_delta(torch.tensor([3.0, 4.0]), 1.0)
        >>> clipped.tolist(), norm
        ([0.6000000238418579, 0.800000011920929], 5.0)
    """
    norm = float(delta.double().norm())
    if norm <= clip_norm:
        return delta, norm
    return delta * (clip_norm / norm), norm


def gaussian_noise(like: Tensor, std: float, seed: int) -> Tensor:
    r"""Noise :math:`\mathcal{N}(0, \sigma^2 I)` shaped as ``like``, drawn from a generator seeded by ``seed`` alone
    (never the global RNG), so a draw depends only on its seed.

    Example:
        >>> torch.equal(gaussian_noise(torch.zeros(3), 1.0, 7), gaussian_noise(torch.zeros(3), 1.0, 7))
        True
    """
    generator = torch.Generator(device="cpu").manual_seed(int(seed))
    noise = torch.randn(like.shape, generator=generator, dtype=torch.float64) * std
    return noise.to(device=like.device, dtype=like.dtype)


def rdp_epsilon(steps: Iterable[tuple[float, float, int]], delta: float) -> float:
    r"""The :math:`\varepsilon` spent at :math:`\delta` by Gaussian mechanisms with Poisson subsampling, from
    Opacus's RDP accountant (Mironov, 2017; Mironov et al., 2019).

    Args:
        steps: ``(noise_multiplier z, sample_rate q, number of steps)`` triples.
        delta: The :math:`\delta` of :math:`(\varepsilon, \delta)`-DP.

    Returns:
        :math:`\varepsilon` (``0.0`` before any step).

    Example:
        >>> round(rdp_epsilon([(1.0, 0.1, 100)], 1e-5), 3)  # doctest: +SKIP
        7.899
    """
    accountant = _opacus_accountant("RDPAccountant", steps)
    return 0.0 if accountant is None else float(accountant.get_epsilon(delta=delta))


def _opacus_accountant(kind: str, steps: Iterable[tuple[float, float, int]]) -> Any:
    """Opacus's accountant ``kind`` holding ``steps`` (``(z, q, n)``, empty ones left out) as its history; ``None``
    when there is no step."""
    history = [(float(z), float(q), int(n)) for z, q, n in steps if n > 0]
    if not history:
        return None
    try:
        from opacus import accountants
    except ImportError as error:  # pragma: no cover - exercised only without the extra
        raise ImportError(f"privacy accounting needs opacus: {INSTALL_HINT}") from error
    accountant = getattr(accountants, kind)()
    accountant.history = history
    return accountant


def check_accountant(accountant: str, delta: float) -> None:
    """Refuse an unknown accountant, and a :math:`\\delta` outside :data:`PRV_DELTA_RANGE` for ``"prv"``.

    Example:
        >>> check_accountant("prv", 1e-12)
        Traceback (most recent call last):
        ...
        ValueError: delta (for accountant='prv') must be in [1e-10, 0.01], got 1e-12
    """
    check_choice("accountant", accountant, ACCOUNTANTS)
    if accountant == "prv":
        check_number("delta (for accountant='prv')", delta, *PRV_DELTA_RANGE)


def prv_domain_size(steps: Iterable[tuple[float, float, int]], delta: float) -> int:
    """The number of points of the domain on which Opacus's ``PRVAccountant`` discretizes ``steps``
    (``get_epsilon(delta)`` with its default errors), computed from RDP bounds alone (cheap).

    Example:
        >>> prv_domain_size([(1.0, 0.1, 12)], 1e-5)  # doctest: +SKIP
        151846
    """
    from opacus.accountants.analysis.prv import Domain, PoissonSubsampledGaussianPRV, compute_safe_domain_size

    history = [(float(z), float(q), int(n)) for z, q, n in steps if n > 0]
    delta_error = delta / 1000  # Opacus's default, as in PRVAccountant.get_epsilon
    counts = [n for _, _, n in history]
    prvs = [PoissonSubsampledGaussianPRV(q, z) for z, q, _ in history]
    half = compute_safe_domain_size(prvs, counts, eps_error=PRV_EPS_ERROR, delta_error=delta_error)
    mesh = PRV_EPS_ERROR / math.sqrt(sum(counts) * math.log(12 / delta_error) / 2)
    if not math.isfinite(half):
        return sys.maxsize
    return Domain.create_aligned(-half, half, mesh).size


def prv_epsilon(steps: Iterable[tuple[float, float, int]], delta: float) -> float:
    r"""The :math:`\varepsilon` spent at :math:`\delta` by Gaussian mechanisms with Poisson subsampling, from
    Opacus's PRV accountant (numerical composition of privacy loss random variables: Gopi, Lee and Wutschitz, 2021,
    *Numerical Composition of Differential Privacy*, NeurIPS): the upper end of its estimate, at Opacus's default
    errors (``eps_error`` :data:`PRV_EPS_ERROR`, ``delta_error`` :math:`\delta / 1000`).

    Where the discretization would exceed :data:`PRV_MAX_DOMAIN` points (a large :math:`\varepsilon` or very many
    steps), or Opacus cannot compute it, the RDP bound (:func:`rdp_epsilon`, also an upper bound) is returned, with
    a ``RuntimeWarning``.

    Args:
        steps: ``(noise_multiplier z, sample_rate q, number of steps)`` triples.
        delta: The :math:`\delta` of :math:`(\varepsilon, \delta)`-DP, in :data:`PRV_DELTA_RANGE`.

    Example:
        >>> round(prv_epsilon([(1.0, 0.1, 12)], 1e-5), 3)  # doctest: +SKIP
        3.031
    """
    accountant = _opacus_accountant("PRVAccountant", steps)
    if accountant is None:
        return 0.0
    history = accountant.history
    with warnings.catch_warnings(), np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        warnings.simplefilter("ignore", UserWarning)  # Opacus's RDP order-range notes, from its domain bound
        size = prv_domain_size(history, delta)
        if size <= PRV_MAX_DOMAIN:
            try:
                return max(0.0, float(accountant.get_epsilon(delta=delta)))
            except (ValueError, RuntimeError) as error:
                why = f"Opacus's PRV accountant failed ({error})"
        else:
            why = f"the PRV accountant would discretize on {size:.3g} points (PRV_MAX_DOMAIN = {PRV_MAX_DOMAIN})"
    epsilon = rdp_epsilon(history, delta)
    warnings.warn(f"{why}: {RDP_FALLBACK} epsilon = {epsilon:.4g} instead", RuntimeWarning, stacklevel=2)
    return epsilon


def epsilon_spent(steps: Iterable[tuple[float, float, int]], delta: float, accountant: str = "rdp") -> float:
    """The :math:`\\varepsilon` at ``delta`` of ``steps`` from ``accountant`` (:func:`rdp_epsilon` or
    :func:`prv_epsilon`).

    Example:
        >>> epsilon_spent([], 1e-5, "prv")
        0.0
    """
    return prv_epsilon(steps, delta) if accountant == "prv" else rdp_epsilon(steps, delta)


def uploads_within(
    noise_multiplier: float, sample_rate: float, delta: float, max_epsilon: float, accountant: str = "rdp"
) -> int:
    """The largest number of steps :math:`n` of one Gaussian mechanism (``noise_multiplier``, ``sample_rate``) whose
    :math:`\\varepsilon(n)` at ``delta`` (:func:`epsilon_spent`) is at most ``max_epsilon`` (``0``: not even one);
    :math:`\\varepsilon(n)` grows with :math:`n`, so it is found by doubling, then bisection.

    Example:
        >>> uploads_within(1.0, 1.0, 1e-5, 8.0)  # doctest: +SKIP
        2
    """

    def within(n: int) -> bool:
        return epsilon_spent([(noise_multiplier, sample_rate, n)], delta, accountant) <= max_epsilon

    if not within(1):
        return 0
    low, high = 1, 2
    while within(high):  # within(low), not within(high) after the loop
        low, high = high, high * 2
        if high > 2**40:
            return low
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if within(mid) else (low, mid)
    return low
