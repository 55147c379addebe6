"""FedADT: asynchronous FL with knowledge-distillation correction of stale updates."""

from __future__ import annotations

from lit_asyncfl.algorithms.base import Algorithm, hyperparameters
from lit_asyncfl.checks import check_fraction, check_int, check_number
from lit_asyncfl.client_callbacks.base import LR_DECAY, LearningRateDecay
from lit_asyncfl.schedulers.keep_concurrency import KeepConcurrency
from lit_asyncfl.server.aggregators import Mixing, StalenessWeight
from lit_asyncfl.server.distillation import (
    BATCH_SIZE,
    DATA_FRACTION,
    PASSES,
    RAMP_VERSIONS,
    STALENESS_THRESHOLD,
    TEMPERATURE,
    TIME_PER_SAMPLE,
    WEIGHT_MAX,
    WEIGHT_MIN,
    DistillationCorrection,
)

#: 20% of the clients training: the paper's concurrency rate P (Tables I-II), also its buffered baselines' setting
#: (FedBuff, CA2FL, FedFa take it from here); not KeepConcurrency's default, FedAsync's 10%.
CONCURRENCY = 0.2


class FedADT(Algorithm):
    r"""FedADT (Alg. 2): stale uploads are corrected by distillation toward the global model, then mixed in.

    A fixed share of clients trains at all times (``concurrency``, 20% in the paper). On arrival,
    :math:`\tau = t_g - t_i`; if :math:`\tau >` ``staleness_threshold`` the upload is distilled
    (:class:`~lit_asyncfl.server.distillation.DistillationCorrection`), then
    :math:`w_g \leftarrow (1 - \beta) w_g + \beta w_i` with :math:`\beta = 1/\sqrt{\tau + 1}`. Clients' learning rate
    decays by ``lr_decay`` per global version. Use ``UniformResponse(0, 5000)`` devices for the paper's response
    times.

    Two settings decide comparisons with this method (measured on the ``bench_algorithms.py --suite pathological``
    setting, seed 100, 6,000 virtual s: 200 clients of 1-2 classes, five local epochs, 10% stragglers):

    * **Concurrency.** The default keeps 20% of the clients training (the paper's), FedAsync's default 10%. At 20%
      FedADT reached 0.8 accuracy after 3,699 virtual s and FedAsync after 3,604 s; at 10% after 3,955 s and
      4,909 s. Against a FedAsync at 10%, FedADT at 20% looks 25% faster with twice the client work (4,402
      updates against 1,904); the benchmark suites therefore give every method the same concurrency.
    * **Distillation set.** ``data_fraction`` is the paper's 0.5% — 300 images of MNIST, but 7 images of the
      1,437 digits, fewer than one per class. With 5% (72 images) FedADT reached 0.8 after 2,323 virtual s
      instead of 3,955 s (final 0.906 against 0.869), so the digits suites pass ``data_fraction=0.05``; keep the
      set at a few dozen images per class on small datasets.

    **Where the paper's claims reproduce here** (the benchmark tables, three seeds, equal concurrency, 5% for
    distillation). The paper reports FedADT ahead of FedAvg, FedAvgM, FedAsync, FedFa, FedBuff and CA2FL in accuracy
    and convergence. On the FedADT digits suite it beats FedAsync (+0.04 to +0.05 final accuracy), FedBuff (+0.01)
    and FedFa on every seed at both Dirichlet 0.1 and 0.5, and reaches 0.8 before CA2FL on every seed, but CA2FL
    ends 0.016-0.017 higher on every seed, synchronous FedAvgM (20% per round) ends 0.04 higher at Dirichlet 0.1
    (level at 0.5) and reaches 0.8 first on two seeds of three, and FADAS (newer than the paper) is ahead on both.
    On the pathological suite it beats FedAsync (+0.11) and FedBuff (+0.04) on every seed, reaches 0.8 before CA2FL
    and FADAS on every seed, ends level with FADAS and 0.017 below CA2FL. The speed claim holds against every
    asynchronous baseline of the paper; the accuracy claim holds against FedAsync, FedFa and FedBuff, not CA2FL.

    Args:
        concurrency: Clients training at once (count, or fraction of all clients).
        staleness_threshold, temperature, weight_min, weight_max: The server's distillation
            (:class:`~lit_asyncfl.server.DistillationCorrection`'s arguments, see there).
        ramp_versions, fixed_weight, passes, data_fraction: The same distillation's other arguments (see
            :class:`~lit_asyncfl.server.DistillationCorrection`).
        distill_batch_size: The distillation's ``batch_size``.
        server_time_per_sample: The distillation's ``time_per_sample`` (the cost model).
        lr_decay: Clients' learning-rate decay per global version.

    Example:
        >>> algo = FedADT()
        >>> [type(cb).__name__ for cb in algo.server_callbacks], algo.aggregator.alpha
        (['DistillationCorrection', 'StalenessWeight'], 1.0)
    """

    def __init__(
        self,
        concurrency: int | float = CONCURRENCY,
        staleness_threshold: int = STALENESS_THRESHOLD,
        temperature: float = TEMPERATURE,
        weight_min: float = WEIGHT_MIN,
        weight_max: float = WEIGHT_MAX,
        ramp_versions: int = RAMP_VERSIONS,
        fixed_weight: float | None = None,
        passes: int = PASSES,
        data_fraction: float = DATA_FRACTION,
        distill_batch_size: int = BATCH_SIZE,
        server_time_per_sample: float = TIME_PER_SAMPLE,
        lr_decay: float = LR_DECAY,
    ) -> None:
        hparams = hyperparameters(locals())
        check_int("distill_batch_size", distill_batch_size, 1)
        check_number("server_time_per_sample", server_time_per_sample, 0)
        check_fraction("lr_decay", lr_decay, open_min=True)
        distillation = DistillationCorrection(
            staleness_threshold=staleness_threshold,
            temperature=temperature,
            weight_min=weight_min,
            weight_max=weight_max,
            ramp_versions=ramp_versions,
            fixed_weight=fixed_weight,
            passes=passes,
            data_fraction=data_fraction,
            batch_size=distill_batch_size,
            time_per_sample=server_time_per_sample,
        )
        super().__init__(
            scheduler=KeepConcurrency(concurrency),
            aggregator=Mixing(alpha=1.0),
            server_callbacks=[distillation, StalenessWeight("polynomial", a=0.5)],  # beta = (tau + 1)^-1/2
            client_callbacks=[LearningRateDecay(lr_decay)],
            hparams=hparams,
        )
