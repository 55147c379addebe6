"""When a simulated device is online: every availability model is a timeline of on/off switches per device.

A model describes each device by whether it is online at virtual time 0 and the sorted times at which it switches
state afterwards. The timeline is a pure function of the run seed and the model's arguments (drawn lazily, in
blocks, from a random stream of the device's own), so a resumed run sees exactly the timeline the interrupted one
saw, whatever order the simulator asked its questions in. The simulator asks four questions: which devices are
online now (:meth:`Availability.online`), when an online device next goes offline (:meth:`~Availability.next_offline`,
which drops its job in flight), when offline devices come back (:meth:`~Availability.next_online`) and how long a
device was online (:meth:`~Availability.online_time`, for the summary).
"""

from __future__ import annotations

import math

import numpy as np

from lit_asyncfl.checks import check_fraction

#: How far, in first horizons of a model (:meth:`Availability._horizon`), the next switch of a device is searched for:
#: a device that keeps its state that long (e.g. ``Bernoulli(p=0.999999)``) is taken to keep it for good. The limit is
#: a time, not a number of tries, so the answer never depends on how far a timeline had been drawn before.
SEARCH_HORIZONS = 1024
#: Salt of the streams availability models draw from (never shared with the simulator's own streams).
AVAILABILITY_STREAM = 0xA7A11
_EMPTY = np.empty(0, dtype=np.float64)


