"""Trace files: plain CSV/JSON formats, FedScale's pickled traces (loaded safely) and the capacity device model."""

from __future__ import annotations

import hashlib
import math
import os
import pickle
import re

import numpy as np
import pytest

from lit_asyncfl.devices import TraceDevices
from lit_asyncfl.hparams import describe
from lit_asyncfl.traces import (
    AvailabilityTrace,
    CapacityTrace,
    load_fedscale_behave_trace,
    load_fedscale_device_capacity,
    read_availability_trace,
    read_capacity_trace,
    write_availability_trace,
    write_capacity_trace,
)

# FedScale's client_behave_trace layout (benchmark/dataset/data/device_info/README.md): client id -> its intervals
# ``[active[j], inactive[j]]``, wrapping around ``finish_time``.
BEHAVE = {
    1: {"duration": 40, "inactive": [30, 80], "finish_time": 100, "active": [10, 60], "model": "SM-G960F"},
    # a zero-length interval (dropped) and one running past finish_time (cut there)
    2: {"duration": 15, "inactive": [5, 20, 120], "finish_time": 100, "active": [5, 15, 90], "model": "Pixel 2"},
    # NumPy values, as a trace written from NumPy would hold
    7: {
        "duration": 40,
        "inactive": np.array([40.0]),
        "finish_time": np.float64(200.0),
        "active": [np.int64(0)],
        "model": "CPH1801",
    },
}
# FedScale's client_device_capacity layout: milliseconds per sample (inference) and kbit/s.
CAPACITY = {
    1: {"computation": 153.0, "communication": 2209.61},
    2: {"computation": np.float64(50.0), "communication": 8},
}


def _dump(path, obj):
    with open(path, "wb") as f:
        pickle.dump(obj, f)
    return str(path)


def _write(path, text):
    path.write_text(text)
    return str(path)


# -- FedScale's pickles -------------------------------------------------------------------------------------------


def test_fedscale_behave_trace_becomes_intervals_repeating_every_finish_time(tmp_path):
    trace = load_fedscale_behave_trace(_dump(tmp_path / "client_behave_trace.pkl", BEHAVE))
    assert trace.devices == ["1", "2", "7"]
    assert trace.intervals[0].tolist() == [[10.0, 30.0], [60.0, 80.0]]
    assert trace.intervals[1].tolist() == [[15.0, 20.0], [90.0, 100.0]]  # [5, 5] dropped, [90, 120] cut at 100
    assert trace.intervals[2].tolist() == [[0.0, 40.0]]
    assert trace.period.tolist() == [100.0, 100.0, 200.0]
    assert all(iv.dtype == np.float64 and iv.shape[1] == 2 for iv in trace.intervals)


class _FedScaleIsActive:
    """FedScale's ``ClientMetadata.is_active`` (fedscale/cloud/internal/client_metadata.py), as a test oracle."""

    def __init__(self, traces):
        self.traces, self.index = traces, 0

    def __call__(self, cur_time):
        norm = cur_time % self.traces["finish_time"]
        if norm > self.traces["inactive"][self.index]:
            self.index += 1
        self.index %= len(self.traces["active"])
        return self.traces["active"][self.index] <= norm <= self.traces["inactive"][self.index]


def _online(intervals, period, t):
    norm = t % period if math.isfinite(period) else t
    return bool(np.any((intervals[:, 0] <= norm) & (norm < intervals[:, 1])))


@pytest.mark.parametrize("client", [1, 7])
def test_the_imported_intervals_agree_with_fedscales_is_active_over_several_periods(tmp_path, client):
    trace = load_fedscale_behave_trace(_dump(tmp_path / "t.pkl", BEHAVE))
    device = trace.devices.index(str(client))
    fedscale = _FedScaleIsActive(BEHAVE[client])
    ends = {float(t) for t in BEHAVE[client]["inactive"]}
    for t in np.arange(0.0, 3 * trace.period[device], 0.5):  # queried often, as FedScale's index needs
        expected = fedscale(t)
        if t % trace.period[device] in ends:
            assert expected and not _online(trace.intervals[device], trace.period[device], t)  # closed vs half-open
        else:
            assert _online(trace.intervals[device], trace.period[device], t) == expected, t


