r"""FedDyn's dynamic regulariser (Acar et al., ICLR 2021): the client's gradient correction and the server state.

Paper symbols: :math:`\theta^{t-1}` the server model sent to the round's clients, :math:`\theta_k^t` client
:math:`k`'s model after local training, :math:`\nabla L_k(\theta_k^{t-1})` client :math:`k`'s state (written
:math:`g_k`, zero before its first round), :math:`h^t` the server state (zero at the start), :math:`m` the number
of clients, :math:`P_t` the clients of round :math:`t`.
"""

from __future__ import annotations

from torch import Tensor

#: :math:`\alpha` by default, the client's and the server's (the authors' commands use ``alpha_coef`` 1e-2 to 1e-1).
ALPHA = 0.01


def feddyn_gradient(
    grad: Tensor,
    theta: Tensor,
    theta_server: Tensor,
    g_k: Tensor | None,
    alpha: float,
    max_norm: float | None = None,
) -> Tensor:
    r"""The gradient of client :math:`k`'s FedDyn objective at :math:`\theta`.

    .. math::
        \nabla_\theta \Big[ L_k(\theta) - \langle g_k, \theta \rangle
        + \frac{\alpha}{2} \lVert \theta - \theta^{t-1} \rVert^2 \Big]
        = \nabla L_k(\theta) - g_k + \alpha (\theta - \theta^{t-1})

    With ``max_norm`` :math:`C`, as the authors' code (``utils_general.py``: ``clip_grad_norm_`` at ``max_norm =
    10`` after ``backward`` of the task and linear terms, :math:`\alpha \theta` added after it by SGD's weight
    decay): :math:`\mathrm{clip}_C(\nabla L_k(\theta) - g_k - \alpha \theta^{t-1}) + \alpha \theta`, where
    :math:`\mathrm{clip}_C(x) = x \min(1, C / (\lVert x \rVert + 10^{-6}))` (``torch.nn.utils.clip_grad_norm_``).

    Args:
        grad: :math:`\nabla L_k(\theta)` (the task loss's gradient).
        theta: :math:`\theta`, the current local weights.
        theta_server: :math:`\theta^{t-1}`.
        g_k: :math:`g_k` (``None``: zero).
        alpha: :math:`\alpha`.
        max_norm: :math:`C`, or ``None`` for no clipping.

    Example:
        >>> import torch
        >>> feddyn_gradient(torch.tensor([1.0]), torch.tensor([2.0]), torch.tensor([0.5]), torch.tensor([0.25]), 0.1)
        tensor([0.9000])
        >>> feddyn_gradient(torch.tensor([30.0]), torch.tensor([2.0]), torch.tensor([0.5]), None, 0.1, max_norm=10.0)
        tensor([10.2000])
    """
    if max_norm is None:
        out = grad + alpha * (theta - theta_server)
        return out if g_k is None else out - g_k
    linear = grad - alpha * theta_server
    if g_k is not None:
        linear = linear - g_k
    return linear * min(1.0, max_norm / (float(linear.norm()) + 1e-6)) + alpha * theta


def feddyn_client_state(g_k: Tensor | None, theta_k: Tensor, theta_server: Tensor, alpha: float) -> Tensor:
    r"""Client :math:`k`'s new state after its local training.

    .. math:: g_k \leftarrow g_k - \alpha (\theta_k^t - \theta^{t-1})

    Example:
        >>> import torch
        >>> feddyn_client_state(None, torch.tensor([1.0, 2.0]), torch.tensor([0.5, 0.5]), alpha=0.1)
        tensor([-0.0500, -0.1500])
    """
    step = (theta_k - theta_server) * -alpha
    return step if g_k is None else g_k + step


def feddyn_server_state(h: Tensor | None, client_changes: Tensor, num_clients: int, alpha: float) -> Tensor:
    r"""The server state after round :math:`t`.

    .. math:: h^t = h^{t-1} - \frac{\alpha}{m} \sum_{k \in P_t} (\theta_k^t - \theta^{t-1})

    Args:
        h: :math:`h^{t-1}` (``None``: zero).
        client_changes: :math:`\sum_{k \in P_t} (\theta_k^t - \theta^{t-1})`.
        num_clients: :math:`m`, all clients (not only the round's).
        alpha: :math:`\alpha`.

    Example:
        >>> import torch
        >>> feddyn_server_state(torch.tensor([1.0]), torch.tensor([4.0]), num_clients=10, alpha=0.5)
        tensor([0.8000])
    """
    step = client_changes * (-alpha / num_clients)
    return step if h is None else h + step


def feddyn_server_model(mean_model: Tensor, h: Tensor, alpha: float) -> Tensor:
    r"""The new server model: :math:`\theta^t = \frac{1}{|P_t|} \sum_{k \in P_t} \theta_k^t - \frac{1}{\alpha} h^t`.

    Example:
        >>> import torch
        >>> feddyn_server_model(torch.tensor([1.0]), torch.tensor([0.2]), alpha=0.1)
        tensor([-1.])
    """
    return mean_model - h / alpha
