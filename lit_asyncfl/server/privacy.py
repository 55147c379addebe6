"""Central client-level differential privacy (DP-FedAvg / DP-FedBuff): clip every client delta, noise every step."""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING, Any

from lit_asyncfl.checks import check, check_number
from lit_asyncfl.core.update import derive_seed
from lit_asyncfl.functional.privacy import check_accountant, clip_delta, epsilon_spent, gaussian_noise, require_opacus
from lit_asyncfl.server.adaptive_optimizer import AdaptiveServerOptimizer
from lit_asyncfl.server.aggregators import (
    Aggregator,
    DataSizeWeight,
    DeltaAverage,
    Mixing,
    ModelAverage,
    StalenessWeight,
)
from lit_asyncfl.server.base import ServerCallback
from lit_asyncfl.server.data_fraction import DataFractionWeight
from lit_asyncfl.server.feddyn import DynamicCorrection
from lit_asyncfl.server.norm_amplification import NormAmplification
from lit_asyncfl.server.staleness_bound import StalenessBound

if TYPE_CHECKING:
    from torch import Tensor

    from lit_asyncfl.core.server import Server
    from lit_asyncfl.core.update import ClientUpdate

#: Weight callbacks whose weights depend only on what the accounting treats as public (versions, shard sizes).
PUBLIC_WEIGHTS: tuple[type[ServerCallback], ...] = (StalenessWeight, DataSizeWeight, DataFractionWeight)

#: Step callbacks that only post-process the noised step (and public staleness): allowed after the noise.
POST_PROCESSING_STEPS: tuple[type[ServerCallback], ...] = (AdaptiveServerOptimizer,)

#: What to use instead of a step callback that reads the un-noised updates after the noise.
_STEP_ALTERNATIVES: dict[type[ServerCallback], str] = {
    DynamicCorrection: "FedDyn's server correction builds h from the clipped, un-noised deltas and re-releases them "
    "in every later version; use mode='local' for FedDyn",
    NormAmplification: "FedHist's INA rescales the step to a norm computed from the unclipped, un-noised updates; "
    "use FedHist(ina=False), or mode='local'",
}

#: Stream id of the aggregate noise in :func:`~lit_asyncfl.core.update.derive_seed`.
NOISE_STREAM = 0xD9_0001


def step_coefficients(aggregator: Aggregator, buffered: list[tuple[ClientUpdate, float]]) -> list[float]:
    r"""The factor :math:`c_i` by which each buffered update's delta :math:`\Delta_i` enters the aggregator's step.

    The step of the supported aggregators is linear in the deltas: :math:`\eta_g p_i / K` for
    :class:`DeltaAverage` (:math:`\eta_g p_i / \sum_j p_j` with ``normalize``), :math:`\min(1, \alpha p_i)` for
    :class:`Mixing`, :math:`p_i / \sum_j p_j` for :class:`ModelAverage`. Other aggregators raise ``ValueError``.

    Example:
        >>> step_coefficients(DeltaAverage(buffer_size=2, server_lr=2.0), [(None, 1.0), (None, 0.5)])  # eta p_i / K
        [1.0, 0.5]
    """
    weights = [w for _, w in buffered]
    kind = type(aggregator)
    if kind is DeltaAverage:
        total = sum(weights) if aggregator.normalize else len(weights)
        return [aggregator.server_lr * w / total if total > 0 else 0.0 for w in weights]
    if kind is Mixing:
        return [min(1.0, aggregator.alpha * w) for w in weights]
    if kind is ModelAverage:
        total = sum(weights)
        return [w / total if total > 0 else 0.0 for w in weights]
    raise ValueError(
        f"central DP calibrates its noise to aggregators whose step is linear in the client deltas "
        f"(DeltaAverage, Mixing, ModelAverage); got {kind.__name__}"
    )


def _overrides(callback: ServerCallback, hook: str) -> bool:
    return getattr(type(callback), hook) is not getattr(ServerCallback, hook)


