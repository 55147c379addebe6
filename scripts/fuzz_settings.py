"""Fuzz every public constructor's settings with bad values and count what happens.

For each public constructor (algorithm presets, server callbacks and aggregators, schedulers, round controllers,
client callbacks, device models, partitioners, data modules, models and ``FederatedTrainer``), every parameter
whose annotation is a number, a count, a bool or a string gets bad values drawn for its kind (NaN, infinities,
-1, 0, 2.5 for a count, a string for a number, a huge value, ...). Each case ends in one of:

* ``raised``: a ``ValueError``/``TypeError`` at construction whose message names the parameter and the value;
* ``allowed``: construction accepted a value that :data:`ALLOWED` lists as meaningful;
* ``unclear``: an error that does not name the parameter and the value, or of another type;
* ``silent``: construction accepted a value that is not listed as meaningful.

``tests/test_settings_fuzz.py`` requires no ``unclear`` and no ``silent`` case. Run ``python
scripts/fuzz_settings.py`` for the figures (``-v`` also lists every accepted case).
"""

from __future__ import annotations

import inspect
import math
import os
import re
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import lightning as L

from lit_asyncfl import FederatedTrainer, availability, data, devices, mobility, models, schedulers, server
from lit_asyncfl import algorithms as alg
from lit_asyncfl.availability.prediction import SessionPredictor
from lit_asyncfl.client.callbacks import LearningRateDecay, ProximalTerm
from lit_asyncfl.client.client_state_callbacks import DynamicRegularizer, ModelContrastive
from lit_asyncfl.client.fresh_merge import FreshModelMerge
from lit_asyncfl.client.ray_executor import RayExecutor
from lit_asyncfl.client.staleness_callbacks import DecayedCorrection, DelayAdaptiveStepSize, ParticipationLearningRate
from lit_asyncfl.client.time_slots import TimeSlotSelector
from lit_asyncfl.core.client_state import ClientStateStore
from lit_asyncfl.rl.controllers import FixedAction, SACController
from lit_asyncfl.schedulers.compass import CompassScheduler
from lit_asyncfl.schedulers.deadline_rounds import DeadlineRounds
from lit_asyncfl.server.grouped import GroupedDeltaStep
from lit_asyncfl.server.stale_aware import StaleAwareAverage
from lit_asyncfl.server.two_stage import TwoStageWeightedStep

NAN, INF, HUGE = float("nan"), float("inf"), 1e12
ANY = "*"  # any class, in ALLOWED

#: Bad values drawn for each kind of parameter.
BAD_VALUES: dict[str, list[Any]] = {
    "float": [NAN, INF, -INF, -1.0, 0.0, HUGE, "0.5", True],
    "int": [NAN, INF, -1, 0, 2.5, "3", True],
    "count_or_fraction": [NAN, INF, -1, 0, 0.0, 1.5, "3", True],
    "bool": ["yes", 1, None],
    "str": ["no-such-choice", 3],
}

