"""Write the small SYNTHETIC example traces bundled under ``configs/availability/`` (no real device is behind them).

Availability: 40 devices, each online in 2 to 4 sessions of 1,000 to 6,000 virtual seconds per 20,000-second
"day" (the trace repeats with that period), placed at random; about 45% of the time online on average.
Capacity: compute seconds per sample log-normal around 1 s (the digits jobs of the quickstart take tens of seconds)
and bandwidths log-uniform between 50 kB/s and 1 MB/s. Seeded: running it again writes the same files.

    python scripts/make_example_trace.py [--out configs/availability]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from lit_asyncfl.traces import AvailabilityTrace, CapacityTrace, write_availability_trace, write_capacity_trace

DEVICES, PERIOD, SEED = 40, 20_000.0, 2026


def merged(rows: np.ndarray) -> np.ndarray:
    """Sorted intervals with overlapping ones joined (so that the file lists each session once)."""
    out = [list(rows[0])]
    for start, end in rows[1:]:
        if start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return np.asarray(out)


def availability_trace(rng: np.random.Generator) -> AvailabilityTrace:
    """Random sessions per device within one period (overlapping ones joined)."""
    intervals = []
    for _ in range(DEVICES):
        sessions = int(rng.integers(2, 5))
        lengths = rng.uniform(1_000.0, 6_000.0, size=sessions)
        starts = rng.uniform(0.0, PERIOD - lengths)
        rows = np.round(np.column_stack([starts, starts + lengths]), 1)
        intervals.append(merged(rows[np.argsort(rows[:, 0])]))
    return AvailabilityTrace(
        devices=[f"device-{i:02d}" for i in range(DEVICES)], intervals=intervals, period=np.full(DEVICES, PERIOD)
    )


def capacity_trace(rng: np.random.Generator) -> CapacityTrace:
    return CapacityTrace(
        devices=[f"device-{i:02d}" for i in range(DEVICES)],
        time_per_sample=np.round(rng.lognormal(0.0, 0.5, size=DEVICES), 3),
        bandwidth=np.round(np.exp(rng.uniform(np.log(5e4), np.log(1e6), size=DEVICES))),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="configs/availability", help="directory to write the two CSV files into")
    out = Path(parser.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    write_availability_trace(availability_trace(rng), out / "example_availability.csv")
    write_capacity_trace(capacity_trace(rng), out / "example_capacity.csv")
    print(f"wrote {out}/example_availability.csv and {out}/example_capacity.csv (synthetic)")


if __name__ == "__main__":
    main()
