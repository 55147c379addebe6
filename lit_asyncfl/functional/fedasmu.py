r"""FedASMU formulas (Liu et al., AAAI 2024): dynamic server weight :math:`\alpha`, fresh-model weight
:math:`\beta`, and their hyper-gradients.

Server (Formulas 1-3):

.. math::
    \xi = \frac{\lambda}{\sqrt{t \, s \, \sigma}} + \iota, \qquad
    \alpha = \frac{\mu_\alpha \xi}{1 + \mu_\alpha \xi}, \qquad s = t - o + 1

Device (Formulas 7-8):

.. math::
    \phi = \frac{\gamma}{\sqrt{g}} \left(1 - \frac{\upsilon}{\sqrt{g - o + 1}}\right), \qquad
    \beta = \frac{\mu_\beta \phi}{1 + \mu_\beta \phi}

**Resolutions**: ``t`` is replaced by ``max(t, 1)``; ``sigma`` is clamped to ``SIGMA_MIN`` so the root
stays defined; ``xi`` and ``phi`` are clamped at 0 so the weights stay in ``[0, 1)``, and a clamped quantity has
zero hyper-gradient (the clamp is flat there). The product form ``sqrt(t * s * sigma)`` is used; the
appendix prints ``sqrt(t) * s**sigma``.
"""

from __future__ import annotations

import math

#: Smallest value ``sigma`` is clamped to.
SIGMA_MIN = 1e-6
#: The learning rate of every control parameter (Table 5), the default of each.
CONTROL_LR = 1e-4


def fedasmu_xi(lam: float, sigma: float, iota: float, version: int, staleness: int) -> float:
    r""":math:`\xi = \lambda / \sqrt{\max(t, 1) \, s \, \sigma} + \iota`, clamped at 0.

    Args:
        lam: Control parameter :math:`\lambda_i`.
        sigma: Control parameter :math:`\sigma_i` (clamped to ``SIGMA_MIN``).
        iota: Control parameter :math:`\iota_i`.
        version: Current global version :math:`t`.
        staleness: FedASMU staleness :math:`s = t - o + 1 \ge 1`.

    Example:
        >>> fedasmu_xi(2.0, 1.0, 0.5, version=4, staleness=1)
        1.5
    """
    if staleness < 1:
        raise ValueError(f"FedASMU staleness t - o + 1 must be >= 1, got {staleness}")
    root = math.sqrt(max(version, 1) * staleness * max(sigma, SIGMA_MIN))
    return max(0.0, lam / root + iota)


def fedasmu_alpha(xi: float, mu_alpha: float) -> float:
    r""":math:`\alpha = \mu_\alpha \xi / (1 + \mu_\alpha \xi)`.

    Example:
        >>> fedasmu_alpha(1.5, mu_alpha=2.0)
        0.75
    """
    return mu_alpha * xi / (1.0 + mu_alpha * xi)


def fedasmu_alpha_grads(
    lam: float, sigma: float, iota: float, version: int, staleness: int, mu_alpha: float, inner: float
) -> tuple[float, float, float]:
    r"""Hyper-gradients :math:`(\partial F/\partial\lambda, \partial F/\partial\sigma, \partial F/\partial\iota)`.

    .. math::
        \frac{\partial F}{\partial \theta} = \langle g, \Delta_{prev} \rangle
        \frac{\mu_\alpha}{(1 + \mu_\alpha \xi)^2} \frac{\partial \xi}{\partial \theta}, \quad
        \frac{\partial \xi}{\partial \lambda} = \frac{1}{\sqrt{t s \sigma}}, \;
        \frac{\partial \xi}{\partial \sigma} = -\frac{\lambda}{2 \sigma \sqrt{t s \sigma}}, \;
        \frac{\partial \xi}{\partial \iota} = 1

    Args:
        lam: :math:`\lambda` used for the aggregation being differentiated.
        sigma: :math:`\sigma` used then.
        iota: :math:`\iota` used then.
        version: :math:`t` used then.
        staleness: :math:`s` used then.
        mu_alpha: :math:`\mu_\alpha`.
        inner: :math:`\langle g, \Delta_{prev} \rangle`.

    Example:
        >>> fedasmu_alpha_grads(2.0, 1.0, 0.5, version=4, staleness=1, mu_alpha=2.0, inner=1.0)
        (0.0625, -0.0625, 0.125)
    """
    sigma = max(sigma, SIGMA_MIN)
    root = math.sqrt(max(version, 1) * staleness * sigma)
    xi_raw = lam / root + iota
    if xi_raw < 0:
        return 0.0, 0.0, 0.0
    dalpha_dxi = mu_alpha / (1.0 + mu_alpha * xi_raw) ** 2
    scale = inner * dalpha_dxi
    return scale / root, scale * (-lam / (2.0 * sigma * root)), scale


