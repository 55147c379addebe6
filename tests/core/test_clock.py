"""The event queue orders by (virtual time, sequence number)."""

from __future__ import annotations

import random

import pytest

from lit_asyncfl.core.clock import EventQueue


def test_events_pop_in_time_order_whatever_the_push_order():
    rng = random.Random(0)
    times = [rng.choice([0.0, 1.5, 2.0, 7.25, 10.0]) + rng.random() * 0.01 * rng.randint(0, 1) for _ in range(200)]
    q = EventQueue()
    for i, t in enumerate(times):
        q.push(t, "arrival", idx=i)
    popped = [q.pop() for _ in range(len(times))]
    expected = sorted(range(len(times)), key=lambda i: (times[i], i))  # time, then insertion order
    assert [e.data["idx"] for e in popped] == expected


def test_state_dict_round_trip_preserves_order_and_sequence():
    q = EventQueue()
    for t in [3.0, 1.0, 3.0, 2.0]:
        q.push(t, "trigger")
    q.pop()
    restored = EventQueue()
    restored.load_state_dict(q.state_dict())
    assert [(e.time, e.seq) for e in restored] == [(e.time, e.seq) for e in q]
    new = restored.push(3.0, "trigger")
    assert new.seq == 4  # numbering continues after the restored events


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_bad_event_times_are_rejected(bad):
    with pytest.raises(ValueError, match="event time must be finite and >= 0"):
        EventQueue().push(bad, "arrival")
