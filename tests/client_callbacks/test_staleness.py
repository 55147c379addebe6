"""Staleness-aware client callbacks (lit_asyncfl.client_callbacks.staleness): state derived on load."""

from __future__ import annotations

from lit_asyncfl.client.staleness_callbacks import ParticipationLearningRate


def test_participation_counts_total_is_derived_from_the_counts_on_load():
    cb = ParticipationLearningRate()
    cb.load_state_dict({"participations": {"0": 2, "3": 5}})  # a checkpoint written before "dispatched" existed
    assert (cb.participations, cb.total, cb.dispatched) == ({0: 2, 3: 5}, 7, {})
    cb.load_state_dict({"participations": {1: 1}, "dispatched": {"9": [1, 4]}})
    assert (cb.total, cb.dispatched) == (1, {9: (1, 4)})
