"""Third-party-style Lightning code in the old namespace (``import pytorch_lightning as pl``), as Flower's Lightning
quickstart and many tutorials write it: the same bodies as tests/wild_modules.py's ``LClassifier``/``LData``."""

from __future__ import annotations

import pytorch_lightning as pl
from wild_modules import _ClassifierSteps, _DataSteps


class PLClassifier(_ClassifierSteps, pl.LightningModule):
    pass


class PLData(_DataSteps, pl.LightningDataModule):
    pass
