"""The two modes of presets that run synchronously (FedAvg's rounds) or asynchronously (FedAsync's mixing)."""

from __future__ import annotations

from typing import Any

from lit_asyncfl.algorithms.base import Algorithm
from lit_asyncfl.algorithms.fedasync import FedAsync
from lit_asyncfl.algorithms.fedavg import FedAvg
from lit_asyncfl.checks import check, check_bool


def rounds_or_fedasync(hparams: dict[str, Any]) -> Algorithm:
    """FedAvg's rounds (``clients_per_round``, default 0.1; ``round_deadline``) or, with ``asynchronous=True``,
    FedAsync's composition (``alpha``, default 0.6; ``concurrency``, default 0.1), from a preset's arguments; an
    argument of the other mode is refused (e.g. MOON, Ditto).

    Example:
        >>> args = {"asynchronous": True, "clients_per_round": None, "round_deadline": None, "alpha": 0.5,
        ...         "concurrency": 4}
        >>> type(rounds_or_fedasync(args).aggregator).__name__
        'Mixing'
    """
    check_bool("asynchronous", hparams["asynchronous"])
    if hparams["asynchronous"]:
        for name in ("clients_per_round", "round_deadline"):
            check(
                hparams[name] is None,
                f"{name}={hparams[name]!r} applies to synchronous rounds; with asynchronous=True set alpha and "
                "concurrency",
            )
        alpha, concurrency = hparams["alpha"], hparams["concurrency"]
        return FedAsync(alpha=0.6 if alpha is None else alpha, concurrency=0.1 if concurrency is None else concurrency)
    for name in ("alpha", "concurrency"):
        check(
            hparams[name] is None,
            f"{name}={hparams[name]!r} applies to asynchronous=True; synchronous rounds take clients_per_round and "
            "round_deadline",
        )
    per_round = hparams["clients_per_round"]
    return FedAvg(0.1 if per_round is None else per_round, round_deadline=hparams["round_deadline"])
