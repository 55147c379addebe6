"""Algorithm presets: each a short composition of a scheduler, server callbacks and an aggregator."""

from __future__ import annotations

from lit_asyncfl.algorithms.asfl import ASFL
from lit_asyncfl.algorithms.asofed import ASOFed
from lit_asyncfl.algorithms.base import Algorithm
from lit_asyncfl.algorithms.ca2fl import CA2FL
from lit_asyncfl.algorithms.ditto import Ditto
from lit_asyncfl.algorithms.dynsgd import DynSGD
from lit_asyncfl.algorithms.fadas import FADAS
from lit_asyncfl.algorithms.fedadt import FedADT
from lit_asyncfl.algorithms.fedasmu import FedASMU, FedASMU_0, FedASMU_DA, FedASMU_FA
from lit_asyncfl.algorithms.fedasync import FedAsync
from lit_asyncfl.algorithms.fedavg import FedAvg
from lit_asyncfl.algorithms.fedavgm import FedAvgM
from lit_asyncfl.algorithms.fedbuff import FedBuff
from lit_asyncfl.algorithms.fedcompass import FedCompass
from lit_asyncfl.algorithms.fedcs import FedCS
from lit_asyncfl.algorithms.feddyn import FedDyn
from lit_asyncfl.algorithms.fedfa import FedFa
from lit_asyncfl.algorithms.fedhist import FedHist, FedHist_noEGS, FedHist_noHAA, FedHist_noINA
from lit_asyncfl.algorithms.fedprox import FedProx
from lit_asyncfl.algorithms.fedsa import FedSA
from lit_asyncfl.algorithms.moon import MOON
from lit_asyncfl.algorithms.oort import Oort
from lit_asyncfl.algorithms.port import PORT
from lit_asyncfl.algorithms.refl import REFL
from lit_asyncfl.algorithms.safa import SAFA
from lit_asyncfl.algorithms.semi_async import SemiAsyncAlgorithm
from lit_asyncfl.algorithms.twafl import TWAFL
from lit_asyncfl.algorithms.wkafl import WKAFL

PRESETS: dict[str, type[Algorithm]] = {
    "fedavg": FedAvg,
    "fedprox": FedProx,
    "fedasync": FedAsync,
    "fedbuff": FedBuff,
    "fedasmu": FedASMU,
    "fedasmu-da": FedASMU_DA,
    "fedasmu-fa": FedASMU_FA,
    "fedasmu-0": FedASMU_0,
    "fedadt": FedADT,
    "fedhist": FedHist,
    "fedhist-noegs": FedHist_noEGS,
    "fedhist-nohaa": FedHist_noHAA,
    "fedhist-noina": FedHist_noINA,
    "dynsgd": DynSGD,
    "twafl": TWAFL,
    "asfl": ASFL,
    "safa": SAFA,
    "fedcs": FedCS,
    "oort": Oort,
    "fedfa": FedFa,
    "ca2fl": CA2FL,
    "fadas": FADAS,
    "wkafl": WKAFL,
    "refl": REFL,
    "fedcompass": FedCompass,
    "fedavgm": FedAvgM,
    "moon": MOON,
    "feddyn": FedDyn,
    "port": PORT,
    "asofed": ASOFed,
    "fedsa": FedSA,
    "ditto": Ditto,
}


def get_algorithm(name: str) -> Algorithm:
    """A preset with its default hyper-parameters, by case-insensitive name.

    Example:
        >>> get_algorithm("FedBuff").name
        'FedBuff'
    """
    key = name.lower()
    if key not in PRESETS:
        raise ValueError(f"unknown algorithm preset {name!r}; allowed: {sorted(PRESETS)}")
    return PRESETS[key]()


__all__ = [
    "ASFL",
    "CA2FL",
    "FADAS",
    "MOON",
    "PORT",
    "PRESETS",
    "REFL",
    "SAFA",
    "TWAFL",
    "WKAFL",
    "ASOFed",
    "Algorithm",
    "Ditto",
    "DynSGD",
    "FedADT",
    "FedASMU",
    "FedASMU_0",
    "FedASMU_DA",
    "FedASMU_FA",
    "FedAsync",
    "FedAvg",
    "FedAvgM",
    "FedBuff",
    "FedCS",
    "FedCompass",
    "FedDyn",
    "FedFa",
    "FedHist",
    "FedHist_noEGS",
    "FedHist_noHAA",
    "FedHist_noINA",
    "FedProx",
    "FedSA",
    "Oort",
    "SemiAsyncAlgorithm",
    "get_algorithm",
]
