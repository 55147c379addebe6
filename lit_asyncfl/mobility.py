"""ASFL's mobile edge network: devices moving among base stations, with per-round bandwidths.

Compute capability is drawn once per device (:math:`g_i \\sim \\mathrm{Exp}(1)`, as
:class:`~lit_asyncfl.devices.ExponentialCapability`); positions change every round, and a device's bandwidth in a round
depends on its distance to the nearest base station (:func:`~lit_asyncfl.functional.asfl.bandwidth_from_distance`).
Round-based schedulers (:class:`~lit_asyncfl.schedulers.SemiAsyncRounds`) own the positions and ask this model for
bandwidths and latencies; other schedulers see each device at its initial bandwidth.
"""

from __future__ import annotations

import math

import numpy as np

from lit_asyncfl.checks import check_int, check_number, check_ordered
from lit_asyncfl.devices import DeviceProfiles, ExponentialCapability
from lit_asyncfl.functional.asfl import bandwidth_from_distance


class MobileEdgeDevices(ExponentialCapability):
    r"""Mobile devices in a square area served by ``num_stations`` base stations on a regular grid (ASFL Sec. 3).

    Each round, every device takes a step of length :math:`U(0, \text{speed})` in a uniformly random direction
    (reflected at the borders) and connects to its nearest station; its bandwidth is :math:`b_i^k \in`
    ``[min_bandwidth, max_bandwidth]``, inversely proportional to that distance. The server sends the global model
    at ``server_bandwidth``. Bandwidths are in model-size units per virtual second (the paper: 1250 for the server,
    0.125-0.3 for devices, i.e. MB/s); ``model_size`` is the size of one model in those units (``None``: the model's
    bytes / 1e6, i.e. MB).

    Args:
        num_stations: Number of base stations :math:`P` (placed on a ``ceil(sqrt(P))``-wide grid).
        area: Side of the square area (metres).
        coverage: Distance at which a station gives the lowest bandwidth (``None``: half a grid cell's diagonal).
        speed: Largest distance a device moves in one round.
        server_bandwidth: Server bandwidth :math:`b_s`.
        min_bandwidth: Lowest device bandwidth.
        max_bandwidth: Highest device bandwidth.
        model_size: Model size :math:`G = \Gamma` in bandwidth units (``None``: bytes / 1e6).
        mean: Mean compute capability :math:`g_i` (samples per ``time_per_sample`` virtual seconds).
        min_capability: Lower clip of the capability.
        time_per_sample: Virtual seconds per sample at capability 1.

    Example:
        >>> net = MobileEdgeDevices(num_stations=4, area=1000.0)
        >>> net.stations.tolist()
        [[250.0, 250.0], [750.0, 250.0], [250.0, 750.0], [750.0, 750.0]]
        >>> net.bandwidths(np.array([[250.0, 250.0], [500.0, 500.0]])).round(3).tolist()
        [0.3, 0.125]
    """

    def __init__(
        self,
        num_stations: int = 4,
        area: float = 1000.0,
        coverage: float | None = None,
        speed: float = 100.0,
        server_bandwidth: float = 1250.0,
        min_bandwidth: float = 0.125,
        max_bandwidth: float = 0.3,
        model_size: float | None = None,
        mean: float = 1.0,
        min_capability: float = 0.05,
        time_per_sample: float = 1.0,
    ) -> None:
        check_int("num_stations", num_stations, 1)
        check_number("area", area, 0, open_min=True, unit=" metres")
        check_number("coverage", coverage, 0, open_min=True, optional=True)
        check_number("speed", speed, 0)
        check_number("server_bandwidth", server_bandwidth, 0, open_min=True)
        check_number("min_bandwidth", min_bandwidth, 0, open_min=True)
        check_number("max_bandwidth", max_bandwidth, 0, open_min=True)
        check_ordered("min_bandwidth", min_bandwidth, "max_bandwidth", max_bandwidth)
        check_number("model_size", model_size, 0, open_min=True, optional=True)
        super().__init__(mean, min_capability, time_per_sample, bandwidth=max_bandwidth)
        self.num_stations = num_stations
        self.area = area
        self.speed = speed
        self.server_bandwidth = server_bandwidth
        self.min_bandwidth = min_bandwidth
        self.max_bandwidth = max_bandwidth
        self.model_size = model_size
        side = math.ceil(math.sqrt(num_stations))
        cell = area / side
        self.coverage = coverage if coverage is not None else cell * math.sqrt(2) / 2
        grid = [((i % side + 0.5) * cell, (i // side + 0.5) * cell) for i in range(num_stations)]
        self.stations = np.asarray(grid, dtype=np.float64)

    def size_of(self, model_bytes: int) -> float:
        """Model size in bandwidth units."""
        return self.model_size if self.model_size is not None else model_bytes / 1e6

    def initial_positions(self, num_clients: int, rng: np.random.Generator) -> np.ndarray:
        """Positions drawn uniformly over the area, shape ``(num_clients, 2)``."""
        return rng.uniform(0.0, self.area, size=(num_clients, 2))

    def move(self, positions: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """One round of movement: a random direction, a distance in ``[0, speed]``, reflected at the borders."""
        angle = rng.uniform(0.0, 2 * math.pi, size=len(positions))
        step = rng.uniform(0.0, self.speed, size=len(positions))
        moved = positions + step[:, None] * np.stack([np.cos(angle), np.sin(angle)], axis=1)
        period = 2 * self.area  # reflect: fold onto [0, 2 area) then mirror the upper half
        folded = np.mod(moved, period)
        return np.where(folded > self.area, period - folded, folded)

    def bandwidths(self, positions: np.ndarray) -> np.ndarray:
        """Each device's bandwidth from its distance to the nearest station."""
        distance = np.linalg.norm(positions[:, None, :] - self.stations[None, :, :], axis=2).min(axis=1)
        return bandwidth_from_distance(distance, self.coverage, self.min_bandwidth, self.max_bandwidth)

    def sample_profiles(self, num_clients: int, rng: np.random.Generator) -> DeviceProfiles:
        """Capabilities (as seconds per sample) and the bandwidth at a uniformly drawn initial position."""
        profiles = super().sample_profiles(num_clients, rng)
        bandwidth = self.bandwidths(self.initial_positions(num_clients, rng))
        return DeviceProfiles(time_per_sample=profiles.time_per_sample, bandwidth=bandwidth * 1e6)