#: Accepted (class, parameter, value) that are meaningful; ``ANY`` as the class matches every class. Each entry
#: says why. Every entry must be used by some case (the test checks it), so the list cannot rot.
ALLOWED: dict[tuple[str, str, Any], str] = {
    # Non-negative coefficients whose 0 switches a term off (and that have no upper bound).
    (ANY, "weight_decay", 0.0): "no L2 penalty",
    (ANY, "weight_decay", HUGE): "an L2 penalty has no upper bound",
    (ANY, "momentum", 0.0): "plain SGD",
    (ANY, "dropout", 0.0): "no dropout",
    (ANY, "iota0", 0.0): "iota is an additive offset of xi of any sign",
    (ANY, "iota0", -1.0): "iota is an additive offset of xi of any sign",
    (ANY, "iota0", HUGE): "iota is an additive offset of xi of any sign",
    (ANY, "upsilon0", 0.0): "upsilon is a learned control of any sign",
    (ANY, "upsilon0", -1.0): "upsilon is a learned control of any sign",
    (ANY, "upsilon0", HUGE): "upsilon is a learned control of any sign",
    (ANY, "similarity_threshold", 0.0): "a cosine threshold in [-1, 1]",
    (ANY, "similarity_threshold", -1.0): "a cosine threshold in [-1, 1]",
    ("FedProx", "mu", 0.0): "FedProx with mu=0 is FedAvg",
    ("ProximalTerm", "mu", 0.0): "FedProx with mu=0 is FedAvg",
    ("FedProx", "mu", HUGE): "a proximal coefficient has no upper bound",
    ("ProximalTerm", "mu", HUGE): "a proximal coefficient has no upper bound",
    # ASO-Fed and FedSA (their client callbacks too).
    ("ASOFed", "lam", 0.0): "ASO-Fed without its proximal term",
    ("ASOFed", "lam", HUGE): "a proximal coefficient has no upper bound",
    **{
        (cls, "beta", 0.0): "ASO-Fed's h_k is then the previous pseudo-gradient alone"
        for cls in ("ASOFed", "DecayedCorrection")
    },
    **{
        (cls, "log_base", HUGE): "a huge base keeps r_k = 1 (no step-size adaptation)"
        for cls in ("ASOFed", "DelayAdaptiveStepSize")
    },
    **{
        (cls, "base_lr", HUGE): "FedSA's eta is a learning rate, which has no upper bound"
        for cls in ("FedSA", "ParticipationLearningRate")
    },
    **{(cls, "mu", 0.0): "MOON with mu=0 is FedAvg (FedAsync)" for cls in ("MOON", "ModelContrastive")},
    **{(cls, "mu", HUGE): "a loss weight has no upper bound" for cls in ("MOON", "ModelContrastive")},
    **{(cls, "tau", HUGE): "a temperature has no upper bound" for cls in ("MOON", "ModelContrastive")},
    **{
        (cls, "alpha", HUGE): "FedDyn's regulariser has no upper bound (clients stay at the server model)"
        for cls in ("FedDyn", "DynamicCorrection", "DynamicRegularizer")
    },
    ("ClientStateStore", "budget_bytes", 0): "every entry on disk",
    ("FederatedTrainer", "client_state_budget", 0): "every client state entry on disk",
    ("NormAmplification", "mu", 0.0): "INA mu=0 keeps the amplification constant",
    ("FedAsync", "a", 0.0): "staleness parameter a=0: no decay",
    ("StalenessWeight", "a", 0.0): "staleness parameter a=0: no decay",
    ("FedAsync", "a", HUGE): "a staleness decay has no upper bound",
    ("StalenessWeight", "a", HUGE): "a staleness decay has no upper bound",
    ("QuantitySkew", "a", 0.0): "quantity skew a=0: equal sizes",
    ("QuantitySkew", "a", HUGE): "a quantity skew has no upper bound",
    (ANY, "b", 0.0): "hinge at staleness 0",
    (ANY, "b", HUGE): "a hinge point beyond any staleness: constant weight",
    (ANY, "static_a", 0.0): "static polynomial exponent 0: no decay",
    (ANY, "static_a", HUGE): "a polynomial exponent has no upper bound",
    (ANY, "penalty", 0.0): "Oort without system penalty",
    (ANY, "penalty", HUGE): "a penalty exponent has no upper bound",
    (ANY, "alpha_pref", 0.0): "no latency preference",
    (ANY, "alpha_pref", HUGE): "a latency preference has no upper bound",
    (ANY, "beta_pref", 0.0): "no latency preference",
    (ANY, "beta_pref", HUGE): "a latency preference has no upper bound",
    (ANY, "egs_alpha", 0.0): "EGS fusion off",
    (ANY, "egs_alpha", HUGE): "a fusion coefficient has no upper bound",
    (ANY, "haa_lambda", 0.0): "no utility boost",
    (ANY, "lam", 0.0): "no utility boost (HAA's lambda)",
    (ANY, "lam", HUGE): "a utility coefficient has no upper bound",
    (ANY, "ema_rate", 0.0): "an EMA rate in [0, 1]",
    (ANY, "target_entropy_ratio", 0.0): "a deterministic target policy",
    (ANY, "haa_lambda", HUGE): "a utility coefficient has no upper bound",
    (ANY, "ina_mu", 0.0): "constant amplification",
    (ANY, "utility_ema", 0.0): "an EMA rate in [0, 1]",
    (ANY, "max_exponent", 0.0): "exponent cap 0: staleness ignored by HAA",
    (ANY, "max_exponent", HUGE): "no cap in practice",
    ("DistillationCorrection", "time_per_sample", 0.0): "distillation costs no server time",
    (ANY, "server_time_per_sample", 0.0): "distillation costs no server time",
    (ANY, "server_time_per_sample", HUGE): "a very slow server",
    (ANY, "crash_probability", 0.0): "no job crashes",
    ("RayExecutor", "num_cpus_per_worker", 0.0): "workers that reserve no CPU (e.g. GPU workers)",
    ("RayExecutor", "num_cpus_per_worker", HUGE): "Ray refuses what no node offers, when the workers start",
    ("RayExecutor", "num_gpus_per_worker", 0.0): "CPU workers",
    ("RayExecutor", "num_gpus_per_worker", HUGE): "a whole number of GPUs per worker; Ray refuses what no node offers",
    ("RayExecutor", "address", "no-such-choice"): "a cluster address is checked by ray.init when the run starts",
    ("MarkovOnOff", "spread", 0.0): "every device alike",
    ("Diurnal", "amplitude", 0.0): "no daily rhythm: constant probability",
    ("Diurnal", "phase_spread", 0.0): "every device on one clock",
    ("Diurnal", "day", HUGE): "a day longer than the run",
    (ANY, "slot", HUGE): "availability drawn once for the whole run",
    (ANY, "mean_on", HUGE): "devices that stay online",
    (ANY, "mean_off", HUGE): "devices that stay offline once they leave",
    (ANY, "time_scale", HUGE): "a trace stretched over a long run",
    (ANY, "deadline", HUGE): "a round deadline longer than any round: in effect none",
    (ANY, "round_deadline", HUGE): "a round deadline longer than any round: in effect none",
    (ANY, "speed", 0.0): "devices that do not move",
    (ANY, "speed", HUGE): "devices that jump anywhere each round",
    ("SyntheticDataModule", "alpha", 0.0): "alpha=0: no model heterogeneity",
    ("SyntheticDataModule", "beta", 0.0): "beta=0: no feature heterogeneity",
    ("SyntheticDataModule", "alpha", HUGE): "a heterogeneity has no upper bound",
    ("SyntheticDataModule", "beta", HUGE): "a heterogeneity has no upper bound",
    ("GradientStability", "alpha", 0.0): "EGS fusion off",
    ("GradientStability", "alpha", HUGE): "a fusion coefficient has no upper bound",
    ("Dirichlet", "alpha", HUGE): "a Dirichlet concentration has no upper bound (large: nearly IID)",
    ("Stragglers", "fraction", 0.0): "no stragglers: log-normal speeds only",
    ("Stragglers", "factor", HUGE): "stragglers that (nearly) never finish a job",
    ("Stragglers", "sigma", 0.0): "every ordinary device as fast as the median",
    ("Stragglers", "sigma", HUGE): "a log-normal spread has no upper bound (extreme speed differences)",
    ("RareClassOnSlowClients", "alpha", HUGE): "the base Dirichlet concentration has no upper bound",
    ("SpeedMatched", "alpha", HUGE): "the base Dirichlet concentration has no upper bound",
    (ANY, "lr_lambda", 0.0): "control frozen",
    (ANY, "lr_sigma", 0.0): "control frozen",
    (ANY, "lr_iota", 0.0): "control frozen",
    (ANY, "lr_gamma", 0.0): "control frozen",
    (ANY, "lr_upsilon", 0.0): "control frozen",
    (ANY, "rl_lr", 0.0): "meta-policy frozen",
    (ANY, "epsilon", 0.0): "greedy Q-learning",
    (ANY, "q_lr", 0.0): "Q-tables frozen",
    (ANY, "discount", 0.0): "myopic Q-learning",
    (ANY, "baseline_rate", 0.0): "fixed baseline",
    (ANY, "weight_min", 0.0): "a distillation weight in [0, 1]",
    (ANY, "fixed_weight", 0.0): "a distillation weight in [0, 1]",
    (ANY, "val_fraction", 0.0): "no validation split",
    (ANY, "beta1", 0.0): "no first-moment averaging (an RMSProp-type server step)",
    (ANY, "similarity_weight", 0.0): "PORT weighted by staleness alone (both 0 is refused)",
    (ANY, "staleness_weight", 0.0): "PORT weighted by similarity alone (both 0 is refused)",
    (ANY, "similarity_weight", HUGE): "a relative weight has no upper bound (similarity dominates)",
    (ANY, "staleness_weight", HUGE): "a relative weight has no upper bound (staleness dominates)",
    (ANY, "eps", HUGE): "a stability constant has no upper bound (a huge one makes the step SGD-like, lr / eps)",
    # Non-negative counts whose 0 is meaningful.
    (ANY, "staleness_threshold", 0): "distil every stale update",
    (ANY, "max_staleness", 0): "keep only fresh updates",
    (ANY, "history_length", 0): "FedHist without history",
    (ANY, "delay_threshold", 0): "FADAS divides the rate by the staleness of every stale aggregation",
    (ANY, "length", 0): "an empty gradient history",
    (ANY, "lag_tolerance", 0): "synchronous rounds",
    (ANY, "updates_per_round", 0): "act without learning",
    (ANY, "crop_padding", 0): "crop without padding",
    (ANY, "padding_idx", 0): "the default padding id",
    (ANY, "seed", 0): "seed 0",
    (ANY, "split_seed", 0): "seed 0",
    (ANY, "data_seed", 0): "seed 0",
    (ANY, "init_seed", 0): "seed 0",
    # Positive quantities without an upper bound (a huge value is slow or coarse, not wrong).
    **{
        (ANY, p, HUGE): "no upper bound"
        for p in (
            "lr",
            "server_lr",
            "temperature",
            "mu_alpha",
            "lambda0",
            "sigma0",
            "mu_beta",
            "gamma0",
            "lr_lambda",
            "lr_sigma",
            "lr_iota",
            "lr_gamma",
            "lr_upsilon",
            "rl_lr",
            "period",
            "max_latency",
            "preferred_duration",
            "max_grad_norm",
            "time_per_sample",
            "bandwidth",
            "mean",
            "min_capability",
            "ratio",
            "high",
            "area",
            "coverage",
            "server_bandwidth",
            "max_bandwidth",
            "model_size",
            "margin",
            "floor",
            "max_virtual_time",
            "augmentation_factor",
        )
    },
    (ANY, "bandwidth", INF): "infinite bandwidth: free communication (documented)",
    (ANY, "low", 0.0): "the shortest compute time may be 0",
    ("FederatedTrainer", "max_virtual_time", INF): "no time limit: max_versions bounds the run (the fuzz sets it)",
    ("FederatedTrainer", "checkpoint_every_seconds", HUGE): "a periodic checkpoint that never comes: allowed",
    ("UpdateNormBound", "k", HUGE): "a bound that never rejects: allowed",
    # WKAFL (TwoStageWeightedStep): clipping bounds without an upper limit, a cosine threshold, switches at 0.
    **{
        (cls, param, value): why
        for cls in ("WKAFL", "TwoStageWeightedStep")
        for param, value, why in (
            ("first_clip", HUGE, "a bound that never clips"),
            ("second_clip", HUGE, "a bound that never clips"),
            ("threshold", -1.0, "a cosine threshold in [-1, 1): -1 keeps every gradient not opposite"),
            ("threshold", 0.0, "a cosine threshold in [-1, 1): 0 keeps the aligned ones"),
        )
    },
    ("TwoStageWeightedStep", "temperature", 0.0): "consistency weights all equal",
    ("TwoStageWeightedStep", "lr_decay", 0.0): "a constant server rate",
    ("TwoStageWeightedStep", "lr_decay", HUGE): "a rate that vanishes unless the buffer is fresh: no upper bound",
    # REFL (StaleAwareAverage, DeadlineRounds): SAA's beta mixes two terms, its boost scale has no upper bound.
    **{(cls, "beta", 0.0): "SAA with damping alone" for cls in ("REFL", "StaleAwareAverage")},
    **{(cls, "scale", HUGE): "a boost that vanishes: beta times 1" for cls in ("REFL", "StaleAwareAverage")},
    **{(cls, "prohibit_reselect", 0): "no device passed over" for cls in ("REFL", "DeadlineRounds")},
    # FedCompass (GroupedDeltaStep, CompassScheduler).
    **{(cls, "alpha", HUGE): "a server rate (times s/N): no upper bound" for cls in ("FedCompass", "GroupedDeltaStep")},
    **{
        (cls, "staleness_exponent", value): why
        for cls in ("FedCompass", "GroupedDeltaStep")
        for value, why in ((0.0, "no staleness discount"), (HUGE, "stale updates discounted to nothing"))
    },
    **{
        (cls, "latest_time_factor", HUGE): "groups wait for every member: no upper bound"
        for cls in ("FedCompass", "CompassScheduler")
    },
    # Free-form strings: paths and metric names.
    (ANY, "root", "no-such-choice"): "a data directory",
    (ANY, "monitor", "no-such-choice"): "a metric name, checked at the first evaluation",
    (ANY, "name", "no-such-choice"): "an algorithm's display name",
}


