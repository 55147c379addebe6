"""Trace-driven availability (lit_asyncfl.availability.trace): a trace repeats with its period, FedScale's behaviour
traces wrap around; traces cannot exhaust memory or end a run silently, and bad files fail as the promised
ValueError naming the file and the line."""

from __future__ import annotations

import tracemalloc

import pytest
from conftest import make_trainer

from lit_asyncfl.algorithms import FedAsync
from lit_asyncfl.availability import TraceAvailability
from lit_asyncfl.data import DigitsDataModule
from lit_asyncfl.models import LogisticRegression
from lit_asyncfl.traces import read_availability_trace, read_capacity_trace


def _peak_bytes(availability, time: float) -> int:
    tracemalloc.start()
    try:
        for client in range(4):
            availability.is_online(client, time)
            availability.next_online([client], time)
        availability.online(time)
        availability.online_time(0, time)
        availability.online_counts([time / 2, time])
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_periodic_trace_answers_in_memory_independent_of_the_virtual_time_reached(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("device,start,end,period\na,0,0.004,0.01\na,0.006,0.008,0.01\nb,0.002,0.005,0.01\n")
    peaks = []
    for time in (10.0, 1e4):  # 1,000 and 1,000,000 periods
        availability = TraceAvailability(str(path))
        availability.setup(4, seed=0)
        peaks.append(_peak_bytes(availability, time))
    assert max(peaks) < 200_000, peaks  # materialising 1e6 periods' switches takes tens of MB
    availability = TraceAvailability(str(path))
    availability.setup(4, seed=0)
    t = 1e4 + 0.0065  # by hand: phase 0.0065 is in a's [0.006, 0.008) and after b's [0.002, 0.005)
    assert availability.is_online(0, t) and not availability.is_online(1, t)
    assert availability.next_offline(0, t) == pytest.approx(1e4 + 0.008)
    assert availability.online_time(1, 1e4) == pytest.approx(1e6 * 0.003)


def test_a_trace_under_which_no_device_is_online_in_the_budget_is_refused_at_fit_start(tmp_path):
    path = tmp_path / "late.csv"
    path.write_text("device,start,end\na,1000,2000\nb,1500,1600\n")
    trainer = make_trainer(tmp_path, FedAsync(concurrency=2), num_clients=4, max_versions=5, max_virtual_time=500.0,
                           availability=TraceAvailability(str(path)))  # fmt: skip
    with pytest.raises(ValueError, match=r"the first device comes online at virtual time 1000, after "
                                         r"max_virtual_time=500.0: no update can arrive"):  # fmt: skip
        trainer.fit(LogisticRegression(input_dim=64), datamodule=DigitsDataModule())
    never = tmp_path / "never.json"
    never.write_text('{"devices": [{"id": "a", "period": null, "active": []}]}')
    trainer = make_trainer(tmp_path, FedAsync(concurrency=2), num_clients=4, max_versions=5,
                           availability=TraceAvailability(str(never)))  # fmt: skip
    with pytest.raises(ValueError, match=r"no device is ever online under the availability TraceAvailability"):
        trainer.fit(LogisticRegression(input_dim=64), datamodule=DigitsDataModule())


def test_a_run_whose_devices_go_offline_for_good_names_the_reason_at_the_end(tmp_path):
    path = tmp_path / "brief.csv"
    path.write_text("device,start,end\na,0,0.001\n")  # online for a millisecond: every job is dropped
    trainer = make_trainer(tmp_path, FedAsync(concurrency=2), num_clients=4, max_versions=5,
                           availability=TraceAvailability(str(path)))  # fmt: skip
    reason = r"nothing left to happen: no device is online again under the availability TraceAvailability"
    with pytest.warns(RuntimeWarning, match=reason + r"; jobs dropped: \{'offline': 2\}"):
        trainer.fit(LogisticRegression(input_dim=64), datamodule=DigitsDataModule())
    assert trainer.summary["versions"] == 0 and trainer.summary["stop_reason"] == "queue_empty"


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("latin1.csv", "device,start,end\nt\xe9l\xe9phone,0,1\n".encode("latin-1"),
         r"latin1.csv, line 2: not UTF-8 text \(byte b'\\xe9' at column 2\)"),
        ("binary.csv", bytes(range(256)) * 4, r"binary.csv, line 2: not UTF-8 text \(byte b'\\x80' at column 118\)"),
        ("nul.csv", b"device,start,end\na,0,1\x00\n", r"nul.csv, line 2: a NUL byte: a binary file"),
        ("deep.json", b'{"devices":\n' + b"[" * 100_000 + b"]" * 100_000 + b"}",
         r"deep.json, line 2: JSON nested deeper than Python can read"),
        ("latin1.json", '{"devices": [{"id": "t\xe9l", "period": null, "active": [[0, 1]]}]}'.encode("latin-1"),
         r"latin1.json, line 1: not UTF-8 text"),
    ],
)  # fmt: skip
def test_undecodable_and_deeply_nested_traces_are_value_errors_naming_file_and_line(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_bytes(content)
    for read in (read_availability_trace, read_capacity_trace):
        with pytest.raises(ValueError, match=message):
            read(path)


def test_devices_offline_for_longer_than_the_old_search_come_back(tmp_path):
    path = tmp_path / "late.csv"  # offline for the first 5,000 s (a FedScale day starts offline for hours)
    path.write_text("device,start,end,period\na,5000,60000,86400\nb,7000,9000,\n")
    availability = TraceAvailability(str(path))
    availability.setup(2, seed=0)
    assert availability.next_online([0], 0.0) == 5000.0 and availability.next_online([1], 0.0) == 7000.0
    assert availability.next_online([0], 60000.0) == 86400.0 + 5000.0  # by hand: the next period's start
    assert availability.next_online([1], 9000.0) == float("inf")  # not periodic: gone for good
    trainer = make_trainer(tmp_path, FedAsync(concurrency=2), num_clients=4, max_versions=3,
                           availability=TraceAvailability(str(path)))  # fmt: skip
    trainer.fit(LogisticRegression(input_dim=64), datamodule=DigitsDataModule())
    assert trainer.summary["versions"] == 3  # before: 0 versions, stop_reason 'queue_empty'


def test_a_trace_repeats_with_its_period_and_reads_touching_intervals_as_one(tmp_path):
    path = tmp_path / "t.json"
    path.write_text('{"devices": [{"id": "x", "period": 100, "active": [[0, 10], [90, 100]]}]}')
    a = TraceAvailability(str(path))
    a.setup(1, seed=0)
    # online [0, 10), [90, 110), [190, 210), ...: the end of one period runs into the next one's start
    assert [a.is_online(0, t) for t in (5, 10, 50, 95, 100, 105, 110, 150, 195)] == [
        True, False, False, True, True, True, False, False, True,
    ]  # fmt: skip
    assert a.next_offline(0, 95.0) == 110.0 and a.next_online([0], 150.0) == 190.0
    assert a.online_time(0, 1000.0) == pytest.approx(10 + 9 * 20 + 10)


def test_fedscale_behave_trace_drives_availability_with_its_wrap_around(tmp_path):
    import pickle

    # FedScale's layout: client id -> active/inactive interval bounds, wrapping around finish_time
    trace = {
        1: {"duration": 40, "inactive": [20, 70], "finish_time": 100, "active": [10, 50], "model": "phone"},
        2: {"duration": 100, "inactive": [100], "finish_time": 100, "active": [0], "model": "laptop"},
    }
    path = tmp_path / "client_behave_trace.pkl"
    path.write_bytes(pickle.dumps(trace))
    a = TraceAvailability(str(path), time_scale=2.0)  # one trace second = two virtual seconds
    a.setup(3, seed=0)  # client 2 replays the first device again
    times = [0.0, 25.0, 45.0, 99.0, 145.0, 230.0]  # trace times 0, 12.5, 22.5, 49.5, 72.5, 115 (= 15 after a wrap)
    assert [a.is_online(0, t) for t in times] == [False, True, False, False, False, True]
    assert [a.is_online(2, t) for t in times] == [a.is_online(0, t) for t in times]
    assert all(a.is_online(1, t) for t in [*times, 1e6])  # online over its whole period, period after period
    assert a.online_fraction(2000.0) == pytest.approx((2 * (10 + 20) / 100 + 1.0) / 3)
