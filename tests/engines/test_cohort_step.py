"""The cohort engine's batched step with user code that cannot take the routed kernels' output: a module that
flattens with ``x.view(x.size(0), -1)`` (a view of a channels-last convolution or pooling output is impossible)
trains unrouted, with the ``fast`` engine's results, instead of failing (or, with ``on_client_error="drop"``,
silently losing its jobs)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lit_asyncfl.core.update import ClientJob, JobTiming
from lit_asyncfl.data import ClientShards, DigitsDataModule
from lit_asyncfl.engines import CohortEngine
from lit_asyncfl.engines.fast import FastEngine
from lit_asyncfl.models import LeNet5

pytestmark = pytest.mark.usefixtures("one_thread")


class ViewLeNet(LeNet5):
    """LeNet-5 flattening its features with the classic ``x.view(x.size(0), -1)`` (``view_flatten``) instead of
    ``nn.Flatten`` (a reshape)."""

    view_flatten = True

    def forward(self, x):
        *features, _ = list(self.net[0])
        for layer in features:
            x = layer(x)
        x = x.view(x.size(0), -1) if self.view_flatten else x.reshape(x.size(0), -1)
        for layer in list(self.net)[1:]:
            x = layer(x)
        return x


@pytest.fixture(scope="module")
def shards():
    """Dirichlet shards in float64: unequal sizes (padded steps), and the cohort equals fast to rounding."""
    dm = DigitsDataModule(partition="dirichlet", alpha=0.5, batch_size=10)
    dm.setup("fit")
    s = dm.client_shards(12, seed=0)
    return ClientShards(s.inputs.double(), s.targets, [i.numpy() for i in s.indices])


def train_both(model, shards):
    """The 12 clients' jobs of one epoch under the cohort (every step batched) and under fast: both engines and
    the updates."""
    fast, cohort = FastEngine(model, shards, 10), CohortEngine(model, shards, 10)
    cohort.min_batched = 1
    jobs = [ClientJob(c, c, 0, 0.0, JobTiming(0, 0, 0), 20 + c, 1) for c in range(12)]
    start = fast.flat.read()
    updates = cohort.train_many(jobs, [start] * len(jobs))
    for job, update in zip(jobs, updates):
        expected = fast.train(job, start)
        assert update.num_steps == expected.num_steps
        torch.testing.assert_close(update.weights, expected.weights, rtol=0, atol=1e-12)
    return cohort, updates


def test_a_view_flatten_is_found_at_construction_and_trains_unrouted_like_fast(shards, caplog):
    torch.manual_seed(0)
    model = ViewLeNet(lr=0.05).double()
    built = CohortEngine(model, shards, 10)  # the probe finds it before any job
    assert "RuntimeError" in built.kernels_off_because and "view" in built.kernels_off_because
    assert not built.batched.kernels.routed
    assert "runs without its batched kernels" in caplog.text  # said, not only kept in an attribute
    cohort, _ = train_both(model, shards)
    assert cohort.no_padding_because is None  # padded steps, the probe's second case
    assert "RuntimeError" in cohort.kernels_off_because and "view" in cohort.kernels_off_because
    assert not cohort.batched.kernels.routed  # nothing routed, the probe's calls included


def test_a_routed_step_that_raises_is_redone_unrouted_and_routing_stays_off(shards):
    """A module that takes the routed output at construction and not later (here: switched to ``.view``): the
    step that raises is redone without the kernels, and every later step runs without them."""
    torch.manual_seed(0)
    model = ViewLeNet(lr=0.05).double()
    model.view_flatten = False
    fast, cohort = FastEngine(model, shards, 10), CohortEngine(model, shards, 10)
    assert cohort.kernels_off_because is None  # the reshape takes the routed output
    cohort.min_batched, cohort.module.view_flatten = 1, True
    jobs = [ClientJob(c, c, 0, 0.0, JobTiming(0, 0, 0), 20 + c, 1) for c in range(12)]
    start = fast.flat.read()
    updates = cohort.train_many(jobs, [start] * len(jobs))
    assert "view" in cohort.kernels_off_because and not cohort.batched.kernels.routed
    fast.module.view_flatten = True
    for job, update in zip(jobs, updates):
        torch.testing.assert_close(update.weights, fast.train(job, start).weights, rtol=0, atol=1e-12)


def test_an_error_of_the_module_itself_surfaces_and_routing_stays_on(shards):
    """What the unrouted step raises too is the module's own error: raised as it is, the kernels kept."""
    torch.manual_seed(0)
    model = ViewLeNet(lr=0.05).double()
    model.view_flatten = False
    cohort = CohortEngine(model, shards, 10)
    cohort.min_batched = 1
    assert cohort.kernels_off_because is None
    cohort.module.training_step = lambda batch, batch_idx: 1 / 0
    jobs = [ClientJob(c, c, 0, 0.0, JobTiming(0, 0, 0), c, 1) for c in range(3)]
    with pytest.raises(ZeroDivisionError):
        cohort.train_many(jobs, [cohort.flat.read()] * 3)
    assert cohort.kernels_off_because is None


