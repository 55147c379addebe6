"""The virtual clock: a priority queue of events ordered by (virtual time, sequence number)."""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Any


@dataclass(order=True, frozen=True)
class Event:
    """Something that happens at a virtual time.

    Events compare by ``(time, seq)``: ties in time are broken by the order in which they were scheduled, so the
    processing order never depends on anything but the simulation itself.

    Args:
        time: Virtual time (seconds) at which the event happens.
        seq: Sequence number given by the :class:`EventQueue` when the event was pushed.
        kind: What happens, e.g. ``"arrival"`` or ``"trigger"``.
        data: Plain payload (ints, floats, strings), so the queue can be checkpointed.
    """

    time: float
    seq: int
    kind: str = field(compare=False)
    data: dict[str, Any] = field(compare=False, default_factory=dict)


class EventQueue:
    """Events in virtual-time order; ties broken by insertion order.

    Example:
        >>> q = EventQueue()
        >>> _ = q.push(5.0, "arrival", client=1)
        >>> _ = q.push(2.0, "trigger")
        >>> _ = q.push(5.0, "arrival", client=0)
        >>> [(e.time, e.kind, e.data) for e in (q.pop(), q.pop(), q.pop())]
        [(2.0, 'trigger', {}), (5.0, 'arrival', {'client': 1}), (5.0, 'arrival', {'client': 0})]
    """

    def __init__(self) -> None:
        self._heap: list[Event] = []
        self._seq = 0

    def push(self, time: float, kind: str, **data: Any) -> Event:
        """Schedule an event ``kind`` at virtual ``time`` and return it."""
        if not math.isfinite(time) or time < 0:
            raise ValueError(f"event time must be finite and >= 0, got {time}")
        event = Event(float(time), self._seq, kind, data)
        self._seq += 1
        heapq.heappush(self._heap, event)
        return event

    def pop(self) -> Event:
        """Remove and return the earliest event."""
        return heapq.heappop(self._heap)

    def restore(self, event: Event) -> None:
        """Put back an event just popped, in its original place (same time and sequence number)."""
        heapq.heappush(self._heap, event)

    def peek(self) -> Event | None:
        """The earliest event without removing it, or ``None`` when empty."""
        return self._heap[0] if self._heap else None

    def remove(self, predicate: Any) -> list[Event]:
        """Remove every event for which ``predicate(event)`` is true and return them."""
        removed = [e for e in self._heap if predicate(e)]
        if removed:
            self._heap = [e for e in self._heap if not predicate(e)]
            heapq.heapify(self._heap)
        return removed

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self):
        return iter(sorted(self._heap))

    def state_dict(self) -> dict[str, Any]:
        """Plain, weights-only-loadable state."""
        return {"seq": self._seq, "events": [(e.time, e.seq, e.kind, dict(e.data)) for e in sorted(self._heap)]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state produced by :meth:`state_dict`."""
        self._seq = int(state["seq"])
        self._heap = [Event(float(t), int(s), k, dict(d)) for t, s, k, d in state["events"]]
        heapq.heapify(self._heap)