class DeltaClipping(ServerCallback):
    r"""Clip every accepted client delta to L2 norm :math:`C` (DP-FedAvg's per-user clipping):
    :math:`w_i \leftarrow w_{o_i} + \Delta_i \min(1, C / \lVert \Delta_i \rVert_2)`.

    It must be the last server callback that transforms updates, so that what is aggregated is the clipped delta
    (:class:`GaussianAggregateNoise` checks this at fit start). The norm covers the whole upload (parameters and
    floating buffers); in the simulation the server clips, which equals the client clipping before upload.

    Args:
        clip_norm: The clipping bound :math:`C > 0`.

    Example:
        >>> DeltaClipping(clip_norm=1.0).clip_norm
        1.0
    """

    def __init__(self, clip_norm: float) -> None:
        check_number("clip_norm", clip_norm, 0, open_min=True)
        self.clip_norm = float(clip_norm)
        self.seen = self.clipped = 0

    def on_fit_start(self, server: Server) -> None:
        self.seen = self.clipped = 0

    def transform_update(self, server: Server, update: ClientUpdate) -> ClientUpdate:
        delta, norm = clip_delta(update.weights - update.base_weights, self.clip_norm)
        update.info["dp_delta_norm"] = norm
        self.seen += 1
        if norm > self.clip_norm:
            self.clipped += 1
            update.weights = update.base_weights + delta
        return update

    def metrics(self, server: Server) -> dict[str, Any]:
        return {"dp_clipped_fraction": self.clipped / self.seen if self.seen else 0.0}

    def state_dict(self) -> dict[str, Any]:
        return {"seen": self.seen, "clipped": self.clipped}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seen, self.clipped = int(state["seen"]), int(state["clipped"])