@dataclass
class Target:
    """A constructor to fuzz, with the arguments it needs besides the fuzzed one."""

    name: str
    make: Callable[..., Any]
    base: dict[str, Any] = field(default_factory=dict)
    skip: tuple[str, ...] = ()


def targets(tmp: str) -> list[Target]:
    """Every public constructor under test (``tmp``: a scratch directory for the trainer's outputs and the trace
    file ``TraceDevices`` reads)."""
    history = server.GradientHistory(3)
    capacity_trace = os.path.join(tmp, "capacity.csv")  # TraceDevices reads its trace at construction
    with open(capacity_trace, "w") as f:
        f.write("device,time_per_sample,bandwidth\nd0,0.01,1e6\n")
    availability_trace = os.path.join(tmp, "availability.csv")  # and TraceAvailability its own
    with open(availability_trace, "w") as f:
        f.write("device,start,end\nd0,0,100\n")
    presets = [Target(cls.__name__, cls) for cls in alg.PRESETS.values() if "kwargs" not in _params(cls)]
    presets.append(
        Target(
            "SemiAsyncAlgorithm",
            alg.SemiAsyncAlgorithm,
            {"controller": FixedAction(), "selection": schedulers.RandomSelection()},
        )
    )
    parts = [
        Target("Mixing", server.Mixing),
        Target("DeltaAverage", server.DeltaAverage),
        Target("ModelAverage", server.ModelAverage),
        Target("DistillationCorrection", server.DistillationCorrection),
        Target("DynamicStalenessWeight", server.DynamicStalenessWeight),
        Target("GradientHistory", server.GradientHistory),
        Target("GradientStability", server.GradientStability, {"history": history}),
        Target("HistoryAwareWeight", server.HistoryAwareWeight, {"history": history}),
        Target("NormAmplification", server.NormAmplification),
        Target("StalenessBound", server.StalenessBound, {"max_staleness": 3}),
        Target("StalenessDecay", server.StalenessDecay),
        Target("StalenessWeight", server.StalenessWeight),
        Target("UpdateNormBound", server.UpdateNormBound),
        Target("SlidingWindowAverage", server.SlidingWindowAverage),
        Target("CalibratedDeltaAverage", server.CalibratedDeltaAverage),
        Target("ClientUpdateCache", server.ClientUpdateCache),
        Target("AdaptiveServerOptimizer", server.AdaptiveServerOptimizer),
        Target("TwoStageWeightedStep", TwoStageWeightedStep),
        Target("StaleAwareAverage", StaleAwareAverage),
        Target("GroupedDeltaStep", GroupedDeltaStep),
        Target("CompassScheduler", CompassScheduler),
        Target("DeadlineRounds", DeadlineRounds),
        Target("SessionPredictor", SessionPredictor),
        Target("ServerMomentum", server.ServerMomentum),
        Target("DynamicCorrection", server.DynamicCorrection),
        Target("ClientStateStore", ClientStateStore, {"directory": tmp}),
        Target("SimilarityStalenessWeight", server.SimilarityStalenessWeight),
        Target("BufferedConcurrency", schedulers.BufferedConcurrency),
        Target("KAsync", schedulers.KAsync),
        Target("KeepConcurrency", schedulers.KeepConcurrency),
        Target("PeriodicTrigger", schedulers.PeriodicTrigger),
        Target("SynchronousRounds", schedulers.SynchronousRounds),
        Target("SemiAsyncRounds", schedulers.SemiAsyncRounds),
        Target("OortSelection", schedulers.OortSelection),
        Target("FixedAction", FixedAction),
        Target("SACController", SACController),
        Target("RayExecutor", RayExecutor),
        Target("ProximalTerm", ProximalTerm),
        Target("ModelContrastive", ModelContrastive),
        Target("DynamicRegularizer", DynamicRegularizer),
        Target("LearningRateDecay", LearningRateDecay),
        Target("DelayAdaptiveStepSize", DelayAdaptiveStepSize),
        Target("DecayedCorrection", DecayedCorrection),
        Target("ParticipationLearningRate", ParticipationLearningRate),
        Target("FreshModelMerge", FreshModelMerge),
        Target("TimeSlotSelector", TimeSlotSelector),
        Target("DeviceModel", devices.DeviceModel),
        Target("UniformRatio", devices.UniformRatio),
        Target("ExponentialCapability", devices.ExponentialCapability),
        Target("UniformResponse", devices.UniformResponse),
        Target("Stragglers", devices.Stragglers),
        Target("TraceDevices", devices.TraceDevices, {"path": capacity_trace}),
        Target("MobileEdgeDevices", mobility.MobileEdgeDevices),
        Target("AlwaysAvailable", availability.AlwaysAvailable),
        Target("Bernoulli", availability.Bernoulli),
        Target("MarkovOnOff", availability.MarkovOnOff),
        Target("Diurnal", availability.Diurnal),
        Target("TraceAvailability", availability.TraceAvailability, {"path": availability_trace}),
        Target("Dirichlet", data.Dirichlet),
        Target("Shards", data.Shards),
        Target("QuantitySkew", data.QuantitySkew),
        Target("RareClassOnSlowClients", data.RareClassOnSlowClients),
        Target("SpeedMatched", data.SpeedMatched),
    ]
    datamodules = [
        Target(cls.__name__, cls)
        for cls in (
            data.DigitsDataModule,
            data.DiabetesDataModule,
            data.BreastCancerDataModule,
            data.SyntheticDataModule,
            data.IMDbDataModule,
            data.MNISTDataModule,
            data.FashionMNISTDataModule,
            data.CIFAR10DataModule,
            data.CIFAR100DataModule,
            data.TinyImageNetDataModule,
        )
    ]
    datamodules.append(
        Target("PartitionedDataModule", data.PartitionedDataModule, {"datamodule": L.LightningDataModule()})
    )
    required = {"LinearRegression": {"input_dim": 8}, "LinearSVM": {"input_dim": 8}, "TextCNN": {"vocab_size": 50}}
    model_targets = [Target(name, getattr(models, name), required.get(name, {})) for name in models.__all__]
    trainer = Target(
        "FederatedTrainer",
        FederatedTrainer,
        {
            "max_versions": 1,
            "logger": False,
            "enable_progress_bar": False,
            "print_summary": False,
            "default_root_dir": tmp,
            "num_clients": 10,
        },
    )
    return [*presets, *parts, *datamodules, *model_targets, trainer]


