"""Buffers (BatchNorm running statistics) are averaged, never stepped, under every aggregator and server step.

Each case is checked against a hand computation: a model of 3 parameters and 2 floating buffers receives a fresh
update (client 0, from the current version 1) and a stale one (client 1, from version 0, whose buffers differed),
chosen so that stepping the buffers with the aggregator's rule gives other values than averaging them.
"""

from __future__ import annotations

import builders
import pytest
import torch
from builders import BatchNormNet, DoubleClientZero
from conftest import make_trainer

from lit_asyncfl.algorithms import FADAS, FedAvgM, FedBuff
from lit_asyncfl.core.server import Server
from lit_asyncfl.core.update import ClientUpdate
from lit_asyncfl.data import DigitsDataModule
from lit_asyncfl.server import (
    AdaptiveServerOptimizer,
    Aggregator,
    CalibratedDeltaAverage,
    DeltaAverage,
    DynamicCorrection,
    DynamicStalenessWeight,
    Mixing,
    ModelAverage,
    NormAmplification,
    ServerCallback,
    ServerMomentum,
    SimilarityStalenessWeight,
    SlidingWindowAverage,
)
from lit_asyncfl.server.grouped import GroupedDeltaStep
from lit_asyncfl.server.stale_aware import StaleAwareAverage
from lit_asyncfl.server.two_stage import TwoStageWeightedStep

N_PARAMS = 3
OLD = torch.tensor([0.5, -1.0, 2.0, 0.0, 1.0])  # version 0: params, then running mean and variance
CURRENT = torch.tensor([1.0, -1.5, 2.5, 0.2, 0.9])  # version 1
UPLOADS = {  # client: (weights, base weights, base version)
    0: (torch.tensor([1.5, -1.0, 2.0, 0.6, 0.5]), CURRENT, 1),
    1: (torch.tensor([0.0, -2.0, 3.0, -0.4, 2.5]), OLD, 0),
}
MEAN = torch.tensor([0.1, 1.5])  # (0.6 - 0.4) / 2, (0.5 + 2.5) / 2


def make_update(client: int, width: int | None = None) -> ClientUpdate:
    weights, base, version = UPLOADS[client]
    return builders.make_update(client, weights[:width].clone(), base[:width], version, job_id=client)


def aggregate(aggregator: Aggregator, callbacks: list[ServerCallback], param_numel: int | None = N_PARAMS) -> Server:
    """Both uploads through a server at version 1; flushed if the aggregator waits for a scheduler.

    ``param_numel=None``: the whole vector is read as parameters (the buffers get the parameters' rule).
    ``param_numel=0``: a model of the parameters alone (no buffers), the reference for the parameters' move.
    """
    width = N_PARAMS if param_numel == 0 else None
    server = Server(CURRENT[:width].clone(), aggregator, callbacks, 4, param_numel=param_numel or None)
    server.on_fit_start()
    server.version = 1
    for client in (0, 1):
        server.receive(make_update(client, width))
    server.flush()
    assert server.version == (3 if isinstance(aggregator, Mixing) else 2)  # Mixing: one version per upload
    return server


# Every aggregator, with rates that make stepping the buffers differ from averaging them, and its buffers by hand.
AGGREGATORS = {
    "DeltaAverage": (lambda: DeltaAverage(buffer_size=2, server_lr=0.5), MEAN),
    "CalibratedDeltaAverage": (lambda: CalibratedDeltaAverage(buffer_size=2, server_lr=0.5), MEAN),
    "GroupedDeltaStep": (lambda: GroupedDeltaStep(alpha=0.9), MEAN),
    "StaleAwareAverage": (lambda: StaleAwareAverage(), MEAN),
    "TwoStageWeightedStep": (lambda: TwoStageWeightedStep(buffer_size=2, first_clip=1.0, second_clip=1.0), MEAN),
    # Convex combinations of models apply their rule to the buffers:
    "ModelAverage": (lambda: ModelAverage(buffer_size=2), MEAN),
    "SlidingWindowAverage": (lambda: SlidingWindowAverage(window_size=2), MEAN),
    # two mixes at alpha = 0.5: (0.2 + 0.6) / 2 = 0.4 then (0.4 - 0.4) / 2; (0.9 + 0.5) / 2 = 0.7 then 1.6
    "Mixing": (lambda: Mixing(alpha=0.5), torch.tensor([0.0, 1.6])),
}

