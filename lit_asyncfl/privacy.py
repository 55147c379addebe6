"""Client-level differential privacy for any algorithm: :class:`DifferentiallyPrivate` wraps a preset."""

from __future__ import annotations

import warnings

from lit_asyncfl.algorithms.base import Algorithm
from lit_asyncfl.checks import check, check_choice
from lit_asyncfl.client_callbacks.privacy import LocalGaussianNoise
from lit_asyncfl.schedulers.selection import Selection
from lit_asyncfl.server.privacy import DeltaClipping, GaussianAggregateNoise

__all__ = ["DifferentiallyPrivate"]


class DifferentiallyPrivate(Algorithm):
    r"""An algorithm made client-level differentially private (DP-FedAvg / DP-FedBuff), with central or local DP.

    ``mode="central"`` (the server is trusted) adds to ``algorithm`` a
    :class:`~lit_asyncfl.server.privacy.DeltaClipping` (clip every delta to ``clip_norm``, last among the update
    transforms) and a :class:`~lit_asyncfl.server.privacy.GaussianAggregateNoise`
    (noise of standard deviation :math:`z C \max_i c_i` on every server step, first among the step transforms, with
    the RDP accountant). Its scheduler, aggregator and other callbacks are ``algorithm``'s own. The privacy spent
    appears as ``dp_epsilon`` (at ``dp_delta``) in every evaluation row, the loggers and the summary.
    ``mode="local"`` (no trusted server) instead adds a
    :class:`~lit_asyncfl.client_callbacks.privacy.LocalGaussianNoise`, last among the client callbacks: each client
    clips its delta and adds :math:`\mathcal{N}(0, z^2 C^2 I)` itself; ``dp_local_epsilon`` is reported. See
    ``docs/privacy.md`` for the formulas and the sampling model. A device selection that reads the reported
    training loss (ASFL's ``UtilitySelection``, Oort's) draws a warning: that loss is not noised.

    Args:
        algorithm: The algorithm to make private (e.g. ``FedBuff()``); its parts are taken over, not copied.
        clip_norm: The clipping bound :math:`C > 0` on each client's delta (L2).
        noise_multiplier: :math:`z \ge 0`; ``0`` clips only (:math:`\varepsilon = \infty`).
        delta: :math:`\delta \in (0, 1)` at which :math:`\varepsilon` is reported.
        max_epsilon: Optional budget :math:`> 0`. Central mode: updates are rejected once one more aggregation
            would spend more. Local mode: per client; a client whose next upload would spend more is no longer
            dispatched, and the run ends (``stop_reason="privacy_budget"``) once no client may upload.
        mode: ``"central"`` (noise on the server's step) or ``"local"`` (noise on each upload, by the client).
        accountant: ``"rdp"`` (Opacus's ``RDPAccountant``, Mironov et al.) or ``"prv"`` (its ``PRVAccountant``,
            Gopi, Lee and Wutschitz, 2021: tighter, slower; ``delta`` in ``[1e-10, 0.01]``).

    Example:
        >>> from lit_asyncfl.algorithms import FedBuff
        >>> algo = DifferentiallyPrivate(FedBuff(buffer_size=10), clip_norm=1.0, noise_multiplier=1.0)
        >>> algo.name, [type(cb).__name__ for cb in algo.server_callbacks]
        ('DP-FedBuff', ['GaussianAggregateNoise', 'StalenessWeight', 'DeltaClipping'])
    """

    def __init__(
        self,
        algorithm: Algorithm,
        clip_norm: float,
        noise_multiplier: float,
        delta: float = 1e-5,
        max_epsilon: float | None = None,
        mode: str = "central",
        accountant: str = "rdp",
    ) -> None:
        check(isinstance(algorithm, Algorithm), f"algorithm must be an Algorithm, got {type(algorithm).__name__}")
        check(not isinstance(algorithm, DifferentiallyPrivate), "algorithm is already DifferentiallyPrivate")
        check_choice("mode", mode, ("central", "local"))
        selection = getattr(algorithm.scheduler, "selection", None)
        if isinstance(selection, Selection) and type(selection).observe is not Selection.observe:
            warnings.warn(
                f"{type(selection).__name__} selects devices from their reported training loss, which is not noised "
                "(in either mode): the selection then depends on private data that the epsilon reported does not "
                "account for (loss-free selections: RandomSelection, DeadlineSelection)",
                UserWarning,
                stacklevel=2,
            )
        server_callbacks, client_callbacks = list(algorithm.server_callbacks), list(algorithm.client_callbacks)
        accounting = {"delta": delta, "max_epsilon": max_epsilon, "accountant": accountant}
        if mode == "central":
            noise = GaussianAggregateNoise(noise_multiplier, **accounting)
            server_callbacks = [noise, *server_callbacks, DeltaClipping(clip_norm)]
        else:
            client_callbacks.append(LocalGaussianNoise(clip_norm, noise_multiplier, **accounting))
        hparams = {
            "algorithm": algorithm,
            "clip_norm": clip_norm,
            "noise_multiplier": noise_multiplier,
            "delta": delta,
            "max_epsilon": max_epsilon,
            "mode": mode,
            "accountant": accountant,
        }
        super().__init__(
            scheduler=algorithm.scheduler,
            aggregator=algorithm.aggregator,
            server_callbacks=server_callbacks,
            client_callbacks=client_callbacks,
            name=f"{'DP' if mode == 'central' else 'LDP'}-{algorithm.name}",
            hparams=hparams,
        )
        #: The wrapped algorithm.
        self.algorithm = algorithm
