"""FADAS (Wang et al., ICML 2024): buffered asynchronous FL with a server AMSGrad step and a delay-adaptive rate."""

from __future__ import annotations

from lit_asyncfl.algorithms.base import Algorithm, hyperparameters
from lit_asyncfl.schedulers.keep_concurrency import KeepConcurrency
from lit_asyncfl.server.adaptive_optimizer import (
    BETA1,
    BETA2,
    BIAS_CORRECTION,
    EPS,
    SERVER_LR,
    AdaptiveServerOptimizer,
)
from lit_asyncfl.server.aggregators import DeltaAverage


class FADAS(Algorithm):
    r"""Federated adaptive asynchronous optimization (Wang et al., 2024), with its delay-adaptive rate.

    .. math::
        \Delta_t = \frac{1}{M} \sum_{i \in \mathcal{M}_t} \Delta^i_{t - \tau_i}, \quad
        m_t = \beta_1 m_{t-1} + (1 - \beta_1) \Delta_t, \quad
        v_t = \beta_2 v_{t-1} + (1 - \beta_2) \Delta_t^2, \quad
        \hat v_t = \max(\hat v_{t-1}, v_t),

    .. math::
        x_{t+1} = x_t + \eta_t \frac{m_t}{\sqrt{\hat v_t} + \epsilon}, \qquad
        \eta_t = \eta \text{ if } \tau^{max}_t \le \tau_c \text{ else } \eta / \tau^{max}_t

    :math:`\Delta^i = w_i - w_o` is a client's change, :math:`\mathcal{M}_t` the :math:`M` buffered arrivals and
    :math:`\tau^{max}_t` their largest staleness (``t - o``). Composition: a
    :class:`~lit_asyncfl.server.aggregators.DeltaAverage` (``server_lr=1``) gives :math:`\Delta_t`, an
    :class:`~lit_asyncfl.server.adaptive_optimizer.AdaptiveServerOptimizer` takes the AMSGrad step.

    Resolutions:

    * **Delay-adaptive rate** :math:`\eta/\tau^{max}_t`, as the authors' code (``g_delay_adaptive.py``) computes it;
      the paper prints :math:`\min\{\eta, 1/\tau^{max}_t\}`, which is the same for :math:`\eta = 1` and would never
      bite at the paper's :math:`\eta = 10^{-3}` (see :func:`~lit_asyncfl.functional.adaptive.delay_adaptive_lr`).
      ``delay_threshold=None`` gives FADAS without the delay adaptation.
    * **No bias correction** (the algorithm as printed; :math:`\hat v_0 = 0`); the authors' ``fedams`` code divides by
      :math:`1 - \beta^t` as Adam does: ``bias_correction=True``.
    * **Defaults** from the authors' code and commands: :math:`\beta_1 = 0.9`, :math:`\beta_2 = 0.99`,
      :math:`\epsilon = 10^{-8}`, :math:`\tau_c = 1`, :math:`M = 5`, half of the clients training (``frac=0.5``).
      The authors' command for delay-adaptive FADAS uses :math:`\eta = 10^{-3}` (ResNet on CIFAR-10); for the
      small models here the default is :math:`\eta = 0.01` (LeNet-5 on Dirichlet(0.5) digits, 100 clients, 20
      training, 12,000 virtual s: 97% accuracy against 87% with :math:`10^{-3}`; tune it with
      ``configs/sweeps/fadas_digits.yaml``).

    Sources: the authors' code (github.com/yujiaw98/FADAS: ``update.py``, ``g_delay_adaptive.py``, ``options.py``)
    and summaries of the paper's algorithm (the full text was not available offline).

    Memory: the buffer and three model-sized moment vectors.

    Args:
        buffer_size: Buffer size :math:`M` (the :class:`~lit_asyncfl.server.DeltaAverage`'s).
        server_lr, beta1, beta2, eps, delay_threshold, bias_correction: The server step's :math:`\eta`,
            :math:`\beta_1`, :math:`\beta_2`, :math:`\epsilon`, :math:`\tau_c` and bias corrections
            (:class:`~lit_asyncfl.server.AdaptiveServerOptimizer`'s arguments, see there).
        concurrency: Clients training at once (:class:`~lit_asyncfl.schedulers.KeepConcurrency`'s argument, see
            there).

    Example:
        >>> algo = FADAS()
        >>> algo.aggregator.buffer_size, algo.server_callbacks[0].delay_threshold
        (5, 1)
    """

    def __init__(
        self,
        buffer_size: int = 5,  # the authors' M = 5 (DeltaAverage's default is FedBuff's 10)
        server_lr: float = SERVER_LR,
        beta1: float = BETA1,
        beta2: float = BETA2,
        eps: float = EPS,
        delay_threshold: int | None = 1,  # the authors' tau_c = 1 (the optimizer's default: no delay adaptation)
        bias_correction: bool = BIAS_CORRECTION,
        concurrency: int | float = 0.5,  # the authors' frac = 0.5 (KeepConcurrency's default is FedAsync's 10%)
    ) -> None:
        hparams = hyperparameters(locals())
        optimizer = AdaptiveServerOptimizer(
            server_lr, beta1, beta2, eps, bias_correction=bias_correction, delay_threshold=delay_threshold
        )
        super().__init__(
            scheduler=KeepConcurrency(concurrency),
            aggregator=DeltaAverage(buffer_size=buffer_size, server_lr=1.0),
            server_callbacks=[optimizer],
            hparams=hparams,
        )