def _params(make: Callable[..., Any]) -> dict[str, inspect.Parameter]:
    return dict(inspect.signature(make).parameters)


def kind_of(parameter: inspect.Parameter) -> str | None:
    """The kind of bad values to draw for a parameter, from its annotation (``None``: not fuzzed)."""
    if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
        return None
    annotation = str(parameter.annotation).replace(" ", "")
    parts = set(annotation.split("|")) - {"None"}
    if parts == {"bool"}:
        return "bool"
    if parts == {"int", "float"}:
        return "count_or_fraction"
    if parts == {"int"}:
        return "int"
    if parts == {"float"}:
        return "float"
    if "str" in parts:
        return "str"
    return None


@dataclass
class Case:
    """One constructor called with one bad value."""

    target: Target
    parameter: str
    value: Any

    @property
    def id(self) -> str:
        return f"{self.target.name}-{self.parameter}={self.value!r}"


def cases(tmp: str | None = None) -> Iterator[Case]:
    """Every (constructor, parameter, bad value) case."""
    tmp = tmp if tmp is not None else tempfile.mkdtemp(prefix="fuzz-settings-")
    for target in targets(tmp):
        for name, parameter in _params(target.make).items():
            kind = kind_of(parameter)
            if kind is None or name in target.base or name in target.skip:
                continue
            optional = "None" in str(parameter.annotation)
            for value in BAD_VALUES[kind]:
                if value is None and optional:
                    continue
                yield Case(target, name, value)


