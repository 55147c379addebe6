"""WKAFL (Zhou et al., IEEE TPDS 2022): two-stage weighted K-asynchronous FL with an adaptive learning rate."""

from __future__ import annotations

from lit_asyncfl.algorithms.base import Algorithm, hyperparameters
from lit_asyncfl.schedulers.k_async import KAsync
from lit_asyncfl.server.two_stage import (
    BUFFER_SIZE,
    CLIP_IN_PLACE,
    FIRST_CLIP,
    MOMENTUM,
    SECOND_CLIP,
    SERVER_LR,
    THRESHOLD,
    TwoStageWeightedStep,
)


class WKAFL(Algorithm):
    r"""K-asynchronous FL that weights stale gradients by staleness, then by their consistency with the estimated
    global direction, with norm clipping and a staleness-adaptive rate (Zhou et al., 2022).

    .. math::
        g_i = \mathrm{clip}\big(-\Delta_i + \beta G_{t-1},\, C_1\big), \qquad
        \tilde G = \sum_i \frac{(e/2)^{-\tau_i}}{\sum_j (e/2)^{-\tau_j}}\, \mathrm{clip}(g_i, C_1 \|g_f\|),

    .. math::
        G_t = \sum_{i:\ \cos(g_i, \tilde G) > \theta} \hat w_i\, \mathrm{clip}(g_i, B \|\tilde G\|), \quad
        \hat w_i \propto e^{10 \cos(g_i, \tilde G)} (e/2)^{-\tau_i}, \qquad
        w_{t+1} = w_t - \frac{\eta}{1 + 0.1\, \tau_{min}}\, G_t

    over the :math:`K` updates of each aggregation; all clients train and the :math:`K` aggregated restart from the
    new model (:class:`~lit_asyncfl.schedulers.KAsync`, as FedHist, which compares with it);
    :class:`~lit_asyncfl.server.two_stage.TwoStageWeightedStep` computes the step
    (:func:`~lit_asyncfl.functional.wkafl.two_stage_aggregate`).

    Resolutions:

    * **Pseudo-gradients**: the authors' clients send one mini-batch gradient; here a client's pseudo-gradient is
      :math:`-\Delta_i = w_{o_i} - w_i` over its local epochs (as FedHist runs every baseline), so :math:`\eta = 1`
      steps by the weighted mean change (the authors' :math:`\eta = 0.005` is an SGD rate on raw gradients).
    * **Staleness** :math:`\tau_i = t - o_i + 1`: the authors' counter, 1 for a gradient of the current model; it
      sets the rate :math:`\eta / (1.1 + 0.1 (t - o_{fresh}))` (the weights are normalized, so the offset cancels).
    * **Momentum** :math:`\beta G_{t-1}` is added on the server (the authors' simulated clients add the latest
      aggregate, which the server holds), to every buffered gradient before clipping.
    * **Clipping**: each :math:`g_i` to norm :math:`C_1` and, in stage one, to :math:`C_1 \|g_f\|`
      (:math:`g_f` the freshest), as the authors' code (both with ``CB1``); stage two clips to
      :math:`B \|\tilde G\|` from the first aggregation on (the authors' code turns it on after 1000 iterations,
      with a bound computed from a zeroed tensor). Stage two reads the gradients as stage one clipped them: the
      authors' ``TensorClip`` rewrites the buffered gradients in place, so their stage two sums
      :math:`\mathrm{clip}(g_i, C_1 \|g_f\|)` (``clip_in_place=False``: the gradients as they came, as the
      formulas above read).
    * **No consistent gradient**: the stage-one estimate :math:`\tilde G` is applied (as the authors' code).
    * **Defaults** from the authors' MNIST script: :math:`K = 10`, :math:`C_1 = 100`, :math:`B = 10`,
      :math:`\theta = 0.3`, :math:`\beta = 0.1`, the factor 10 of the consistency weights, the rate decay 0.1.

    Sources: the authors' code (github.com/zzh816/WKAFL-code, ``EMNIST-MNIST/MNIST_WKAFL.py``) and the paper's
    abstract (the full text was not available offline).

    Memory: the :math:`K` buffered updates and one model-sized :math:`G_{t-1}`.

    Args:
        k: Updates per aggregation :math:`K` (the aggregation's ``buffer_size``).
        server_lr, momentum, first_clip, second_clip, threshold, clip_in_place: The aggregation's
            (:class:`~lit_asyncfl.server.TwoStageWeightedStep`'s arguments, see there).

    Example:
        >>> algo = WKAFL(k=5)
        >>> algo.scheduler.k, algo.aggregator.buffer_size, algo.aggregator.threshold
        (5, 5, 0.3)
    """

    def __init__(
        self,
        k: int = BUFFER_SIZE,
        server_lr: float = SERVER_LR,
        momentum: float = MOMENTUM,
        first_clip: float = FIRST_CLIP,
        second_clip: float = SECOND_CLIP,
        threshold: float = THRESHOLD,
        clip_in_place: bool = CLIP_IN_PLACE,
    ) -> None:
        hparams = hyperparameters(locals())
        super().__init__(
            scheduler=KAsync(k),
            aggregator=TwoStageWeightedStep(
                k, server_lr, momentum, first_clip, second_clip, threshold, clip_in_place=clip_in_place
            ),
            hparams=hparams,
        )
