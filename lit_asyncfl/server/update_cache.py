"""A per-client cache of each client's latest update, with the running mean over all clients (CA2FL)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lit_asyncfl.checks import check_choice

#: Storage types a cache may use for its entries, by name.
CACHE_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
#: The entries' default storage type.
CACHE_DTYPE = "float32"


class ClientUpdateCache:
    r"""The latest update :math:`h^i` of every client seen so far, and their sum, for :math:`h = \frac{1}{N}
    \sum_{i=1}^{N} h^i` in O(model size) per change (clients never seen count as :math:`h^i = 0`).

    Memory: one model-sized vector per client that ever uploaded (in ``dtype``: ``"float16"`` or ``"bfloat16"``
    halve it; e.g. 10,000 clients of LeNet-5 on digits, 21,386 parameters, take 0.86 GB in float32, 0.43 GB in
    float16), plus the sum in float64. The sum is kept of the stored (rounded) entries, so :meth:`mean` is exactly
    the mean of what :meth:`get` returns, up to float64 rounding; it is updated as ``sum += new - old`` and never
    recomputed, so it does not depend on how many clients there are.

    Args:
        dtype: Storage type of the entries: ``"float32"`` (default), ``"float64"``, ``"bfloat16"`` or
            ``"float16"``.

    Example:
        >>> cache = ClientUpdateCache()
        >>> cache.put(3, torch.tensor([2.0, 4.0]))
        >>> cache.mean(num_clients=4)
        tensor([0.5000, 1.0000])
        >>> cache.get(3), cache.get(0)
        (tensor([2., 4.]), None)
    """

    def __init__(self, dtype: str = CACHE_DTYPE) -> None:
        check_choice("dtype", dtype, sorted(CACHE_DTYPES))
        self.dtype = dtype
        self.entries: dict[int, Tensor] = {}
        self.total: Tensor | None = None

    def clear(self) -> None:
        """Forget every entry."""
        self.entries = {}
        self.total = None

    def __len__(self) -> int:
        return len(self.entries)

    def get(self, client: int) -> Tensor | None:
        """Client ``client``'s cached update (as float32), or ``None`` if it never uploaded."""
        entry = self.entries.get(client)
        return None if entry is None else entry.float()

    def put(self, client: int, update: Tensor) -> None:
        """Replace client ``client``'s cached update by ``update``.

        Raises:
            ValueError: A finite ``update`` overflows the storage type (float16 holds up to 65504): cached as
                infinity it would make every later mean non-finite.
        """
        stored = update.detach().to(CACHE_DTYPES[self.dtype], copy=True)
        overflowed = stored.dtype != update.dtype and not bool(torch.isfinite(stored).all())
        if overflowed and bool(torch.isfinite(update).all()):
            raise ValueError(
                f"client {client}'s update reaches {update.abs().max().item():.6g}, beyond the range of the "
                f"{self.dtype} cache (max {torch.finfo(stored.dtype).max:.6g}); use cache_dtype='bfloat16' or 'float32'"
            )
        old = self.entries.get(client)
        if self.total is None:
            self.total = torch.zeros(stored.shape, dtype=torch.float64)
        self.total.add_(stored.double())
        if old is not None:
            self.total.sub_(old.double())
        self.entries[client] = stored

    def mean(self, num_clients: int) -> Tensor | None:
        r""":math:`h = \frac{1}{N} \sum_i h^i` over ``num_clients`` clients (float32), or ``None`` when empty."""
        if self.total is None:
            return None
        return (self.total / num_clients).float()

    @property
    def nbytes(self) -> int:
        """Bytes held by the entries and the sum."""
        entries = sum(t.numel() * t.element_size() for t in self.entries.values())
        return entries + (0 if self.total is None else self.total.numel() * 8)

    def state_dict(self) -> dict[str, Any]:
        """Entries and sum, for checkpoints."""
        return {"dtype": self.dtype, "entries": dict(self.entries), "total": self.total}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state produced by :meth:`state_dict` (the dtype must match)."""
        if state["dtype"] != self.dtype:
            raise ValueError(f"the checkpoint's cache holds {state['dtype']} entries, this one {self.dtype}")
        self.entries = {int(k): v for k, v in state["entries"].items()}
        self.total = state["total"]