def test_fedscale_device_capacity_becomes_seconds_per_sample_and_bytes_per_second(tmp_path):
    trace = load_fedscale_device_capacity(_dump(tmp_path / "client_device_capacity.pkl", CAPACITY))
    assert trace.devices == ["1", "2"]
    assert trace.time_per_sample.tolist() == pytest.approx([0.153, 0.05])  # ms -> s
    assert trace.bandwidth.tolist() == pytest.approx([2209.61 * 128, 1024.0])  # kbit/s (1024 bits) -> bytes/s


def test_trace_devices_reproduce_fedscales_completion_time(tmp_path):
    path = _dump(tmp_path / "capacity.pkl", CAPACITY)
    model = TraceDevices(path, augmentation_factor=3.0)
    profiles = model.sample_profiles(2, np.random.default_rng(0))
    # FedScale: computation = augmentation_factor * batch_size * local_steps * compute_speed / 1000,
    # communication = (upload_size + download_size) / bandwidth, sizes in kbit = bytes / 1024 * 8
    batch_size, local_steps, model_bytes = 30, 20, 1_000_000
    fedscale_compute = 3.0 * batch_size * local_steps * 153.0 / 1000.0  # 275.4 s
    fedscale_comm = (2 * model_bytes / 1024.0 * 8.0) / 2209.61  # 15625 kbit / 2209.61 kbit/s = 7.0714 s
    t = model.job_timing(profiles, 0, num_samples=batch_size * local_steps, model_bytes=model_bytes, rng=None)
    assert t.compute == pytest.approx(fedscale_compute) == pytest.approx(275.4)
    assert t.download + t.upload == pytest.approx(fedscale_comm) == pytest.approx(7.071383638)


