r"""Knowledge-distillation formulas (FedADT, Hinton et al.)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


def distillation_loss(
    student_logits: Tensor, teacher_logits: Tensor, targets: Tensor, weight: float, temperature: float
) -> Tensor:
    r"""FedADT's loss (Eq. 7): distillation toward the teacher mixed with the hard-label loss.

    .. math::
        \mathcal{L}_{KD} = a \cdot \mathrm{KL}\left(\sigma(z_T / T) \,\|\, \sigma(z_S / T)\right)
        + (1 - a) \cdot \mathrm{CE}(z_S, y)

    The KL divergence and the cross-entropy are averaged over the batch. (No :math:`T^2` factor: the paper's
    Eq. 7 has none.)

    Args:
        student_logits: :math:`z_S`, the corrected (uploaded) model's logits.
        teacher_logits: :math:`z_T`, the current global model's logits.
        targets: Labels :math:`y`.
        weight: :math:`a \in [0, 1]`.
        temperature: :math:`T > 0`.

    Example:
        >>> import torch
        >>> z = torch.tensor([[2.0, 0.0]])
        >>> float(distillation_loss(z, z, torch.tensor([0]), weight=1.0, temperature=3.0))  # same logits: KL 0
        0.0
    """
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"distillation weight must be in [0, 1], got {weight}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    kl = F.kl_div(
        F.log_softmax(student_logits / temperature, dim=-1),
        F.log_softmax(teacher_logits / temperature, dim=-1),
        reduction="batchmean",
        log_target=True,
    )
    return weight * kl + (1.0 - weight) * F.cross_entropy(student_logits, targets)


def adaptive_distillation_weight(version: int, weight_min: float, weight_max: float, ramp_versions: int) -> float:
    r"""FedADT's adaptive weight (Eq. 8): :math:`a(t) = a_{min} + (a_{max} - a_{min}) \min(1, t / T_g)`.

    Example:
        >>> [adaptive_distillation_weight(t, 0.2, 0.6, 1000) for t in (0, 500, 1000, 2000)]
        [0.2, 0.4, 0.6, 0.6]
    """
    return weight_min + (weight_max - weight_min) * min(1.0, version / ramp_versions)