def allowed_key(case: Case) -> tuple[str, str, Any] | None:
    """The :data:`ALLOWED` entry that covers an accepted case."""
    for c, p, v in ALLOWED:
        if c in (case.target.name, ANY) and p == case.parameter and _same(v, case.value):
            return (c, p, v)
    return None


def _same(a: Any, b: Any) -> bool:
    if type(a) is not type(b) and not (isinstance(a, int | float) and isinstance(b, int | float)):
        return False
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def names_parameter_and_value(message: str, parameter: str, value: Any) -> bool:
    """Whether an error message names the parameter (as a word; a one- or two-letter name must be followed by
    ``must``, ``as a`` or ``=``) and the value (its ``repr``)."""
    if len(parameter) <= 2:
        named = re.search(rf"\b{re.escape(parameter)}( must| as a|=)", message) is not None
    else:
        named = re.search(rf"(?<![\w.]){re.escape(parameter)}(?!\w)", message) is not None
    return named and repr(value) in message


def run(case: Case) -> tuple[str, str]:
    """Construct the case; return its outcome (``raised``, ``allowed``, ``unclear``, ``silent``) and a detail."""
    try:
        case.target.make(**case.target.base, **{case.parameter: case.value})
    except (ValueError, TypeError) as error:
        message = str(error)
        if names_parameter_and_value(message, case.parameter, case.value):
            return "raised", message
        return "unclear", f"{type(error).__name__}: {message}"
    except Exception as error:
        return "unclear", f"{type(error).__name__}: {error}"
    key = allowed_key(case)
    return ("allowed", ALLOWED[key]) if key is not None else ("silent", "accepted")