def test_routing_is_on_for_lenet_and_the_probe_leaves_no_count(shards):
    cohort = CohortEngine(LeNet5(lr=0.05).double(), shards, 10)
    assert cohort.kernels_off_because is None and not cohort.batched.kernels.routed


class NoisyViewLeNet(ViewLeNet):
    """``ViewLeNet`` whose loss is scaled by a NumPy draw: a redone step must draw what it would have drawn."""

    def training_step(self, batch, batch_idx):
        scale = 1.0 + 0.1 * float(np.random.rand())  # drawn before the forward that raises on the routed output
        return super().training_step(batch, batch_idx) * scale


def test_a_redone_step_draws_what_a_step_without_the_kernels_draws(shards):
    """The redo rewinds every global generator a step draws from (torch's, Python's and NumPy's): a run whose
    first routed step raises gives bit for bit the weights of a run without the kernels from the start."""
    torch.manual_seed(0)
    model = NoisyViewLeNet(lr=0.05).double()
    model.view_flatten = False
    jobs = [ClientJob(c, c, 0, 0.0, JobTiming(0, 0, 0), 20 + c, 1) for c in range(6)]
    results = []
    for kernels_off in (False, True):
        cohort = CohortEngine(model, shards, 10)
        assert cohort.kernels_off_because is None
        if kernels_off:
            cohort.batched.kernels_off_because = "off from the start (the reference)"
        cohort.min_batched, cohort.module.view_flatten = 1, True
        start = cohort.flat.read()
        results.append([u.weights for u in cohort.train_many(jobs, [start] * len(jobs))])
        if not kernels_off:
            assert "view" in cohort.kernels_off_because  # the first routed step raised and was redone
    for redone, reference in zip(*results):
        assert torch.equal(redone, reference)


class TiedNet(LeNet5):
    """LeNet-5 whose second hidden layer reuses the first's weight (a tied parameter, two names for one tensor)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.square = torch.nn.Linear(64, 64)
        self.square2 = torch.nn.Linear(64, 64)
        self.square2.weight = self.square.weight

    def forward(self, x):
        x = self.net[0](x)
        x = self.square2(torch.relu(self.square(x))).relu()
        for layer in list(self.net)[1:]:
            x = layer(x)
        return x


def test_a_tied_parameter_is_bound_under_every_name_like_fast(shards):
    """The batched step binds each job's weights in place of the module's (as functional_call): a tied parameter
    under both of its names, or one layer would train on the module's own weights (not the job's)."""
    torch.manual_seed(0)
    cohort, _ = train_both(TiedNet(lr=0.05).double(), shards)
    assert cohort.kernels_off_because is None and cohort.batched.kernels.routed["linear"]