class Availability:
    """Base class of availability models: the machinery of per-device on/off timelines.

    A subclass draws per-device parameters in :meth:`_setup` and writes one device's timeline in :meth:`_timeline`;
    everything else (caching, the vectorised "who is online now", next switches, online time) is here.

    Args:
        crash_probability: Probability that a job crashes for a reason availability does not model (the app is
            killed, the battery dies): the job is dropped at a time drawn uniformly over its duration and counted
            under ``"crash"``. Drawn per job from a stream keyed by the job, so it never changes other draws.

    Attributes:
        interrupts: Whether a device going offline drops its job in flight (``False``: availability only decides
            who may be dispatched, as with per-dispatch availability).
    """

    interrupts = True

    def __init__(self, crash_probability: float = 0.0) -> None:
        check_fraction("crash_probability", crash_probability, open_max=True)
        self.crash_probability = crash_probability
        self._num_clients = 0
        self._seed = 0
        self._initial = np.zeros(0, dtype=bool)
        self._switches: list[np.ndarray] = []
        self._covered = np.zeros(0)
        # cursor: the state of every device at time ``_cursor_time`` (a simulation only moves forward in time)
        self._cursor_time = -math.inf
        self._count = np.zeros(0, dtype=np.int64)  # switches at or before the cursor, per device
        self._next = np.zeros(0)  # each device's first switch after the cursor (inf: none within the search)
        self._due = np.zeros(0)  # when the cursor must look at a device again

    # -- what a subclass writes -------------------------------------------------------------------------------------
    def _setup(self, rng: np.random.Generator) -> None:
        """Draw per-device parameters for ``self.num_clients`` devices from the model's stream."""

    def _timeline(self, client: int, until: float) -> tuple[bool, np.ndarray, float]:
        """Device ``client``'s timeline over at least ``[0, until]``: whether it is online at time 0, the sorted
        switch times ``> 0``, and up to when the switches given are complete (``>= until``; ``inf`` when there is
        no switch after the last one given). The switches up to ``until`` must not depend on ``until``. The
        default: always online."""
        return True, _EMPTY, math.inf

    def _horizon(self) -> float:
        """How far a first timeline reaches (virtual seconds); later ones double it."""
        return 1.0

    # -- setup ------------------------------------------------------------------------------------------------------
    @property
    def num_clients(self) -> int:
        """Number of devices (set by :meth:`setup`)."""
        return self._num_clients

    @property
    def seed(self) -> int:
        """The run seed (set by :meth:`setup`)."""
        return self._seed

    def setup(self, num_clients: int, seed: int) -> None:
        """Prepare ``num_clients`` devices for a run with ``seed`` (drops any timeline of an earlier run)."""
        self._num_clients, self._seed = int(num_clients), int(seed)
        self._setup(np.random.default_rng([self._seed, AVAILABILITY_STREAM]))
        self._initial = np.zeros(num_clients, dtype=bool)
        self._switches = [_EMPTY] * num_clients
        self._covered = np.full(num_clients, -math.inf)
        self._cursor_time = -math.inf
        self._count = np.zeros(num_clients, dtype=np.int64)
        self._next = np.full(num_clients, math.inf)
        self._due = np.full(num_clients, -math.inf)  # the first cursor move reads every timeline

    def device_rng(self, client: int) -> np.random.Generator:
        """The random stream of one device's timeline (a subclass draws its blocks from it, in order)."""
        return np.random.default_rng([self._seed, AVAILABILITY_STREAM, 1, int(client)])

    def _ensure(self, client: int, time: float) -> np.ndarray:
        """Device ``client``'s switch times, complete over at least ``[0, time]`` (those a subclass gives beyond its
        ``covered`` time are left out: they may not be final)."""
        if self._covered[client] <= time:
            horizon = max(self._horizon(), 2.0 * max(float(self._covered[client]), 0.0), 2.0 * time)
            initial, switches, covered = self._timeline(client, horizon)
            switches = np.asarray(switches, dtype=np.float64)
            self._initial[client] = initial
            self._switches[client] = switches[switches <= covered]
            self._covered[client] = covered
        return self._switches[client]

    def _locate(self, client: int, time: float) -> tuple[int, float, float]:
        """How many of the device's switches happen at or before ``time``; when the next one happens (``inf``: none
        up to the search's end); and where the search ended (``max(time, SEARCH_HORIZONS first horizons)``). The
        answers depend on the timeline and ``time`` only, never on how far the timeline had been drawn."""
        switches = self._ensure(client, time)
        count = int(np.searchsorted(switches, time, side="right"))
        end = max(SEARCH_HORIZONS * self._horizon(), time)
        while count == len(switches) and self._covered[client] < end:  # the next switch lies further out
            switches = self._ensure(client, min(2.0 * max(float(self._covered[client]), 1.0), end))
        following = float(switches[count]) if count < len(switches) else math.inf
        return count, following if following <= end else math.inf, end

    # -- the questions the simulator asks -------------------------------------------------------------------------
    def is_online(self, client: int, time: float) -> bool:
        """Whether device ``client`` is online at virtual ``time`` (states hold from a switch on: right-continuous)."""
        count = self._locate(client, time)[0]
        return bool(self._initial[client]) != bool(count % 2)

    def online(self, time: float) -> np.ndarray:
        """Which devices are online at virtual ``time`` (a boolean array over devices).

        Example:
            >>> a = AlwaysAvailable()
            >>> a.setup(3, seed=0)
            >>> a.online(10.0).tolist()
            [True, True, True]
        """
        if time < self._cursor_time:  # a look back (a plot, a test): per device
            return np.array([self.is_online(c, time) for c in range(self._num_clients)], dtype=bool)
        for client in np.flatnonzero(self._due <= time):
            count, following, end = self._locate(int(client), time)
            self._count[client], self._next[client] = count, following
            self._due[client] = min(following, end)  # (no switch up to the search's end: look again from there)
        self._cursor_time = time
        return self._initial != (self._count % 2 == 1)

    def next_offline(self, client: int, time: float) -> float:
        """When device ``client``, online at ``time``, next goes offline (``inf``: never, or the model never
        interrupts a job)."""
        if not self.interrupts:
            return math.inf
        return self._locate(client, time)[1]

    def next_online(self, clients: np.ndarray, time: float) -> float:
        """The earliest time at or after ``time`` at which one of ``clients`` is online (``inf``: never)."""
        clients = np.asarray(clients, dtype=np.int64)
        if len(clients) == 0:
            return math.inf
        online = self.online(time)
        if online[clients].any():
            return time
        if time == self._cursor_time:  # the cursor knows every device's next switch: back online then
            return float(self._next[clients].min())
        return min(self._locate(int(c), time)[1] for c in clients)

    def online_time(self, client: int, end: float) -> float:
        """Virtual seconds device ``client`` was online in ``[0, end]``.

        Example:
            >>> a = AlwaysAvailable()
            >>> a.setup(1, seed=0)
            >>> a.online_time(0, 50.0)
            50.0
        """
        switches = self._ensure(client, end)
        edges = np.concatenate([[0.0], switches[switches < end], [end]])
        lengths = np.diff(edges)
        first = 0 if self._initial[client] else 1  # the segments online: every other one
        return float(lengths[first::2].sum())

    def online_fraction(self, end: float) -> float:
        """Mean fraction of devices online over ``[0, end]`` (1.0 for ``end <= 0``)."""
        if end <= 0 or self._num_clients == 0:
            return 1.0
        return float(np.mean([self.online_time(c, end) for c in range(self._num_clients)]) / end)

    def online_counts(self, times: np.ndarray) -> np.ndarray:
        """Number of devices online at each of ``times`` (any order)."""
        times = np.asarray(times, dtype=np.float64)
        counts = np.zeros(len(times), dtype=np.int64)
        end = float(times.max()) if len(times) else 0.0
        for client in range(self._num_clients):
            switches = self._ensure(client, end)
            count = np.searchsorted(switches, times, side="right")
            counts += (count % 2 == 1) != bool(self._initial[client])
        return counts

    # -- description --------------------------------------------------------------------------------------------------
    @property
    def always_online(self) -> bool:
        """Whether every device is online at all times and no job crashes (today's behaviour, nothing to report)."""
        return False

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({args})"


class AlwaysAvailable(Availability):
    """Every device is online all the time (the default: results are those of a run without availability).

    Args:
        crash_probability: Probability that a job crashes (see :class:`Availability`).

    Example:
        >>> a = AlwaysAvailable()
        >>> a.setup(2, seed=0)
        >>> a.online(1e9).tolist(), a.next_offline(0, 5.0)
        ([True, True], inf)
    """

    @property
    def always_online(self) -> bool:
        return self.crash_probability == 0

    def setup(self, num_clients: int, seed: int) -> None:
        super().setup(num_clients, seed)
        self._everyone = np.ones(num_clients, dtype=bool)
        self._everyone.flags.writeable = False  # one array for every question (the simulator asks per dispatch)

    def online(self, time: float) -> np.ndarray:
        return self._everyone

    def next_offline(self, client: int, time: float) -> float:
        return math.inf

    def online_fraction(self, end: float) -> float:
        return 1.0
