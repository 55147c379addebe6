"""Simulated heterogeneous devices: how long a client job takes in virtual seconds.

A device model draws a profile for every client once per run (compute time per training sample and network
bandwidth), and turns a job (samples to process, bytes to move) into a :class:`~lit_asyncfl.core.update.JobTiming`.
Wall-clock time never enters: results depend only on these virtual durations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from lit_asyncfl.checks import check_finite, check_number
from lit_asyncfl.core.update import JobTiming


@dataclass
class DeviceProfiles:
    """Per-client device properties, as arrays indexed by client.

    Args:
        time_per_sample: Virtual seconds to process one training sample once (forward and backward).
        bandwidth: Bytes per virtual second, used for both download and upload.
    """

    time_per_sample: np.ndarray
    bandwidth: np.ndarray


class DeviceModel:
    """Base class: identical devices with ``time_per_sample`` and ``bandwidth``.

    Subclasses change :meth:`sample_profiles` (heterogeneity across devices) or :meth:`job_timing` (randomness per
    job).

    Args:
        time_per_sample: Virtual seconds per training sample for a reference device.
        bandwidth: Bytes per virtual second of a reference device (``math.inf`` makes communication free).

    Example:
        >>> model = DeviceModel(time_per_sample=0.5, bandwidth=1000)
        >>> profiles = model.sample_profiles(2, np.random.default_rng(0))
        >>> model.job_timing(profiles, 0, num_samples=10, model_bytes=500, rng=None)
        JobTiming(download=0.5, compute=5.0, upload=0.5)
    """

    def __init__(self, time_per_sample: float = 1.0, bandwidth: float = 1e5) -> None:
        check_number("time_per_sample", time_per_sample, 0, open_min=True)
        check_number("bandwidth", bandwidth, 0, open_min=True, finite=False)  # inf: free communication
        self.time_per_sample = time_per_sample
        self.bandwidth = bandwidth

    def slowness(self, num_clients: int, rng: np.random.Generator) -> np.ndarray:
        """Per-client slowness factor (1 = reference device); constant here."""
        return np.ones(num_clients)

    def sample_profiles(self, num_clients: int, rng: np.random.Generator) -> DeviceProfiles:
        """Draw every client's profile."""
        slow = self.slowness(num_clients, rng)
        return DeviceProfiles(time_per_sample=self.time_per_sample * slow, bandwidth=self.bandwidth / slow)

    def job_timing(
        self,
        profiles: DeviceProfiles,
        client: int,
        num_samples: int,
        model_bytes: int,
        rng: np.random.Generator | None,
    ) -> JobTiming:
        """Durations of a job that processes ``num_samples`` samples and moves ``model_bytes`` each way."""
        bandwidth = float(profiles.bandwidth[client])
        comm = 0.0 if math.isinf(bandwidth) else model_bytes / bandwidth
        return JobTiming(download=comm, compute=float(profiles.time_per_sample[client]) * num_samples, upload=comm)


class UniformRatio(DeviceModel):
    r"""Devices whose slowness is uniform between 1 and ``ratio`` (FedASMU: the slowest 5x the fastest).

    Each client draws :math:`u_i \sim U(1, \text{ratio})`; its compute time per sample is multiplied and its
    bandwidth divided by :math:`u_i`.

    Args:
        ratio: Slowest-to-fastest ratio (>= 1).
        time_per_sample: Virtual seconds per sample of the fastest device.
        bandwidth: Bytes per virtual second of the fastest device.

    Example:
        >>> p = UniformRatio(ratio=5).sample_profiles(1000, np.random.default_rng(0))
        >>> bool(p.time_per_sample.min() >= 1.0 and p.time_per_sample.max() <= 5.0)
        True
    """

    def __init__(self, ratio: float = 5.0, time_per_sample: float = 1.0, bandwidth: float = 1e5) -> None:
        check_number("ratio", ratio, 1, unit=" (slowest / fastest)")
        super().__init__(time_per_sample, bandwidth)
        self.ratio = ratio

    def slowness(self, num_clients: int, rng: np.random.Generator) -> np.ndarray:
        return rng.uniform(1.0, self.ratio, size=num_clients)


class ExponentialCapability(DeviceModel):
    r"""Compute capability :math:`g_i \sim \mathrm{Exp}(\text{mean})` (ASFL), clipped below at ``min_capability``.

    Compute time per sample is ``time_per_sample / g_i``; bandwidth is the same for all devices.

    Args:
        mean: Mean capability.
        min_capability: Lower clip, so that no device is infinitely slow.
        time_per_sample: Virtual seconds per sample at capability 1.
        bandwidth: Bytes per virtual second.

    Example:
        >>> p = ExponentialCapability().sample_profiles(3, np.random.default_rng(0))
        >>> p.time_per_sample.shape
        (3,)
    """

    def __init__(
        self,
        mean: float = 1.0,
        min_capability: float = 0.05,
        time_per_sample: float = 1.0,
        bandwidth: float = 1e5,
    ) -> None:
        check_number("mean", mean, 0, open_min=True)
        check_number("min_capability", min_capability, 0, open_min=True)
        super().__init__(time_per_sample, bandwidth)
        self.mean = mean
        self.min_capability = min_capability

    def sample_profiles(self, num_clients: int, rng: np.random.Generator) -> DeviceProfiles:
        capability = np.maximum(rng.exponential(self.mean, size=num_clients), self.min_capability)
        return DeviceProfiles(
            time_per_sample=self.time_per_sample / capability, bandwidth=np.full(num_clients, self.bandwidth)
        )


class UniformResponse(DeviceModel):
    """Each job's compute time drawn afresh from ``U(low, high)`` virtual seconds (FedADT: ``U(0, 5000)``).

    Communication time comes from ``bandwidth`` (free by default, so the response time is the whole duration).

    Args:
        low: Shortest compute time.
        high: Longest compute time.
        bandwidth: Bytes per virtual second (``math.inf``: communication takes no time).

    Example:
        >>> m = UniformResponse(low=0, high=5000)
        >>> p = m.sample_profiles(2, np.random.default_rng(0))
        >>> t = m.job_timing(p, 1, 100, 1000, np.random.default_rng(1))
        >>> 0 <= t.compute <= 5000 and t.download == 0.0
        True
    """

    def __init__(self, low: float = 0.0, high: float = 5000.0, bandwidth: float = math.inf) -> None:
        check_finite("low", low)
        check_finite("high", high)
        super().__init__(time_per_sample=1.0, bandwidth=bandwidth)
        if low < 0 or not high >= low or not 0 < high < math.inf:
            raise ValueError(f"need 0 <= low <= high, 0 < high < inf, got low={low}, high={high}")
        self.low, self.high = low, high

    def job_timing(
        self,
        profiles: DeviceProfiles,
        client: int,
        num_samples: int,
        model_bytes: int,
        rng: np.random.Generator | None,
    ) -> JobTiming:
        timing = super().job_timing(profiles, client, num_samples, model_bytes, rng)
        assert rng is not None, "UniformResponse draws a compute time per job and needs the simulator's rng"
        return JobTiming(timing.download, float(rng.uniform(self.low, self.high)), timing.upload)
