"""Local client-level differential privacy: each client clips and noises its own delta before upload."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import numpy as np

from lit_asyncfl.checks import check, check_number
from lit_asyncfl.client_callbacks.base import ClientCallback
from lit_asyncfl.core.update import derive_seed
from lit_asyncfl.functional.privacy import (
    RDP_FALLBACK,
    check_accountant,
    clip_delta,
    epsilon_spent,
    gaussian_noise,
    require_opacus,
    uploads_within,
)

if TYPE_CHECKING:
    from lit_asyncfl.core.update import ClientJob, ClientUpdate
    from lit_asyncfl.engines.fast import FastEngine

#: Stream id of the local noise in :func:`~lit_asyncfl.core.update.derive_seed`.
LOCAL_NOISE_STREAM = 0xD9_0002


class LocalGaussianNoise(ClientCallback):
    r"""Local DP: the client uploads :math:`w_{o} + \bar\Delta + \mathcal{N}(0, z^2 C^2 I)`, its delta clipped to
    L2 norm :math:`C` (:math:`\bar\Delta = \Delta \min(1, C / \lVert\Delta\rVert_2)`) plus Gaussian noise it draws
    itself, so that not even the server sees an un-noised update (the local variant of DP-FedAvg's mechanism). The
    norm before clipping stays on the client. What else the client reports (its ``train_loss``, ``num_samples``) is
    not noised: a loss-based selection reading it draws a warning from
    :class:`~lit_asyncfl.privacy.DifferentiallyPrivate`.

    **Accounting.** Any two data sets of one client give clipped deltas at most :math:`2C` apart, so each upload is
    a Gaussian mechanism of noise multiplier :math:`z / 2` relative to its sensitivity, without subsampling
    amplification (the client knows it took part). A client's :math:`\varepsilon` at ``delta`` composes its uploads
    with Opacus's RDP accountant (or its PRV accountant, ``accountant="prv"``); ``dp_local_epsilon`` (rows, loggers,
    summary) is that of the client that uploaded most (``dp_max_uploads``). A job is counted when its training ends,
    even if its update is later lost on the way: the count can only overstate what was released.

    **Budget.** With ``max_epsilon``, each client may upload at most :attr:`max_uploads` times, the largest
    :math:`n` whose :math:`\varepsilon(n) \le` ``max_epsilon`` (computed at construction; refused when even one
    upload exceeds it). A client that has used them is retired (:attr:`retired`): the simulator treats it as offline
    for good, so no scheduler dispatches it again (it never trains, so it releases nothing more). The run ends with
    ``stop_reason="privacy_budget"`` once every client is retired and no job is left (``dp_retired_clients``
    counts them in the rows).

    The noise of a job is drawn from a generator seeded by the job's seed (the run seed, the client and the job id),
    never the global RNG. Put it last among the client callbacks, so that nothing changes the update after it.

    Args:
        clip_norm: The clipping bound :math:`C > 0`.
        noise_multiplier: :math:`z \ge 0` (``0``: clipping only, :math:`\varepsilon = \infty`).
        delta: The :math:`\delta \in (0, 1)` at which :math:`\varepsilon` is reported.
        max_epsilon: Optional per-client budget :math:`> 0` (needs ``noise_multiplier > 0``); ``None``: no budget.
        accountant: ``"rdp"`` (Opacus's ``RDPAccountant``) or ``"prv"`` (its ``PRVAccountant``; ``delta`` in
            ``PRV_DELTA_RANGE``).

    Example:
        >>> LocalGaussianNoise(clip_norm=1.0, noise_multiplier=2.0).uploads
        {}
        >>> LocalGaussianNoise(clip_norm=1.0, noise_multiplier=2.0, max_epsilon=8.0).max_uploads  # doctest: +SKIP
        2
    """

    carries_state = True  # the accountant's upload counts: a job carries its client's
    client_state_attributes = ("uploads",)

    retire_reason = "privacy_budget"

    def __init__(
        self,
        clip_norm: float,
        noise_multiplier: float,
        delta: float = 1e-5,
        max_epsilon: float | None = None,
        accountant: str = "rdp",
    ) -> None:
        check_number("clip_norm", clip_norm, 0, open_min=True)
        check_number("noise_multiplier", noise_multiplier, 0)
        check_number("delta", delta, 0, 1, open_min=True, open_max=True)
        check_accountant(accountant, delta)
        if noise_multiplier > 0:
            require_opacus("LocalGaussianNoise")
        self.clip_norm, self.noise_multiplier, self.delta = float(clip_norm), float(noise_multiplier), float(delta)
        self.accountant, self.max_epsilon = accountant, max_epsilon
        #: Uploads allowed per client by the budget (``None``: no budget).
        self.max_uploads: int | None = None
        if max_epsilon is not None:
            check_number("max_epsilon", max_epsilon, 0, open_min=True)
            check(noise_multiplier > 0, f"max_epsilon={max_epsilon} needs noise_multiplier > 0 (z=0 spends inf)")
            self.max_uploads = uploads_within(self.noise_multiplier / 2, 1.0, self.delta, max_epsilon, accountant)
            check(
                self.max_uploads >= 1,
                f"max_epsilon={max_epsilon} allows no upload: one upload already spends epsilon = "
                f"{epsilon_spent([(self.noise_multiplier / 2, 1.0, 1)], self.delta, accountant):.4g}; "
                "allowed: a larger max_epsilon or noise_multiplier",
            )
            self.retires_clients = True
        #: Uploads per client (the accountant's history).
        self.uploads: dict[int, int] = {}
        self._epsilons: dict[int, float] = {}  # uploads -> epsilon (a function of the settings above and the count)
        self._fallback_said = False

    def check_module(self, module: Any) -> None:
        """Refuse a module with floating buffers (BatchNorm running statistics): they would be clipped and noised
        with the parameters (a noised ``running_var`` goes negative: NaN), as the central mode refuses them."""
        floating = [name for name, buffer in module.named_buffers() if buffer.is_floating_point()]
        if floating:
            raise ValueError(
                f"local DP clips and noises the whole upload, but {type(module).__name__} has floating buffers "
                f"({', '.join(floating[:3])}{', ...' if len(floating) > 3 else ''}: BatchNorm running statistics) "
                "that noise would corrupt (a negative running_var gives NaN); use GroupNorm or no normalization "
                "(e.g. norm='group')"
            )

    def on_fit_start(self, num_clients: int) -> None:
        self.uploads = {}
        if self.max_uploads is not None:
            self.retired = np.zeros(num_clients, dtype=bool)

    def _retire(self, client: int) -> None:
        if self.retired is not None and self.max_uploads is not None:
            self.retired[client] = self.uploads.get(client, 0) >= self.max_uploads

    def on_train_end(self, trainer: FastEngine, job: ClientJob, update: ClientUpdate) -> None:
        delta, _ = clip_delta(update.weights - update.base_weights, self.clip_norm)  # the norm is not uploaded
        noise_std = self.noise_multiplier * self.clip_norm
        if noise_std > 0:
            delta = delta + gaussian_noise(delta, noise_std, derive_seed(job.seed, LOCAL_NOISE_STREAM))
        update.weights = update.base_weights + delta
        self.uploads[job.client] = self.uploads.get(job.client, 0) + 1
        self._retire(job.client)

    def commit_job_result(self, job: ClientJob, result: Any) -> None:
        super().commit_job_result(job, result)
        self._retire(job.client)

    @property
    def epsilon(self) -> float:
        """The :math:`\\varepsilon` at :attr:`delta` of the client that uploaded most."""
        return self.epsilon_after(max(self.uploads.values(), default=0))

    def epsilon_after(self, uploads: int) -> float:
        """The :math:`\\varepsilon` at :attr:`delta` of a client after ``uploads`` uploads: computed once per count
        (every evaluation row reads it), and the PRV accountant's fall back to the RDP bound said once per callback.

        Example:
            >>> LocalGaussianNoise(clip_norm=1.0, noise_multiplier=0.0).epsilon_after(3)
            inf
        """
        if uploads == 0:
            return 0.0
        if self.noise_multiplier == 0:
            return float("inf")
        if uploads not in self._epsilons:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                self._epsilons[uploads] = epsilon_spent(
                    [(self.noise_multiplier / 2, 1.0, uploads)], self.delta, self.accountant
                )
            for warning in caught:
                fallback = issubclass(warning.category, RuntimeWarning) and RDP_FALLBACK in str(warning.message)
                if fallback and self._fallback_said:
                    continue
                self._fallback_said |= fallback
                warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
        return self._epsilons[uploads]

    def metrics(self) -> dict[str, Any]:
        """``dp_local_epsilon``, ``dp_delta`` and ``dp_max_uploads`` for the rows, loggers and summary."""
        metrics = {
            "dp_local_epsilon": self.epsilon,
            "dp_delta": self.delta,
            "dp_max_uploads": max(self.uploads.values(), default=0),
        }
        if self.retired is not None:
            metrics["dp_retired_clients"] = int(self.retired.sum())
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {"uploads": [[c, n] for c, n in self.uploads.items()]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.uploads = {int(c): int(n) for c, n in state["uploads"]}
        if self.retired is not None:
            for client in range(len(self.retired)):
                self._retire(client)