class GaussianAggregateNoise(ServerCallback):
    r"""Central DP: Gaussian noise on every server step, calibrated to one client's clipped delta, and the privacy
    spent (DP-FedAvg, McMahan et al., 2018; DP-FedBuff: FedBuff, Nguyen et al., 2022, and Papaya, Huba et al.,
    2022).

    With clipping bound :math:`C` (a :class:`DeltaClipping` among the callbacks) and noise multiplier :math:`z`, the
    sum of the :math:`K` clipped deltas of an aggregation has L2 sensitivity :math:`C` to adding or removing one
    client; DP-FedAvg adds :math:`\mathcal{N}(0, z^2 C^2)` to that sum. The server's step is
    :math:`\sum_i c_i \Delta_i` (:func:`step_coefficients`: :math:`\eta_g p_i / K` for FedBuff), so the same
    mechanism on the step is

    .. math:: s \leftarrow \sum_i c_i \Delta_i + \mathcal{N}\big(0, (z C \max_i c_i)^2 I\big)

    i.e. noise of standard deviation :math:`\eta_g z C / K` on FedBuff's average (:math:`z C / K` with
    :math:`\eta_g = p_i = 1`), :math:`\alpha_t z C` on FedAsync's mixing step. The noise is added to the
    parameters' step before any server optimizer (it must be the first callback that transforms steps: checked at
    fit start), which then only post-processes it: a later step callback must be one of ``POST_PROCESSING_STEPS``
    (:class:`AdaptiveServerOptimizer`: FedAvgM's momentum, FADAS); any other (FedDyn's correction, FedHist's INA),
    which reads the un-noised updates after the noise, is refused at fit start. The noise is drawn from a
    generator seeded by the run seed and the aggregation (version, updates received),
    never the global RNG, so runs and resumed runs are identical.

    **Accounting.** Each aggregation is one step of the subsampled Gaussian mechanism with noise multiplier
    :math:`z` and sample rate :math:`q = K / N` (updates in the aggregation over clients), composed with Opacus's
    RDP accountant (or its PRV accountant, Gopi et al., 2021, with ``accountant="prv"``); :attr:`epsilon` is the
    :math:`\varepsilon` at ``delta``. This is DP-FedBuff's accounting.
    Asynchronous arrivals are *not* Poisson sampling (who arrives depends on device speed and on the previous
    dispatches), so this :math:`\varepsilon` is the standard approximation, not a proof. The denominator of
    ``normalize=True`` and of :class:`ModelAverage` depends on who participated; the sensitivity is taken with the
    aggregation's weights as given, as in the fixed-denominator analysis. :class:`Mixing`'s step also carries
    :math:`\alpha_t (w_{o_i} - w_t)`, which exists only when client :math:`i` takes part: the noise
    :math:`\alpha_t z C` assumes participation public (replace-one neighbours); under add/remove the sensitivity is
    :math:`\alpha_t (C + \lVert w_{o_i} - w_t \rVert)` (``docs/privacy.md``). The weights :math:`p_i` are taken as
    public: a weight callback other than those of ``PUBLIC_WEIGHTS`` (staleness, data size), e.g. similarity or
    history weights, which read the updates, draws a warning at fit start: the noise scale then depends on private
    data.

    Args:
        noise_multiplier: :math:`z \ge 0` (``0``: clipping only, :math:`\varepsilon = \infty`).
        delta: The :math:`\delta \in (0, 1)` at which :math:`\varepsilon` is reported.
        max_epsilon: Budget: once one more aggregation of ``buffer_size`` updates would spend more, the arriving
            update is rejected (``reject_reasons["privacy_budget"]``) and the run ends after that event
            (``stop_reason="privacy_budget"``: no later aggregation could fit); ``None``: no budget. Needs a
            ``buffer_size``.
        accountant: ``"rdp"`` (Opacus's ``RDPAccountant``) or ``"prv"`` (its ``PRVAccountant``: tighter, slower;
            ``delta`` in ``PRV_DELTA_RANGE``; see :func:`~lit_asyncfl.functional.privacy.prv_epsilon`).

    Example:
        >>> noise = GaussianAggregateNoise(noise_multiplier=1.0, delta=1e-5)
        >>> noise.noise_multiplier, noise.epsilon
        (1.0, 0.0)
    """

    def __init__(
        self, noise_multiplier: float, delta: float = 1e-5, max_epsilon: float | None = None, accountant: str = "rdp"
    ) -> None:
        check_number("noise_multiplier", noise_multiplier, 0)
        check_number("delta", delta, 0, 1, open_min=True, open_max=True)
        check_accountant(accountant, delta)
        self.accountant = accountant
        if noise_multiplier > 0:
            require_opacus("GaussianAggregateNoise")
        if max_epsilon is not None:
            check_number("max_epsilon", max_epsilon, 0, open_min=True)
            check(noise_multiplier > 0, f"max_epsilon={max_epsilon} needs noise_multiplier > 0 (z=0 spends inf)")
        self.noise_multiplier, self.delta, self.max_epsilon = float(noise_multiplier), float(delta), max_epsilon
        self._clip_norm = math.nan
        #: Aggregations per sample rate ``q`` (the accountant's history).
        self.steps: dict[float, int] = {}
        self._cache: dict[tuple[Any, ...], float] = {}

    def on_fit_start(self, server: Server) -> None:
        clipping = [cb for cb in server.callbacks if isinstance(cb, DeltaClipping)]
        check(
            len(clipping) == 1,
            "GaussianAggregateNoise needs exactly one DeltaClipping among the server callbacks (noise without "
            f"clipping has no sensitivity to calibrate to); found {len(clipping)}",
        )
        transforms = [cb for cb in server.callbacks if _overrides(cb, "transform_update")]
        check(
            transforms[-1] is clipping[0],
            "DeltaClipping must be the last server callback that transforms updates, so the aggregated deltas are "
            f"clipped; {type(transforms[-1]).__name__} comes after it",
        )
        steppers = [cb for cb in server.callbacks if _overrides(cb, "transform_aggregate")]
        check(
            steppers[0] is self,
            "GaussianAggregateNoise must be the first server callback that transforms the step (noise before any "
            f"server optimizer); {type(steppers[0]).__name__} comes before it",
        )
        for cb in steppers[1:]:
            check(
                isinstance(cb, POST_PROCESSING_STEPS),
                f"{type(cb).__name__} transforms the step after the noise and may read the updates, which the noise "
                f"does not cover; only pure post-processing of the noised step is allowed after it "
                f"({', '.join(c.__name__ for c in POST_PROCESSING_STEPS)} and subclasses, e.g. ServerMomentum). "
                + next(
                    (hint for kind, hint in _STEP_ALTERNATIVES.items() if isinstance(cb, kind)),
                    "Use mode='local', where the server sees only noised updates",
                ),
            )
        check(
            server.param_numel == server.weights.numel(),
            "central DP noises the parameters' step, but this model has floating buffers (BatchNorm running "
            "statistics) that the server averages without noise; use GroupNorm or no normalization "
            "(e.g. norm='group')",
        )
        step_coefficients(server.aggregator, [])  # refuses an aggregator it cannot calibrate to
        private = [
            type(cb).__name__
            for cb in server.callbacks
            if _overrides(cb, "weight_update") and not isinstance(cb, PUBLIC_WEIGHTS)
        ]
        gates = [
            type(cb).__name__
            for cb in server.callbacks
            if _overrides(cb, "reject_update") and not isinstance(cb, (StalenessBound, GaussianAggregateNoise))
        ]
        if gates:
            warnings.warn(
                f"{', '.join(gates)} may accept or reject updates by their content (e.g. their unclipped norm): "
                "which updates are aggregated then depends on private data, which the epsilon reported does not "
                "account for (public rejections: StalenessBound, the privacy budget)",
                UserWarning,
                stacklevel=2,
            )
        if private:
            warnings.warn(
                f"{', '.join(private)} may compute aggregation weights from the updates' content: the noise is "
                "calibrated to the weights of each aggregation, so it then depends on private data, which the "
                f"epsilon reported does not account for (public weights: {[c.__name__ for c in PUBLIC_WEIGHTS]})",
                UserWarning,
                stacklevel=2,
            )
        check(
            self.max_epsilon is None or server.aggregator.buffer_size is not None,
            "max_epsilon needs an aggregator with a buffer_size (the size of the next aggregation)",
        )
        self._clip_norm = clipping[0].clip_norm
        self.steps, self._cache = {}, {}
        self.stop_reason = None

    def sample_rate(self, server: Server, count: int) -> float:
        """The accountant's :math:`q` of an aggregation of ``count`` updates: ``count / num_clients`` (at most 1)."""
        return min(1.0, count / server.num_clients)

    def epsilon_after(self, extra: dict[float, int] | None = None) -> float:
        """The :math:`\\varepsilon` at :attr:`delta` after the recorded aggregations (and ``extra`` ones)."""
        if self.noise_multiplier == 0:
            return math.inf if (self.steps or extra) else 0.0
        steps = dict(self.steps)
        for q, n in (extra or {}).items():
            steps[q] = steps.get(q, 0) + n
        key = tuple(sorted(steps.items()))
        if key not in self._cache:
            history = [(self.noise_multiplier, q, n) for q, n in steps.items()]
            self._cache[key] = epsilon_spent(history, self.delta, self.accountant)
        return self._cache[key]

    @property
    def epsilon(self) -> float:
        """The privacy spent so far: :math:`\\varepsilon` at :attr:`delta`."""
        return self.epsilon_after()

    def reject_update(self, server: Server, update: ClientUpdate) -> str | None:
        if self.max_epsilon is None:
            return None
        q = self.sample_rate(server, server.aggregator.buffer_size)
        if self.epsilon_after({q: 1}) <= self.max_epsilon:
            return None
        self.stop_reason = "privacy_budget"  # no later aggregation can fit either: the run ends after this event
        return "privacy_budget"

    def transform_aggregate(self, server: Server, step: Tensor, updates: list[ClientUpdate]) -> Tensor:
        if self.noise_multiplier == 0:
            return step
        sensitivity = self._clip_norm * max(step_coefficients(server.aggregator, server.aggregator.buffer))
        seed = derive_seed(server.seed, NOISE_STREAM, server.version, server.stats.received)
        return step + gaussian_noise(step, self.noise_multiplier * sensitivity, seed)

    def on_aggregated(self, server: Server, updates: list[ClientUpdate]) -> None:
        q = self.sample_rate(server, len(updates))
        self.steps[q] = self.steps.get(q, 0) + 1

    def metrics(self, server: Server) -> dict[str, Any]:
        return {"dp_epsilon": self.epsilon, "dp_delta": self.delta, "dp_steps": sum(self.steps.values())}

    def state_dict(self) -> dict[str, Any]:
        return {"steps": [[q, n] for q, n in self.steps.items()]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps = {float(q): int(n) for q, n in state["steps"]}
