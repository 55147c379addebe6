"""FedDyn (Acar et al., ICLR 2021): federated learning with dynamic regularisation, synchronous rounds."""

from __future__ import annotations

from lit_asyncfl.algorithms.base import Algorithm, hyperparameters
from lit_asyncfl.checks import check_number
from lit_asyncfl.client_callbacks.client_state import DynamicRegularizer
from lit_asyncfl.functional.feddyn import ALPHA
from lit_asyncfl.schedulers.rounds import CLIENTS_PER_ROUND, SynchronousRounds
from lit_asyncfl.server.aggregators import ModelAverage
from lit_asyncfl.server.feddyn import DynamicCorrection


class FedDyn(Algorithm):
    r"""Federated learning based on dynamic regularisation (Acar et al., ICLR 2021).

    Client :math:`k` of round :math:`t` (set :math:`P_t`) starts from :math:`\theta^{t-1}` and minimises

    .. math::
        L_k(\theta) - \langle \nabla L_k(\theta_k^{t-1}), \theta \rangle
        + \frac{\alpha}{2} \lVert \theta - \theta^{t-1} \rVert^2,
        \qquad \nabla L_k(\theta_k^t) = \nabla L_k(\theta_k^{t-1}) - \alpha (\theta_k^t - \theta^{t-1})

    (:class:`~lit_asyncfl.client_callbacks.DynamicRegularizer`: the linear and quadratic terms on the gradient, the
    state :math:`\nabla L_k` per client in the run's :class:`~lit_asyncfl.core.client_state.ClientStateStore`); the
    server

    .. math::
        h^t = h^{t-1} - \frac{\alpha}{m} \sum_{k \in P_t} (\theta_k^t - \theta^{t-1}), \qquad
        \theta^t = \frac{1}{|P_t|} \sum_{k \in P_t} \theta_k^t - \frac{1}{\alpha} h^t

    (a uniform :class:`~lit_asyncfl.server.aggregators.ModelAverage` and
    :class:`~lit_asyncfl.server.feddyn.DynamicCorrection`; :math:`m` = ``num_clients``).

    Resolutions:

    * **Uniform average** over the round's clients, as the paper and the authors' code (``np.mean`` of the selected
      clients' models), not weighted by data size.
    * **The same** :math:`\alpha` **for every client**, as the paper writes it; the authors' code divides
      :math:`\alpha` by each client's relative data size (``alpha_coef / weight_list[clnt]``), which equals the
      paper's on equal shards.
    * **Parameters only**: the state and the correction cover the parameters; floating buffers (BatchNorm
      statistics) are averaged, as the authors' code reads ``model.parameters()``. The authors' local weight decay
      (``1e-3``) is the module's own ``weight_decay``.
    * **Dropped members** (a round deadline, devices going offline): :math:`P_t` is who returned; a client whose job
      was lost keeps its state.
    * **Gradient clipping at norm 10**, as the authors' code (``max_norm = 10`` in ``utils_general.py``, every
      local step of every method): the gradient of the task and linear terms is clipped, then :math:`\alpha
      \theta` is added (their SGD's weight decay; see :func:`~lit_asyncfl.functional.feddyn.feddyn_gradient`). The
      paper does not mention it; ``max_grad_norm=None`` gives the unclipped objective as printed.
    * **Default** :math:`\alpha = 0.01` (the authors' commands use ``alpha_coef`` 1e-2 to 1e-1).

    Sources: the paper's algorithm and the authors' code (github.com/alpemreacar/FedDyn, ``utils_methods.py``)
    as re-implemented in well-known libraries.

    Memory: one model-sized vector per client that has trained (the store), one for :math:`h`.

    Args:
        alpha: :math:`\alpha > 0`, the client's and the server's.
        max_grad_norm: Clip each local step's gradient to this norm, as the authors' code (``None``: no clip;
            :class:`~lit_asyncfl.client_callbacks.DynamicRegularizer`'s, see there).
        clients_per_round, round_deadline: :class:`~lit_asyncfl.algorithms.FedAvg`'s arguments, see there.

    Example:
        >>> algo = FedDyn(alpha=0.1)
        >>> algo.client_callbacks[0].alpha, algo.server_callbacks[0].alpha
        (0.1, 0.1)
    """

    def __init__(
        self,
        alpha: float = ALPHA,
        clients_per_round: int | float = CLIENTS_PER_ROUND,
        round_deadline: float | None = None,
        max_grad_norm: float | None = 10.0,  # the authors' code (max_norm = 10); the regularizer's default: no clip
    ) -> None:
        hparams = hyperparameters(locals())
        check_number("round_deadline", round_deadline, 0, open_min=True, optional=True, unit=" virtual seconds")
        super().__init__(
            scheduler=SynchronousRounds(clients_per_round, deadline=round_deadline),
            aggregator=ModelAverage(buffer_size=None),
            server_callbacks=[DynamicCorrection(alpha)],
            client_callbacks=[DynamicRegularizer(alpha, max_grad_norm)],
            hparams=hparams,
        )
