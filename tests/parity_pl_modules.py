"""tests/parity_modules.py's data module in the old namespace (``import pytorch_lightning as pl``)."""

from __future__ import annotations

import pytorch_lightning as pl
from parity_modules import _BlobDataSteps


class PLBlobData(_BlobDataSteps, pl.LightningDataModule):
    pass
