"""FedASMU's dynamic staleness-aware server weight, learned per device by hyper-gradient descent."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from lit_asyncfl.checks import check_finite, check_number
from lit_asyncfl.functional.fedasmu import CONTROL_LR, SIGMA_MIN, fedasmu_alpha, fedasmu_alpha_grads, fedasmu_xi
from lit_asyncfl.server.base import ServerCallback

# Default initial controls and mu_alpha (not given in the paper; tuned on the digits setup, see FedASMU).
MU_ALPHA = 1.0
LAMBDA0 = 30.0
SIGMA0 = 1.0
IOTA0 = 0.0

if TYPE_CHECKING:
    from lit_asyncfl.core.server import Server
    from lit_asyncfl.core.update import ClientUpdate


class DynamicStalenessWeight(ServerCallback):
    r"""The weight :math:`\alpha_t^i` of FedASMU (Formulas 1-3), with per-device control parameters.

    .. math::
        \xi = \frac{\lambda_i}{\sqrt{t \, (t - o + 1) \, \sigma_i}} + \iota_i, \qquad
        \alpha = \frac{\mu_\alpha \xi}{1 + \mu_\alpha \xi}

    multiplies the update's weight (use it with :class:`~lit_asyncfl.server.Mixing` at ``alpha=1``, so that
    :math:`w_{t+1} = (1 - \alpha) w_t + \alpha w_i`). Before computing a device's new :math:`\alpha` (Alg. 1,
    lines 12-14), its control parameters take one gradient step

    .. math:: \theta \leftarrow \theta - \eta_\theta \langle g, \Delta_{prev} \rangle
        \frac{\partial \alpha}{\partial \xi} \frac{\partial \xi}{\partial \theta}

    with :math:`g \approx (w_o - w_i) / (\eta_{local} \cdot \text{local steps})` estimated from the upload
    (**Resolution** of the appendix's sign; when the device merged a fresh model, the merge jump
    :math:`w_a - w_b` is taken out of :math:`w_i - w_o` first, so that :math:`g` measures local training only),
    and :math:`\Delta_{prev} = w_i^{prev} - w_{before}^{prev}` the
    direction of this device's previous accepted aggregation, differentiated at the :math:`t, s, \lambda, \sigma,
    \iota` used then. A device's first accepted upload uses the initial values. :math:`\sigma` is kept at least
    ``SIGMA_MIN``. ``eta_local`` is read from the client's optimizer (``update.info["lr"]``).

    Memory: one model-sized :math:`\Delta_{prev}` per device that has been aggregated (inherent to the method).

    Args:
        mu_alpha: :math:`\mu_\alpha`.
        lambda0: Initial :math:`\lambda_i`.
        sigma0: Initial :math:`\sigma_i`.
        iota0: Initial :math:`\iota_i`.
        lr_lambda: :math:`\eta_\lambda`.
        lr_sigma: :math:`\eta_\sigma`.
        lr_iota: :math:`\eta_\iota`.

    Example:
        >>> DynamicStalenessWeight(lambda0=1.0, iota0=0.2).controls(5)
        (1.0, 1.0, 0.2)
    """

    def __init__(
        self,
        mu_alpha: float = MU_ALPHA,
        lambda0: float = LAMBDA0,
        sigma0: float = SIGMA0,
        iota0: float = IOTA0,
        lr_lambda: float = CONTROL_LR,
        lr_sigma: float = CONTROL_LR,
        lr_iota: float = CONTROL_LR,
    ) -> None:
        check_number("mu_alpha", mu_alpha, 0, open_min=True)
        check_number("lambda0", lambda0, 0, open_min=True)
        check_number("sigma0", sigma0, 0, open_min=True)
        check_finite("iota0", iota0)
        check_number("lr_lambda", lr_lambda, 0)
        check_number("lr_sigma", lr_sigma, 0)
        check_number("lr_iota", lr_iota, 0)
        self.mu_alpha = mu_alpha
        self.lambda0, self.sigma0, self.iota0 = lambda0, sigma0, iota0
        self.lr_lambda, self.lr_sigma, self.lr_iota = lr_lambda, lr_sigma, lr_iota
        self._reset()

    def controls(self, client: int) -> tuple[float, float, float]:
        """Current :math:`(\\lambda_i, \\sigma_i, \\iota_i)` of a device."""
        return self._controls.get(client, (self.lambda0, self.sigma0, self.iota0))

    def _reset(self) -> None:
        self._controls: dict[int, tuple[float, float, float]] = {}
        self._previous: dict[int, dict[str, Any]] = {}
        self._pending: list[dict[str, Any]] = []

    def on_fit_start(self, server: Server) -> None:
        self._reset()

    def weight_update(self, server: Server, update: ClientUpdate, weight: float) -> float:
        client = update.client
        lam, sigma, iota = self.controls(client)
        prev = self._previous.get(client)
        if prev is not None:
            steps = max(update.num_steps, 1)
            n = server.param_numel  # a gradient of the parameters (floating buffers are not trained by SGD)
            movement = update.base_weights[:n] - update.weights[:n]
            if "merge_jump" in update.info:  # only the local SGD steps estimate the gradient, not the merge
                movement = movement + update.info["merge_jump"][:n]
            g = movement / (float(update.info.get("lr", 1.0)) * steps)
            inner = float(torch.dot(g, prev["delta"]))
            d_lam, d_sigma, d_iota = fedasmu_alpha_grads(
                prev["lambda"], prev["sigma"], prev["iota"], prev["version"], prev["staleness"], self.mu_alpha, inner
            )
            learned = (lam - self.lr_lambda * d_lam, max(sigma - self.lr_sigma * d_sigma, SIGMA_MIN),
                       iota - self.lr_iota * d_iota)  # fmt: skip
            if all(math.isfinite(v) for v in learned):  # only finite values teach the device's controls
                lam, sigma, iota = learned
                self._controls[client] = learned
        version, staleness = server.version, update.staleness + 1  # FedASMU's staleness t - o + 1
        alpha = fedasmu_alpha(fedasmu_xi(lam, sigma, iota, version, staleness), self.mu_alpha)
        self._pending.append(
            {
                "client": client,
                # direction of this aggregation, d w_{t+1} / d alpha, over the parameters
                "delta": update.weights[: server.param_numel] - server.weights[: server.param_numel],
                "lambda": lam,
                "sigma": sigma,
                "iota": iota,
                "version": version,
                "staleness": staleness,
            }
        )
        update.info["alpha"] = alpha
        return weight * alpha

    def on_aggregated(self, server: Server, updates: list[ClientUpdate]) -> None:
        aggregated = {u.client for u in updates}
        for pending in self._pending:
            if pending["client"] in aggregated:
                self._previous[pending.pop("client")] = pending
        self._pending = []

    def state_dict(self) -> dict[str, Any]:
        return {
            "controls": {c: list(v) for c, v in self._controls.items()},
            "previous": {c: dict(p) for c, p in self._previous.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._controls = {int(c): tuple(float(x) for x in v) for c, v in state["controls"].items()}  # type: ignore[misc]
        self._previous = {int(c): dict(p) for c, p in state["previous"].items()}
        self._pending = []
