"""Simulated heterogeneous devices: how long a client job takes in virtual seconds.

A device model draws a profile for every client once per run (compute time per training sample and network
bandwidth), and turns a job (samples to process, bytes to move) into a :class:`~lit_asyncfl.core.update.JobTiming`.
Wall-clock time never enters: results depend only on these virtual durations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from lit_asyncfl.checks import check_finite, check_number, check_path
from lit_asyncfl.core.update import JobTiming
from lit_asyncfl.traces import file_digest, load_trace


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


class Stragglers(DeviceModel):
    r"""Heavy-tailed device speeds with a share of stragglers (the cross-device setting of the asynchronous papers).

    Each client's slowness is :math:`u_i = e^{\sigma z_i}` with :math:`z_i \sim N(0, 1)` (log-normal around the
    median device, 1), and a randomly chosen ``round(fraction * num_clients)`` of the clients are ``factor`` times
    slower again: with the defaults, 10% of the devices are about 10x slower than the median. Compute time per sample
    is multiplied and bandwidth divided by :math:`u_i`, as in :class:`UniformRatio`.

    Args:
        fraction: Share of the clients that are stragglers (0 <= fraction < 1).
        factor: How many times slower a straggler is than it would otherwise be (>= 1).
        sigma: Spread of the log-normal slowness of every device (0: all non-stragglers equal).
        time_per_sample: Virtual seconds per sample of the median device.
        bandwidth: Bytes per virtual second of the median device.

    Example:
        >>> p = Stragglers().sample_profiles(200, np.random.default_rng(0))
        >>> ratio = p.time_per_sample / np.median(p.time_per_sample)
        >>> int((ratio > 4).sum()), round(float(np.median(ratio[ratio > 4])))
        (19, 10)
    """

    def __init__(
        self,
        fraction: float = 0.1,
        factor: float = 10.0,
        sigma: float = 0.5,
        time_per_sample: float = 1.0,
        bandwidth: float = 1e5,
    ) -> None:
        check_number("fraction", fraction, 0, 1, open_max=True)
        check_number("factor", factor, 1, unit=" (straggler / ordinary device)")
        check_number("sigma", sigma, 0)
        super().__init__(time_per_sample, bandwidth)
        self.fraction, self.factor, self.sigma = fraction, factor, sigma

    def slowness(self, num_clients: int, rng: np.random.Generator) -> np.ndarray:
        slow = np.exp(self.sigma * rng.standard_normal(num_clients))
        stragglers = rng.choice(num_clients, size=round(self.fraction * num_clients), replace=False)
        slow[stragglers] *= self.factor
        return slow


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


class TraceDevices(DeviceModel):
    """Devices replayed from a capacity trace: each client computes and communicates at a measured device's speed.

    Client ``i`` gets the trace's device ``i % n`` (``n`` devices, in file order), so a small trace can drive a large
    federation (FedScale, too, assigns its clients to trace entries cyclically: its client ``c``, counted from 1,
    gets the entry whose key is ``c % n``). A job takes ``model_bytes / bandwidth`` to download and again to upload
    and ``time_per_sample * augmentation_factor * num_samples`` to compute (the base class's rule, with
    ``augmentation_factor`` folded into the profiles' ``time_per_sample``, so that schedulers estimating durations
    from the profiles see the same speeds).

    With FedScale's ``client_device_capacity`` and ``augmentation_factor=3.0`` this is FedScale's
    ``get_completion_time``: computation ``augmentation_factor * batch_size * local_steps * computation / 1000``
    seconds (here ``num_samples``, the samples a job processes, plays ``batch_size * local_steps``) and
    communication ``(upload_size + download_size) / communication`` with sizes in kbit (here download plus upload).
    Unit conversions are in :mod:`lit_asyncfl.traces`.

    Args:
        path: A capacity trace: ``.csv`` or ``.json`` (see :mod:`lit_asyncfl.traces`), or FedScale's
            ``client_device_capacity`` pickle named with the suffix ``.pkl`` or ``.pickle`` (loaded without running
            code).
        augmentation_factor: Multiplies every compute time: 1.0 for traces that time a training sample, 3.0 to
            reproduce FedScale (its traces time inference, a forward pass; a backward pass costs about twice that).

    Example:
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "capacity.csv")
        >>> _ = open(path, "w").write("device,time_per_sample,bandwidth\\nfast,0.01,1e6\\nslow,0.05,2e5\\n")
        >>> model = TraceDevices(path)
        >>> profiles = model.sample_profiles(3, np.random.default_rng(0))  # client 2 is device "fast" again
        >>> profiles.time_per_sample.tolist(), profiles.bandwidth.tolist()
        ([0.01, 0.05, 0.01], [1000000.0, 200000.0, 1000000.0])
        >>> model.job_timing(profiles, 1, num_samples=100, model_bytes=400_000, rng=None)
        JobTiming(download=2.0, compute=5.0, upload=2.0)
    """

    def __init__(self, path: str, augmentation_factor: float = 1.0) -> None:
        check_path("path", path)
        check_number("augmentation_factor", augmentation_factor, 0, open_min=True)
        trace = load_trace(path, "capacity")
        # no DeviceModel.__init__: its reference time_per_sample and bandwidth mean nothing here, and the public
        # attributes (recorded in the run's fingerprint) are the constructor's arguments only
        self.path = str(path)
        self.augmentation_factor = augmentation_factor
        #: The trace file's digest (:func:`~lit_asyncfl.traces.file_digest`), in the run's fingerprint.
        self.content_sha256 = file_digest(path)
        self._devices = trace.devices
        self._time_per_sample = trace.time_per_sample
        self._bandwidth = trace.bandwidth

    def sample_profiles(self, num_clients: int, rng: np.random.Generator) -> DeviceProfiles:
        """Client ``i``'s profile is the trace's device ``i % n``; nothing is drawn."""
        device = np.arange(num_clients) % len(self._devices)
        return DeviceProfiles(
            time_per_sample=self._time_per_sample[device] * self.augmentation_factor,
            bandwidth=self._bandwidth[device].copy(),
        )