class _Payload:
    """Unpickling this runs ``os.system`` (with the default unpickler)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class _Eval:
    def __reduce__(self):
        return (eval, ("1 + 1",))


@pytest.mark.parametrize("load", [load_fedscale_behave_trace, load_fedscale_device_capacity])
def test_a_malicious_pickle_is_refused_without_running(tmp_path, load):
    marker = tmp_path / "pwned"
    path = _dump(tmp_path / "evil.pkl", {1: {"computation": _Payload(marker), "communication": 1.0}})
    with pytest.raises(ValueError, match=r"refused to load the global (posix|os|nt)\.system") as error:
        load(path)
    assert path in str(error.value)
    assert not marker.exists()  # the payload did not run
    with pytest.raises(ValueError, match=r"refused to load the global builtins\.eval"):
        load(_dump(tmp_path / "eval.pkl", {1: _Eval()}))


def test_a_file_that_is_not_a_pickle_is_a_value_error(tmp_path):
    path = tmp_path / "garbage.pkl"
    path.write_bytes(b"device,start,end\n")
    with pytest.raises(ValueError, match=r"garbage\.pkl: not a readable pickle"):
        load_fedscale_device_capacity(str(path))


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ([1, 2], r"must be a non-empty dict .* got \[1, 2\]"),
        ({}, r"must be a non-empty dict .* got \{\}"),
        ({3: {"active": [0], "finish_time": 10}}, r"client 3: expected a dict with the keys \['active', 'inactive'"),
        ({3: {"active": [0, 5], "inactive": [1], "finish_time": 10}}, r"client 3: active and inactive .* got 2 and 1"),
        ({3: {"active": [-4], "inactive": [1], "finish_time": 10}}, r"client 3, interval 0: active must be .* got -4"),
        (
            {3: {"active": [4], "inactive": [2], "finish_time": 10}},
            r"interval 0: inactive must be >= active 4.0, got 2",
        ),
        ({3: {"active": [0], "inactive": [1], "finish_time": 0}}, r"client 3: finish_time must be a number > 0, got 0"),
        ({3: {"active": [0], "inactive": [float("nan")], "finish_time": 9}}, r"inactive must be .* got nan"),
        ({3: {"active": "0", "inactive": [1], "finish_time": 9}}, r"client 3: active must be a list of times, got '0'"),
    ],
)
def test_bad_fedscale_behave_traces_name_the_client_and_value(tmp_path, obj, message):
    path = _dump(tmp_path / "behave.pkl", obj)
    with pytest.raises(ValueError, match=message) as error:
        load_fedscale_behave_trace(path)
    assert path in str(error.value)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"computation": 0.0, "communication": 5.0}, r"client 9: computation must be a number > 0, got 0.0"),
        ({"computation": "fast", "communication": 5.0}, r"computation must be a number > 0, got 'fast'"),
        ({"computation": 1.0, "communication": -5.0}, r"communication must be a number > 0 or inf, got -5.0"),
        ({"computation": 1.0}, r"client 9: expected a dict with the keys \['computation', 'communication'\]"),
    ],
)
def test_bad_fedscale_capacities_name_the_client_and_value(tmp_path, entry, message):
    with pytest.raises(ValueError, match=message):
        load_fedscale_device_capacity(_dump(tmp_path / "capacity.pkl", {9: entry}))


# -- plain formats ------------------------------------------------------------------------------------------------


def test_availability_csv_sorts_and_merges_and_keeps_devices_in_file_order(tmp_path):
    text = "device,start,end,period\nb,20,30,100\na,5,6,\nb,0,10,100\n\nb,10,15,100\nb,25,40,100\na,7,inf,\n"
    trace = read_availability_trace(_write(tmp_path / "a.csv", text))
    assert trace.devices == ["b", "a"]
    assert trace.intervals[0].tolist() == [[0.0, 15.0], [20.0, 40.0]]  # touching and overlapping rows merged
    assert trace.intervals[1].tolist() == [[5.0, 6.0], [7.0, math.inf]]
    assert trace.period.tolist() == [100.0, math.inf]


def test_availability_json_reads_the_documented_layout(tmp_path):
    text = (
        '{"devices": [{"id": "phone-1", "period": 86400.0, "active": [[0, 3600], [7200, 9000.5]]},'
        ' {"id": "laptop", "period": null, "active": [[100, 200]]}, {"id": "never", "active": []}]}'
    )
    trace = read_availability_trace(_write(tmp_path / "a.json", text))
    assert trace.devices == ["phone-1", "laptop", "never"]
    assert trace.intervals[0].tolist() == [[0.0, 3600.0], [7200.0, 9000.5]]
    assert trace.intervals[2].shape == (0, 2)
    assert trace.period.tolist() == [86400.0, math.inf, math.inf]


def _availability():
    return AvailabilityTrace(
        devices=["a", "dev,2", "c"],
        intervals=[np.array([[0.0, 0.1], [0.3, 1e9]]), np.array([[2.5, 3.75]]), np.array([[1.0, math.inf]])],
        period=np.array([2e9, 10.0, math.inf]),
    )


@pytest.mark.parametrize("suffix", [".csv", ".json"])
def test_availability_round_trips(tmp_path, suffix):
    trace = _availability()
    path = tmp_path / f"trace{suffix}"
    write_availability_trace(trace, path)
    back = read_availability_trace(path)
    assert back.devices == trace.devices
    for got, want in zip(back.intervals, trace.intervals):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(back.period, trace.period)


def test_a_device_without_intervals_round_trips_in_json_only(tmp_path):
    trace = AvailabilityTrace(["a"], [np.empty((0, 2))], np.array([math.inf]))
    write_availability_trace(trace, tmp_path / "t.json")
    assert read_availability_trace(tmp_path / "t.json").intervals[0].shape == (0, 2)
    with pytest.raises(ValueError, match=r"device 'a' has no interval, which a CSV file cannot hold"):
        write_availability_trace(trace, tmp_path / "t.csv")


def test_writers_refuse_a_trace_their_reader_would_refuse(tmp_path):
    bad = AvailabilityTrace(["a"], [np.array([[5.0, 1.0]])], np.array([math.inf]))
    with pytest.raises(ValueError, match=r"device 'a': end must be > start 5.0, got 1.0"):
        write_availability_trace(bad, tmp_path / "t.csv")
    assert not (tmp_path / "t.csv").exists()
    with pytest.raises(ValueError, match=r"time_per_sample must be a number > 0, got -1.0"):
        write_capacity_trace(CapacityTrace(["a"], np.array([-1.0]), np.array([1.0])), tmp_path / "c.json")


@pytest.mark.parametrize("suffix", [".csv", ".json"])
def test_capacity_round_trips(tmp_path, suffix):
    trace = CapacityTrace(["phone-1", "laptop"], np.array([0.486, 0.02]), np.array([276250.0, math.inf]))
    path = tmp_path / f"capacity{suffix}"
    write_capacity_trace(trace, path)
    back = read_capacity_trace(path)
    assert back.devices == trace.devices
    np.testing.assert_array_equal(back.time_per_sample, trace.time_per_sample)
    np.testing.assert_array_equal(back.bandwidth, trace.bandwidth)


AVAILABILITY_CSV_ERRORS = [
    ("", r"the file is empty"),
    ("device,start,end\n", r"holds no device"),
    ("device,start\na,0\n", r"line 1: the header must hold the columns .* got \['device', 'start'\]"),
    ("device,start,end,weight\na,0,1,2\n", r"got \['device', 'start', 'end', 'weight'\]"),
    ("device,start,end\na,-5,10\n", r"line 2: start must be a number >= 0, got '-5'"),
    ("device,start,end\na,10,10\n", r"line 2: end must be > start 10.0, got '10'"),
    ("device,start,end\na,x,10\n", r"line 2: start must be a number >= 0, got 'x'"),
    ("device,start,end\na,nan,10\n", r"start must be a number >= 0, got 'nan'"),
    ("device,start,end\na,inf,10\n", r"start must be a number >= 0, got 'inf'"),
    ("device,start,end\na,0\n", r"line 2: expected 3 values \(device,start,end\), got \['a', '0'\]"),
    ("device,start,end\n,0,1\n", r"line 2: the device id must be a non-empty string, got ''"),
    ("device,start,end,period\na,0,1,100\na,2,3,200\n", r"line 3: device 'a' has period 200.0 here but 100.0 at .*2"),
    ("device,start,end,period\na,0,1,\na,2,3,200\n", r"line 3: device 'a' has period 200.0 here but inf"),
    ("device,start,end,period\na,0,1,0\n", r"period must be a number > 0 or inf, got '0'"),
    ("device,start,end,period\na,0,150,100\n", r"line 2: device 'a': interval end '150' is after its period 100.0"),
]
AVAILABILITY_JSON_ERRORS = [
    ("", r"the file is empty"),
    ("{", r"not valid JSON"),
    ('{"devices": []}', r"holds no device"),
    ('[{"id": "a"}]', r"must be an object \{\"devices\": \[...\]\}, got \[\{'id': 'a'\}\]"),
    ('{"devices": [{"id": "a"}]}', r"device 'a': expected the keys \['id', 'active'\] .* got \['id'\]"),
    ('{"devices": [{"id": "a", "active": [], "perod": 5}]}', r"got \['active', 'id', 'perod'\]"),
    ('{"devices": [{"id": 3, "active": []}]}', r"the device id must be a non-empty string, got 3"),
    ('{"devices": [{"id": "a", "active": [[0, -1]]}]}', r"device 'a', interval 0: end must be .* got -1"),
    ('{"devices": [{"id": "a", "active": [[0, "x"]]}]}', r"interval 0: end must be .* got 'x'"),
    ('{"devices": [{"id": "a", "active": [[NaN, 1]]}]}', r"start must be a number >= 0, got nan"),
    ('{"devices": [{"id": "a", "active": [[2, 1]]}]}', r"end must be > start 2.0, got 1"),
    ('{"devices": [{"id": "a", "active": [[0, 1, 2]]}]}', r"interval 0: expected \[start, end\], got \[0, 1, 2\]"),
    ('{"devices": [{"id": "a", "active": [], "period": -1}]}', r"period must be a number > 0 or inf, got -1"),
    ('{"devices": [{"id": "a", "active": []}, {"id": "a", "active": []}]}', r"device 'a' appears twice"),
]
CAPACITY_CSV_ERRORS = [
    ("", r"the file is empty"),
    ("device,time_per_sample,bandwidth\n", r"holds no device"),
    ("device,time_per_sample\na,1\n", r"got \['device', 'time_per_sample'\]"),
    ("device,time_per_sample,bandwidth\na,0,5\n", r"line 2: time_per_sample must be a number > 0, got '0'"),
    ("device,time_per_sample,bandwidth\na,inf,5\n", r"time_per_sample must be a number > 0, got 'inf'"),
    ("device,time_per_sample,bandwidth\na,1,-5\n", r"line 2: bandwidth must be a number > 0 or inf, got '-5'"),
    ("device,time_per_sample,bandwidth\na,1,NaN\n", r"bandwidth must be a number > 0 or inf, got 'NaN'"),
    ("device,time_per_sample,bandwidth\na,1,5\na,2,5\n", r"line 3: device 'a' appears twice \(first at .*line 2\)"),
]
CAPACITY_JSON_ERRORS = [
    ("", r"the file is empty"),
    ('{"devices": [{"id": "a", "time_per_sample": true, "bandwidth": 5}]}', r"time_per_sample must be .* got True"),
    ('{"devices": [{"id": "a", "time_per_sample": "fast", "bandwidth": 5}]}', r"device 'a': time_per_sample .* 'fast'"),
    ('{"devices": [{"id": "a", "time_per_sample": 1}]}', r"expected the keys \['id', 'time_per_sample', 'bandwidth'\]"),
    (
        '{"devices": [{"id": "a", "time_per_sample": 1, "bandwidth": 0}]}',
        r"bandwidth must be a number > 0 or inf, got 0",
    ),
]


@pytest.mark.parametrize(
    ("read", "name", "text", "message"),
    [(read_availability_trace, "a.csv", t, m) for t, m in AVAILABILITY_CSV_ERRORS]
    + [(read_availability_trace, "a.json", t, m) for t, m in AVAILABILITY_JSON_ERRORS]
    + [(read_capacity_trace, "c.csv", t, m) for t, m in CAPACITY_CSV_ERRORS]
    + [(read_capacity_trace, "c.json", t, m) for t, m in CAPACITY_JSON_ERRORS],
)
def test_bad_plain_traces_name_the_file_the_place_and_the_value(tmp_path, read, name, text, message):
    path = _write(tmp_path / name, text)
    with pytest.raises(ValueError, match=message) as error:
        read(path)
    assert str(error.value).startswith(path)


@pytest.mark.parametrize("read", [read_availability_trace, read_capacity_trace])
def test_an_unknown_suffix_is_refused_naming_it_and_the_allowed_ones(tmp_path, read):
    with pytest.raises(ValueError, match=re.escape("unknown suffix '.txt'") + r".*allowed: \['.csv', '.json'\]"):
        read(_write(tmp_path / "trace.txt", "device,start,end\n"))


# -- TraceDevices -------------------------------------------------------------------------------------------------


def test_trace_devices_map_clients_to_trace_devices_cyclically(tmp_path):
    path = _write(tmp_path / "c.csv", "device,time_per_sample,bandwidth\nd0,0.5,1000\nd1,0.25,inf\n")
    model = TraceDevices(path)
    profiles = model.sample_profiles(5, np.random.default_rng(0))
    assert profiles.time_per_sample.tolist() == [0.5, 0.25, 0.5, 0.25, 0.5]
    timing = model.job_timing(profiles, 3, num_samples=8, model_bytes=500, rng=None)  # client 3 -> d1
    assert (timing.download, timing.compute, timing.upload) == (0.0, 2.0, 0.0)
    timing = model.job_timing(profiles, 4, num_samples=8, model_bytes=500, rng=None)  # client 4 -> d0
    assert (timing.download, timing.compute, timing.upload) == (0.5, 4.0, 0.5)
    doubled = TraceDevices(path, augmentation_factor=2.0)
    assert doubled.job_timing(doubled.sample_profiles(5, None), 4, 8, 500, None).compute == 8.0


def test_trace_devices_read_json_and_record_their_arguments_and_the_files_digest(tmp_path):
    text = '{"devices": [{"id": "a", "time_per_sample": 0.1, "bandwidth": 10}]}'
    path = _write(tmp_path / "c.json", text)
    model = TraceDevices(path, augmentation_factor=3.0)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]  # a changed file under the same name is told apart
    assert describe(model) == {
        "class": "TraceDevices",
        "path": path,
        "augmentation_factor": 3.0,
        "content_sha256": digest,
    }
    assert model.sample_profiles(2, None).bandwidth.tolist() == [10.0, 10.0]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"path": "no-such-file.csv"}, r"path must be an existing capacity trace file, got 'no-such-file.csv'"),
        ({"path": "trace.txt"}, r"path must be a capacity trace ending in one of .* got 'trace.txt'"),
        ({"path": 3}, r"path must be a path .* got 3"),
        ({"path": "c.csv", "augmentation_factor": 0.0}, r"augmentation_factor must be a finite number > 0|must be > 0"),
    ],
)
def test_bad_trace_device_settings_fail_at_construction(tmp_path, monkeypatch, kwargs, message):
    monkeypatch.chdir(tmp_path)
    _write(tmp_path / "c.csv", "device,time_per_sample,bandwidth\nd0,0.5,1000\n")
    with pytest.raises(ValueError, match=message):
        TraceDevices(**kwargs)


def test_a_bad_trace_fails_at_construction_naming_the_file(tmp_path):
    path = _write(tmp_path / "c.csv", "device,time_per_sample,bandwidth\nd0,-0.5,1000\n")
    with pytest.raises(ValueError, match=r"c\.csv, line 2: time_per_sample must be a number > 0, got '-0.5'"):
        TraceDevices(path)