def fedasmu_phi(gamma: float, upsilon: float, fresh_version: int, base_version: int) -> float:
    r""":math:`\phi = \gamma / \sqrt{g} \cdot (1 - \upsilon / \sqrt{g - o + 1})`, clamped at 0.

    Args:
        gamma: Control parameter :math:`\gamma_i`.
        upsilon: Control parameter :math:`\upsilon_i`.
        fresh_version: Version :math:`g` of the fresh global model (``g > o``).
        base_version: Version :math:`o` the device started from.

    Example:
        >>> fedasmu_phi(4.0, 1.0, fresh_version=4, base_version=0)
        1.1055728090000843
    """
    if fresh_version <= base_version:
        raise ValueError(f"the fresh model must be newer: g={fresh_version} <= o={base_version}")
    return max(0.0, gamma / math.sqrt(fresh_version) * (1.0 - upsilon / math.sqrt(fresh_version - base_version + 1)))


def fedasmu_beta(phi: float, mu_beta: float) -> float:
    r""":math:`\beta = \mu_\beta \phi / (1 + \mu_\beta \phi)`: the form of :math:`\alpha` (:func:`fedasmu_alpha`), in
    :math:`\phi` and :math:`\mu_\beta`.

    Example:
        >>> fedasmu_beta(1.0, mu_beta=3.0)
        0.75
    """
    return fedasmu_alpha(phi, mu_beta)


def fedasmu_beta_grads(
    gamma: float, upsilon: float, fresh_version: int, base_version: int, mu_beta: float, inner: float
) -> tuple[float, float]:
    r"""Hyper-gradients :math:`(\partial F_i/\partial\gamma, \partial F_i/\partial\upsilon)` on the local loss.

    .. math::
        \frac{\partial F_i}{\partial \theta} = \langle \nabla F_i(w_a; \zeta), w_g - w_b \rangle
        \frac{\mu_\beta}{(1 + \mu_\beta \phi)^2} \frac{\partial \phi}{\partial \theta}, \quad
        \frac{\partial \phi}{\partial \gamma} = \frac{1 - \upsilon / \sqrt{g - o + 1}}{\sqrt{g}}, \;
        \frac{\partial \phi}{\partial \upsilon} = -\frac{\gamma}{\sqrt{g} \sqrt{g - o + 1}}

    Example:
        >>> [round(v, 4) for v in fedasmu_beta_grads(4.0, 1.0, fresh_version=4, base_version=0, mu_beta=1.0, inner=1.0)]
        [0.0623, -0.2017]
    """
    root_g = math.sqrt(fresh_version)
    root_s = math.sqrt(fresh_version - base_version + 1)
    phi_raw = gamma / root_g * (1.0 - upsilon / root_s)
    if phi_raw < 0:
        return 0.0, 0.0
    scale = inner * mu_beta / (1.0 + mu_beta * phi_raw) ** 2
    return scale * (1.0 - upsilon / root_s) / root_g, scale * (-gamma / (root_g * root_s))
