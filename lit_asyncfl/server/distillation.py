"""Knowledge-distillation correction of stale updates (FedADT)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from lit_asyncfl.checks import check_fraction, check_int, check_number, check_ordered
from lit_asyncfl.core.update import derive_seed
from lit_asyncfl.functional.distillation import adaptive_distillation_weight, distillation_loss
from lit_asyncfl.server.base import ServerCallback

# Defaults (the paper's where it gives them), which FedADT's preset repeats by name.
STALENESS_THRESHOLD = 1
TEMPERATURE = 3.0
WEIGHT_MIN = 0.2
WEIGHT_MAX = 0.6
RAMP_VERSIONS = 1000
PASSES = 1
DATA_FRACTION = 0.005
BATCH_SIZE = 32
TIME_PER_SAMPLE = 0.01

if TYPE_CHECKING:
    from lit_asyncfl.core.server import Server
    from lit_asyncfl.core.update import ClientUpdate


class DistillationCorrection(ServerCallback):
    r"""Correct a stale upload by distilling it (student) toward the current global model (teacher).

    For an update with staleness :math:`\tau = t_g - t_i` above ``staleness_threshold``, the uploaded model is
    trained for ``passes`` passes over the server's distillation set (``data_fraction`` of the training data,
    held out before the clients' partition, seen by no client and no evaluation) with plain SGD on

    .. math::
        a(t) \, \mathrm{KL}(\sigma(z_{global}/T) \| \sigma(z_{upload}/T)) + (1 - a(t)) \, \mathrm{CE}(z_{upload}, y),
        \qquad a(t) = a_{min} + (a_{max} - a_{min}) \min(1, t / T_g)

    at the client's learning rate (``update.info["lr"]``, after any decay) unless ``lr`` is given, and batch size
    ``batch_size``. Any ``LightningModule`` whose forward returns logits works. The server is busy for
    ``passes * |D| * time_per_sample`` virtual seconds per distillation (cost model: a server processing
    ``1 / time_per_sample`` samples per virtual second); updates arriving meanwhile wait.

    **Resolution**: the staleness threshold is a parameter, default 1 as the paper writes it (``tau > 1``).

    Args:
        staleness_threshold: Distill updates with staleness strictly above this.
        temperature: :math:`T`.
        weight_min: :math:`a_{min}`.
        weight_max: :math:`a_{max}`.
        ramp_versions: :math:`T_g`.
        fixed_weight: Use this constant :math:`a` instead of the adaptive one (the paper's ablation: 0.2, 0.6).
        passes: Passes over the distillation set.
        data_fraction: Fraction of the training data held out as the distillation set (0.5% in the paper).
        batch_size: Distillation mini-batch size.
        lr: Distillation learning rate (``None``: the client's).
        time_per_sample: Server virtual seconds per distillation sample and pass.

    Example:
        >>> cb = DistillationCorrection()
        >>> cb.weight(0), cb.weight(500), cb.weight(5000)
        (0.2, 0.4, 0.6)
    """

    def __init__(
        self,
        staleness_threshold: int = STALENESS_THRESHOLD,
        temperature: float = TEMPERATURE,
        weight_min: float = WEIGHT_MIN,
        weight_max: float = WEIGHT_MAX,
        ramp_versions: int = RAMP_VERSIONS,
        fixed_weight: float | None = None,
        passes: int = PASSES,
        data_fraction: float = DATA_FRACTION,
        batch_size: int = BATCH_SIZE,
        lr: float | None = None,
        time_per_sample: float = TIME_PER_SAMPLE,
    ) -> None:
        check_int("staleness_threshold", staleness_threshold, 0)
        check_number("temperature", temperature, 0, open_min=True)
        check_fraction("weight_min", weight_min)
        check_fraction("weight_max", weight_max)
        check_ordered("weight_min", weight_min, "weight_max", weight_max)
        check_fraction("fixed_weight", fixed_weight, optional=True)
        check_int("ramp_versions", ramp_versions, 1)
        check_int("passes", passes, 1)
        check_int("batch_size", batch_size, 1)
        check_fraction("data_fraction", data_fraction, open_min=True, open_max=True)
        check_number("lr", lr, 0, open_min=True, optional=True)
        check_number("time_per_sample", time_per_sample, 0)
        self.staleness_threshold = staleness_threshold
        self.temperature = temperature
        self.weight_min, self.weight_max, self.ramp_versions = weight_min, weight_max, ramp_versions
        self.fixed_weight = fixed_weight
        self.passes = passes
        self.server_data_fraction = data_fraction
        self.batch_size = batch_size
        self.lr = lr
        self.time_per_sample = time_per_sample

    def weight(self, version: int) -> float:
        """The distillation weight :math:`a(t)` at global version ``version``."""
        if self.fixed_weight is not None:
            return self.fixed_weight
        return adaptive_distillation_weight(version, self.weight_min, self.weight_max, self.ramp_versions)

    def _applies(self, update: ClientUpdate) -> bool:
        return update.staleness > self.staleness_threshold

    def processing_time(self, server: Server, update: ClientUpdate) -> float:
        if not self._applies(update) or server.data is None:
            return 0.0
        return self.passes * len(server.data[1]) * self.time_per_sample

    def transform_update(self, server: Server, update: ClientUpdate) -> ClientUpdate:
        if not self._applies(update):
            return update
        if server.data is None:
            raise RuntimeError("DistillationCorrection needs server data: the trainer holds it out at fit()")
        seed = derive_seed(server.version, update.client, update.job.job_id)
        update.weights = self.distill(server, update.weights, float(update.info.get("lr", 0.01)), seed)
        update.info["distilled"] = True
        return update

    def distill(self, server: Server, student_weights: torch.Tensor, client_lr: float, seed: int = 0) -> torch.Tensor:
        """Distill ``student_weights`` toward the global model on the server's data; return the new weights.

        ``seed`` fixes the batch order and any randomness of the module (dropout), so the result depends only on
        the inputs, whatever ran before.
        """
        assert server.data is not None
        inputs, targets = server.data
        workspace = server.workspace
        module, flat = workspace.module, workspace.flat
        weight = self.weight(server.version)
        was_training = module.training
        with torch.no_grad():
            flat.load(server.weights)
            module.eval()
            teacher_logits = module(inputs)
        flat.load(student_weights)
        module.train()
        optimizer = torch.optim.SGD([p for p in flat.params if p.requires_grad], lr=self.lr or client_lr)
        generator = torch.Generator().manual_seed(seed)
        torch.default_generator.manual_seed(seed)
        for _ in range(self.passes):
            order = torch.randperm(len(targets), generator=generator).to(targets.device)
            for start in range(0, len(order), self.batch_size):
                idx = order[start : start + self.batch_size]
                loss = distillation_loss(
                    module(inputs[idx]), teacher_logits[idx], targets[idx], weight, self.temperature
                )
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
        module.train(was_training)
        return flat.read()

    def state_dict(self) -> dict[str, Any]:
        return {}