# Every server step (transform_aggregate), after a FedBuff-like DeltaAverage that itself averages the buffers.
STEPS = {
    "AdaptiveServerOptimizer": lambda: AdaptiveServerOptimizer(server_lr=0.1),
    "ServerMomentum": lambda: ServerMomentum(server_lr=0.7, momentum=0.9),
    "NormAmplification": lambda: NormAmplification(mu=0.0),
    "DynamicCorrection": lambda: DynamicCorrection(alpha=0.5),
}

#: Server steps that refuse models with floating buffers at fit start instead (each tested where it lives).
REFUSE_BUFFERS = {
    "GaussianAggregateNoise": "central DP noises the parameters' step only (tests/test_privacy.py: 'BatchNorm')",
}


def _library_subclasses(cls: type) -> set[type]:
    out = set()
    for sub in cls.__subclasses__():
        if sub.__module__.startswith("lit_asyncfl."):
            out |= {sub} | _library_subclasses(sub)
    return out


def test_the_cases_cover_every_aggregator_and_server_step_of_the_library():
    import lit_asyncfl.algorithms  # noqa: F401  (imports every aggregator and server callback of the presets)

    assert {c.__name__ for c in _library_subclasses(Aggregator)} == set(AGGREGATORS)
    steps = {
        c.__name__
        for c in _library_subclasses(ServerCallback)
        if c.transform_aggregate is not ServerCallback.transform_aggregate
    }
    assert steps == set(STEPS) | set(REFUSE_BUFFERS)


@pytest.mark.parametrize("name", sorted(AGGREGATORS))
def test_every_aggregator_averages_the_buffers(name):
    factory, expected = AGGREGATORS[name]
    server = aggregate(factory(), [])
    assert torch.allclose(server.weights[N_PARAMS:], expected, atol=1e-6)
    # The parameters move by the aggregator's own rule, as on a model without the buffers.
    assert torch.allclose(server.weights[:N_PARAMS], aggregate(factory(), [], param_numel=0).weights, atol=1e-6)
    if not factory().averages_models:  # the rule would step the buffers
        assert not torch.allclose(aggregate(factory(), [], param_numel=None).weights[N_PARAMS:], expected, atol=1e-3)


@pytest.mark.parametrize("name", sorted(STEPS))
def test_every_server_step_moves_the_parameters_only_and_the_buffers_are_averaged(name):
    server = aggregate(DeltaAverage(buffer_size=2, server_lr=1.0), [STEPS[name]()])
    assert torch.allclose(server.weights[N_PARAMS:], MEAN, atol=1e-6)
    # The step on the parameters is the one the callback takes on a model without buffers (same norms, moments).
    reference = aggregate(DeltaAverage(buffer_size=2, server_lr=1.0), [STEPS[name]()], param_numel=0)
    assert torch.allclose(server.weights[:N_PARAMS], reference.weights, atol=1e-6)
    # Without the policy the step reaches the buffers.
    stepped = aggregate(DeltaAverage(buffer_size=2, server_lr=1.0), [STEPS[name]()], param_numel=None)
    assert not torch.allclose(stepped.weights[N_PARAMS:], MEAN, atol=1e-3)


class ZeroWeights(ServerCallback):
    def weight_update(self, server, update, weight):
        return 0.0


def test_the_buffer_mean_is_weighted_by_the_server_callbacks_weights():
    server = aggregate(DeltaAverage(buffer_size=2, server_lr=0.5), [DoubleClientZero()])
    assert torch.allclose(server.weights[N_PARAMS:], torch.tensor([(2 * 0.6 - 0.4) / 3, (2 * 0.5 + 2.5) / 3]))
    unchanged = aggregate(DeltaAverage(buffer_size=2, server_lr=0.5), [ZeroWeights()])
    assert torch.equal(unchanged.weights[N_PARAMS:], CURRENT[N_PARAMS:])  # no weight: the buffers stay