def figures(verbose: bool = False) -> dict[str, Any]:
    """Run every case; return the counts, the failing cases and the :data:`ALLOWED` entries no case used."""
    counts: Counter[str] = Counter()
    failures: list[str] = []
    used: set[tuple[str, str, Any]] = set()
    for case in cases():
        outcome, detail = run(case)
        counts[outcome] += 1
        if outcome == "allowed":
            key = allowed_key(case)
            if key is not None:
                used.add(key)
        if outcome in ("unclear", "silent"):
            failures.append(f"{outcome}: {case.id}: {detail}")
        if verbose and outcome != "raised":
            print(f"{outcome:8} {case.id}: {detail}")
    unused = [key for key in ALLOWED if key not in used]
    return {
        "cases": sum(counts.values()),
        **{k: counts[k] for k in ("raised", "allowed", "unclear", "silent")},
        "failures": failures,
        "unused_allowed": unused,
    }


def main() -> int:
    """Print the figures; exit 1 when a case is unclear or silent."""
    result = figures(verbose="-v" in sys.argv)
    for line in result["failures"]:
        print(line)
    print(
        f"cases: {result['cases']}, raised at construction naming the parameter: {result['raised']}, "
        f"accepted and allowed: {result['allowed']}, unclear errors: {result['unclear']}, silent: {result['silent']}"
    )
    if result["unused_allowed"]:
        print(f"allow-list entries no case used: {result['unused_allowed']}")
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
