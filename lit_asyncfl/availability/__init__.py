"""Availability models: when each simulated device is online (``FederatedTrainer(availability=...)``).

A device that is offline cannot be dispatched; one that goes offline while its job is in flight drops the job (the
update never arrives; the summary counts it under ``updates_dropped`` / ``drop_reasons["offline"]``). Every model
may also crash jobs at random (``crash_probability``, counted under ``"crash"``).

- :class:`AlwaysAvailable`: every device, all the time (the default).
- :class:`Bernoulli`: each device online with probability ``p``, re-drawn per slot; decides dispatches only.
- :class:`MarkovOnOff`: on/off periods of exponential lengths per device.
- :class:`Diurnal`: a daily sinusoid with a phase per device.
- :class:`TraceAvailability`: replayed from a trace of active intervals (plain CSV/JSON, or FedScale's).
"""

from lit_asyncfl.availability.base import AlwaysAvailable, Availability
from lit_asyncfl.availability.markov import MarkovOnOff
from lit_asyncfl.availability.prediction import SessionPredictor
from lit_asyncfl.availability.slots import Bernoulli, Diurnal, SlotAvailability
from lit_asyncfl.availability.trace import TraceAvailability

__all__ = [
    "AlwaysAvailable",
    "Availability",
    "Bernoulli",
    "Diurnal",
    "MarkovOnOff",
    "SessionPredictor",
    "SlotAvailability",
    "TraceAvailability",
]