def test_param_numel_is_checked():
    with pytest.raises(ValueError, match="param_numel must be in"):
        Server(torch.zeros(3), DeltaAverage(1), [], num_clients=1, param_numel=4)


class RecordsBuffers(ServerCallback):
    """Records, at every aggregation, the uploads' buffers and the new model's."""

    def __init__(self) -> None:
        self.records: list[tuple[list[tuple[torch.Tensor, int]], torch.Tensor, int]] = []

    def on_aggregated(self, server, updates):
        n = server.param_numel
        self.records.append(([(u.weights[n:], u.num_samples) for u in updates], server.weights[n:], n))


@pytest.mark.parametrize("algorithm", [FADAS, FedAvgM, FedBuff], ids=lambda a: a.__name__)
def test_a_batchnorm_models_running_statistics_are_averaged_in_a_run(tmp_path, algorithm):
    kwargs = {"buffer_size": 2, "concurrency": 3} if algorithm is not FedAvgM else {"clients_per_round": 3}
    algo = algorithm(**kwargs)
    recorder = RecordsBuffers()
    algo.server_callbacks.append(recorder)
    trainer = make_trainer(tmp_path, algo, num_clients=6, max_versions=3)
    model = BatchNormNet()
    trainer.fit(model, datamodule=DigitsDataModule())
    assert len(recorder.records) == 3
    for buffers, new, n in recorder.records:
        assert n == sum(p.numel() for p in model.parameters()) and new.numel() == 64  # running mean and variance
        sizes = [float(m) if algorithm is FedAvgM else 1.0 for _, m in buffers]  # FedAvgM: weighted by data size
        expected = sum(b * m for (b, _), m in zip(buffers, sizes)) / sum(sizes)
        assert torch.allclose(new, expected, atol=1e-6)


# Weight callbacks that read statistics of the uploads (directions, gradient estimates): of the parameters only.
WEIGHT_CALLBACKS = {
    "SimilarityStalenessWeight": lambda: SimilarityStalenessWeight(
        bound=2, similarity_weight=1.0, staleness_weight=1.0
    ),
    "DynamicStalenessWeight": lambda: DynamicStalenessWeight(
        mu_alpha=1.0, lambda0=1.0, sigma0=1.0, iota0=0.2, lr_lambda=0.5, lr_sigma=0.5, lr_iota=0.5
    ),
}


@pytest.mark.parametrize("name", sorted(WEIGHT_CALLBACKS))
def test_weights_from_update_statistics_read_the_parameters_only(name):
    """Four uploads of two clients, some stale, mixed in: the parameters move exactly as on a model without the
    buffers, whose uploads' buffers are large enough to change any direction or gradient they entered."""
    gen = torch.Generator().manual_seed(3)
    uploads = []
    for job_id, (client, base_version) in enumerate([(0, 0), (1, 0), (0, 1), (1, 0)]):
        params = torch.randn(N_PARAMS, generator=gen)
        buffers = torch.randn(2, generator=gen) * 50
        uploads.append((client, base_version, job_id, torch.cat([params, buffers])))
    results = []
    for width, param_numel in ((None, N_PARAMS), (N_PARAMS, None)):
        server = Server(
            CURRENT[:width].clone(), Mixing(alpha=0.5), [WEIGHT_CALLBACKS[name]()], 4, param_numel=param_numel
        )
        server.on_fit_start()
        history = [server.weights]
        for client, base_version, job_id, weights in uploads:
            update = builders.make_update(client, weights[:width].clone(), history[base_version], base_version,
                                          num_steps=2, job_id=job_id, info={"lr": 0.1})  # fmt: skip
            assert server.receive(update)
            history.append(server.weights)
        results.append(server.weights[:N_PARAMS])
    assert torch.allclose(results[0], results[1], atol=1e-6)
