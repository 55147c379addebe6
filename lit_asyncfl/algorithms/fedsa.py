"""FedSA (Chen, Mao & Ma, FGCS 2021), as re-implemented by a third-party Flower strategy: semi-asynchronous rounds of
the first M arrivals, a staleness bound, and local learning rates that shrink with participation."""

from __future__ import annotations

from lit_asyncfl.algorithms.base import Algorithm, hyperparameters
from lit_asyncfl.checks import check_choice, check_int
from lit_asyncfl.client_callbacks.staleness import FREQUENCY, ParticipationLearningRate
from lit_asyncfl.functional.fedsa import FREQUENCIES
from lit_asyncfl.schedulers.buffered_concurrency import BufferedConcurrency
from lit_asyncfl.server.aggregators import DataSizeWeight, ModelAverage
from lit_asyncfl.server.staleness_bound import StalenessBound


class FedSA(Algorithm):
    r"""FedSA (Chen, Mao & Ma, 2021), as re-implemented by a third-party Flower ``FedSAStrategy`` (not the authors).

    .. math:: w_{t+1} = \sum_{i \in \mathcal{M}_t} \frac{n_i}{\sum_{j \in \mathcal{M}_t} n_j} w_i, \qquad
        \eta_i = \frac{\eta}{N f_i}

    :math:`\mathcal{M}_t` are the first :math:`M` updates to arrive whose staleness is at most :math:`\tau_0` (staler
    ones are discarded), :math:`f_i` the client's participation: by default its share :math:`c_i / \sum_j c_j` of
    all completed jobs, floored at :math:`1/N` (see the resolutions). The aggregated clients restart from the new
    model; the others keep training. Composition:
    :class:`~lit_asyncfl.schedulers.BufferedConcurrency` (``concurrency=1.0``: every client trains, as K-async
    training), a :class:`~lit_asyncfl.server.ModelAverage` of :math:`M` with
    :class:`~lit_asyncfl.server.DataSizeWeight` and :class:`~lit_asyncfl.server.StalenessBound`, and the client
    callback :class:`~lit_asyncfl.client_callbacks.ParticipationLearningRate`.

    Resolutions (only one public source; what is taken and why):

    * **Staleness** is the usual :math:`t - o` (versions since the job's download). The Flower strategy counts
      rounds since the client was last aggregated, on synchronous Flower rounds, and never resets it for a skipped
      client (which is then skipped for ever); its bound :math:`\tau_0 = 3` is kept, as a discard of staler updates.
    * **Learning rate** :math:`\eta_i = \eta/(N f_i)` with :math:`f_i` the client's participation, in two readings
      (``frequency``), with :math:`c_i` the client's completed jobs and :math:`C = \sum_j c_j` all clients':
      ``"count"``: :math:`f_i = \max(1, c_i)`, a *count*, which reproduces the Flower strategy's code (its
      ``participation_count``; :math:`\eta` defaults to :math:`N` times the module's learning rate, so a client's
      first two jobs train at the configured rate and later ones at it divided by :math:`c_i`; the Flower default
      :math:`\eta = 1` with its 10 clients gives 0.1 for the first jobs). ``"share"`` (the default): :math:`f_i =
      \max(1/N, c_i/C)`, a *frequency* (the client's share of all updates), so :math:`\eta_i = \eta \min(1, \bar
      c/c_i)` with :math:`\bar c = C/N` and :math:`\eta` the module's learning rate: resolved here, a client with
      :math:`c_i = 0` (or any client while :math:`C = 0`) trains at :math:`\eta` (the uniform share :math:`1/N`),
      and the rate is capped at :math:`\eta` (without the cap a client with :math:`c_i = 1` when :math:`\bar c =
      40` would train at :math:`40\eta`); :math:`c_i, C` are those when the job is dispatched. Why "share" is the
      default: with the count, a client's rate falls as :math:`1/c_i` for ever (``lr/40`` after 40 jobs) and
      FedSA barely learns on the FedASMU benchmark (digits, Dirichlet 0.1, 10% of 100 clients, :math:`M = 3`:
      final accuracy 0.198 +- 0.100 over 3 seeds; 0.94 without any rate rule), whereas FedASMU's Table 1 ranks
      FedSA among the fastest baselines, so the paper's :math:`f_i` is most likely a frequency, which keeps the
      average rate near :math:`\eta`; the paper's text could not be checked. The Flower strategy counts
      aggregated updates; here completed jobs are counted (a client cannot see the server's discards), which
      differ only by updates discarded for staleness. ``base_lr`` sets :math:`\eta` itself in both readings.
    * **Semi-asynchronous rounds** with limited parallelism: a buffered client holds its place until the
      aggregation (so only aggregated or discarded clients restart), as K-async training does with every client.
    * **Defaults**: :math:`\tau_0 = 3` and :math:`M = 30\%` of the training clients (the Flower defaults
      :math:`M = 3`, :math:`\tau_0 = 3` with 10 clients): :math:`M = 30` of 100 clients all training; FedASMU's
      comparison runs 10% of the clients with :math:`M = 3`.

    Not implemented: the paper's two-stage strategy and its dynamic choice of :math:`M` on the server (the
    bibliographic summaries mention both; their rules could not be checked).

    Sources: a third-party Flower ``FedSAStrategy`` (``aggregate_fit``, ``configure_fit``) and summaries of the
    paper (FGCS 120, 2021, doi 10.1016/j.future.2021.02.012); the paper's text was not available offline.

    Memory: the buffer of :math:`M` models.

    Args:
        buffer_size: Arrivals per aggregation :math:`M`.
        max_staleness: Staleness bound :math:`\tau_0`.
        concurrency: Clients selected at once (count, or fraction of all clients), at least ``buffer_size``.
        base_lr, frequency: :math:`\eta` and the reading of the participation :math:`f_i` (``"share"`` or
            ``"count"``, the Flower code) (:class:`~lit_asyncfl.client_callbacks.ParticipationLearningRate`'s
            arguments, see there).

    Example:
        >>> algo = FedSA()
        >>> algo.aggregator.buffer_size, algo.server_callbacks[0].max_staleness, algo.scheduler.concurrency
        (30, 3, 1.0)
        >>> algo.client_callbacks[0].frequency, FedSA(frequency="count").client_callbacks[0].frequency
        ('share', 'count')
    """

    def __init__(
        self,
        buffer_size: int = 30,  # the Flower default M = 3 of 10 clients, as 30 of 100 (see above)
        max_staleness: int = 3,  # tau_0 = 3, the Flower default
        concurrency: int | float = 1.0,  # every client (BufferedConcurrency's default is PORT's 30%)
        base_lr: float | None = None,
        frequency: str = FREQUENCY,
    ) -> None:
        hparams = hyperparameters(locals())
        check_int("buffer_size", buffer_size, 1)
        check_choice("frequency", frequency, FREQUENCIES)
        super().__init__(
            scheduler=BufferedConcurrency(concurrency),
            aggregator=ModelAverage(buffer_size=buffer_size),
            server_callbacks=[StalenessBound(max_staleness), DataSizeWeight()],
            client_callbacks=[ParticipationLearningRate(base_lr, frequency)],
            hparams=hparams,
        )
