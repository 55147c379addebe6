"""Client-level differential privacy as pure functions: clipping, Gaussian noise and the RDP accountant (DP-FedAvg,
McMahan et al., 2018; DP-FedBuff: FedBuff, Nguyen et al., 2022, and Papaya, Huba et al., 2022)."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable

import torch
from torch import Tensor

INSTALL_HINT = "pip install lit-asyncfl[privacy]"


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
    history = [(float(z), float(q), int(n)) for z, q, n in steps if n > 0]
    if not history:
        return 0.0
    try:
        from opacus.accountants import RDPAccountant
    except ImportError as error:  # pragma: no cover - exercised only without the extra
        raise ImportError(f"privacy accounting needs opacus: {INSTALL_HINT}") from error
    accountant = RDPAccountant()
    accountant.history = history
    return float(accountant.get_epsilon(delta=delta))
