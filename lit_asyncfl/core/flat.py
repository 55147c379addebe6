"""Bind a module's floating-point state to one flat tensor, so that loading weights is one copy."""

from __future__ import annotations

import torch
from torch import Tensor, nn


class FlatParameters:
    """A module's parameters and persistent floating-point buffers as views into one contiguous vector.

    After binding, ``flat`` *is* the module's trainable state: ``load(w)`` is a single ``copy_`` and ``read()`` a
    single ``clone``. Parameters come first, in ``module.parameters()`` order, then persistent floating buffers
    (e.g. BatchNorm running statistics); ``param_numel`` is the length of the parameter part.

    Every other buffer — integer ones such as BatchNorm's ``num_batches_tracked`` and non-persistent ones such as
    attention masks — is not part of the weights that travel between clients and server: :meth:`load` restores it
    to its value at binding time, so each local training starts from the same state whatever ran before.

    Args:
        module: The module to bind; its parameters are re-pointed to views of the new flat tensor.

    Example:
        >>> layer = nn.Linear(2, 1)
        >>> flat = FlatParameters(layer)
        >>> flat.numel
        3
        >>> flat.load(torch.tensor([1.0, 2.0, 3.0]))
        >>> layer.weight.data, layer.bias.data
        (tensor([[1., 2.]]), tensor([3.]))
    """

    def __init__(self, module: nn.Module) -> None:
        params = list(module.parameters())
        flat_buffers: list[tuple[nn.Module, str, Tensor]] = []
        fixed: list[tuple[Tensor, Tensor]] = []
        seen: set[int] = set()
        unique_flat: list[Tensor] = []
        for mod in module.modules():
            for name, buf in mod._buffers.items():
                if buf is None:
                    continue
                first = id(buf) not in seen
                seen.add(id(buf))
                if buf.is_floating_point() and name not in mod._non_persistent_buffers_set:
                    flat_buffers.append((mod, name, buf))  # a shared buffer is re-pointed in every module
                    if first:
                        unique_flat.append(buf)
                elif first:
                    fixed.append((buf, buf.detach().clone()))
        tensors = [p.data for p in params] + unique_flat
        if not tensors:
            raise ValueError(f"{type(module).__name__} has no floating-point parameters or buffers to train")
        dtypes = {t.dtype for t in tensors}
        devices = {t.device for t in tensors}
        if len(dtypes) > 1 or len(devices) > 1:
            raise ValueError(
                "all parameters and floating buffers must share one dtype and device, got dtypes "
                f"{sorted(map(str, dtypes))} and devices {sorted(map(str, devices))}"
            )
        self.flat: Tensor = torch.cat([t.detach().reshape(-1) for t in tensors])
        self.param_numel = sum(p.numel() for p in params)
        offset = 0
        for p in params:
            p.data = self.flat[offset : offset + p.numel()].view_as(p)
            offset += p.numel()
        views: dict[int, Tensor] = {}
        for mod, name, buf in flat_buffers:
            if id(buf) not in views:
                views[id(buf)] = self.flat[offset : offset + buf.numel()].view_as(buf)
                offset += buf.numel()
            mod._buffers[name] = views[id(buf)]
        self.params = params
        self._fixed = fixed

    @property
    def numel(self) -> int:
        """Number of elements in the flat vector."""
        return self.flat.numel()

    @property
    def nbytes(self) -> int:
        """Bytes of one copy of the model (what a client downloads or uploads)."""
        return self.flat.numel() * self.flat.element_size()

    def load(self, weights: Tensor) -> None:
        """Copy ``weights`` into the module in one operation (and reset the buffers outside the flat vector)."""
        with torch.no_grad():
            self.flat.copy_(weights)
            for buf, initial in self._fixed:
                buf.copy_(initial)

    def param_views(self, weights: Tensor) -> list[Tensor]:
        """Views of a flat vector shaped like the module's parameters (same order as ``self.params``)."""
        views, offset = [], 0
        for p in self.params:
            views.append(weights[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
        return views

    def read(self) -> Tensor:
        """A copy of the module's current flat state."""
        return self.flat.detach().clone()
