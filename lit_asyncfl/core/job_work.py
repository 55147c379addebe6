"""How much work a client job is: samples processed by its local steps, and the run's device profiles."""

from __future__ import annotations

import numpy as np

from lit_asyncfl.data.shards import steps_per_epoch
from lit_asyncfl.devices import DeviceModel, DeviceProfiles


def samples_before_step(num_samples: int, batch_size: int, step: int, drop_last: bool = False) -> int:
    """Training samples processed by the first ``step`` local steps (epochs of :func:`steps_per_epoch` steps).

    Example:
        >>> samples_before_step(25, 10, 3), samples_before_step(25, 10, 4), samples_before_step(25, 10, 6)
        (25, 35, 50)
        >>> samples_before_step(25, 10, 3, drop_last=True)  # epochs of 2 steps, 20 samples
        30
    """
    per_epoch = steps_per_epoch(num_samples, batch_size, drop_last)
    epoch_samples = per_epoch * batch_size if drop_last else num_samples
    epochs, within = divmod(step, per_epoch)
    return epochs * epoch_samples + min(within * batch_size, num_samples)


def sample_profiles(device_model: DeviceModel, num_clients: int, seed: int) -> DeviceProfiles:
    """The run's device profiles: drawn from a stream of their own, so partitions may depend on them."""
    return device_model.sample_profiles(num_clients, np.random.default_rng([seed, 0xDE71CE]))
