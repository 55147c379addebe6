"""The two modes of presets that run synchronously (FedAvg's rounds) or asynchronously (FedAsync's mixing)."""

from __future__ import annotations

from typing import Any

from lit_asyncfl.algorithms.base import Algorithm
from lit_asyncfl.algorithms.fedasync import FedAsync
from lit_asyncfl.algorithms.fedavg import FedAvg
from lit_asyncfl.checks import check, check_bool

SYNCHRONOUS = ("clients_per_round", "round_deadline")
ASYNCHRONOUS = ("alpha", "concurrency")
_REFUSED = {  # asynchronous -> why an argument of the other mode is refused
    True: "applies to synchronous rounds; with asynchronous=True set alpha and concurrency",
    False: "applies to asynchronous=True; synchronous rounds take clients_per_round and round_deadline",
}


def rounds_or_fedasync(hparams: dict[str, Any]) -> Algorithm:
    """FedAvg's rounds (``clients_per_round``, ``round_deadline``) or, with ``asynchronous=True``, FedAsync's
    composition (``alpha``, ``concurrency``), from a preset's arguments (e.g. MOON, Ditto); an argument of the other
    mode is refused, one left ``None`` takes the default of :class:`FedAvg` or :class:`FedAsync`.

    Example:
        >>> args = {"asynchronous": True, "clients_per_round": None, "round_deadline": None, "alpha": 0.5,
        ...         "concurrency": 4}
        >>> type(rounds_or_fedasync(args).aggregator).__name__
        'Mixing'
    """
    check_bool("asynchronous", hparams["asynchronous"])
    asynchronous = hparams["asynchronous"]
    mode, preset = (ASYNCHRONOUS, FedAsync) if asynchronous else (SYNCHRONOUS, FedAvg)
    for name in SYNCHRONOUS if asynchronous else ASYNCHRONOUS:
        check(hparams[name] is None, f"{name}={hparams[name]!r} {_REFUSED[asynchronous]}")
    return preset(**{name: hparams[name] for name in mode if hparams[name] is not None})


def with_mode(hparams: dict[str, Any], client_callback: Any) -> dict[str, Any]:
    """:class:`Algorithm`'s arguments for a preset that adds one client callback to :func:`rounds_or_fedasync`'s
    composition (Ditto's personal model, MOON's contrastive term).

    Example:
        >>> args = {"asynchronous": False, "clients_per_round": 5, "round_deadline": None, "alpha": None,
        ...         "concurrency": None}
        >>> parts = with_mode(args, client_callback="cb")
        >>> type(parts["scheduler"]).__name__, parts["client_callbacks"]
        ('SynchronousRounds', ['cb'])
    """
    base = rounds_or_fedasync(hparams)
    return {
        "scheduler": base.scheduler,
        "aggregator": base.aggregator,
        "server_callbacks": base.server_callbacks,
        "client_callbacks": [*base.client_callbacks, client_callback],
        "hparams": hparams,
    }
