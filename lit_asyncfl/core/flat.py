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
    BatchNorm's ``num_batches_tracked`` counters are read after a job as :meth:`tracked` (the batches each layer
    counted since binding) and set in the global model by ``load(weights, tracked)``: the server aggregates them
    (see :class:`~lit_asyncfl.core.server.Server`), so the global model counts its training batches as one
    ``lightning.Trainer`` does.

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
        counters: list[tuple[Tensor, Tensor]] = []
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
                    if isinstance(mod, nn.modules.batchnorm._NormBase) and name == "num_batches_tracked":
                        counters.append(fixed[-1])
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
        self._counters = counters

    @property
    def numel(self) -> int:
        """Number of elements in the flat vector."""
        return self.flat.numel()

    @property
    def nbytes(self) -> int:
        """Bytes of one copy of the model (what a client downloads or uploads)."""
        return self.flat.numel() * self.flat.element_size()

    def load(self, weights: Tensor, tracked: Tensor | None = None, reset: bool = True) -> None:
        """Copy ``weights`` into the module in one operation (and reset the buffers outside the flat vector unless
        ``reset=False``, e.g. mid-job; with ``tracked``, set BatchNorm's ``num_batches_tracked`` to their binding
        values plus ``tracked``, one entry per layer as :meth:`tracked` reads them)."""
        with torch.no_grad():
            self.flat.copy_(weights)
            for buf, initial in self._fixed if reset else ():
                buf.copy_(initial)
            if tracked is not None:
                for (buf, initial), count in zip(self._counters, tracked.tolist(), strict=True):
                    buf.copy_(initial + count)

    def tracked(self) -> Tensor | None:
        """Batches each BatchNorm layer counted (``num_batches_tracked``) since binding or the last :meth:`load`, as
        an ``int64`` vector (``None`` for a module without BatchNorm statistics).

        Example:
            >>> net = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
            >>> flat = FlatParameters(net)
            >>> _ = net(torch.randn(4, 2)), net(torch.randn(4, 2))
            >>> flat.tracked()
            tensor([2])
        """
        if not self._counters:
            return None
        return torch.stack([(buf - initial).reshape(()).cpu() for buf, initial in self._counters]).long()

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
