"""``FederatedTrainer.fit``'s data given as to ``lightning.Trainer.fit``: dataloaders, or the module's own hooks."""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch.utils.data import DataLoader

from lit_asyncfl import namespaces
from lit_asyncfl.checks import check_hooks_run


class LoaderDataModule(L.LightningDataModule):
    """A data module over given dataloaders: what ``fit(model, train_loader, val_loader)`` trains and evaluates.

    Its training loader's dataset is split into the clients (:class:`~lit_asyncfl.data.PartitionedDataModule`, IID
    by default), with the loader's ``batch_size``, ``collate_fn``, ``drop_last`` and ``shuffle``. Without validation
    loaders the global model is not evaluated (as ``Trainer.fit`` validates nothing without them).

    Args:
        train: The training ``DataLoader``.
        val: The validation loader(s), or ``None``.
        test: The test loader(s), or ``None`` (for :meth:`~lit_asyncfl.FederatedTrainer.test` after ``fit``).
        source: Where the loaders came from (``"dataloaders"`` or ``"module hooks"``), for the run's record.

    Example:
        >>> import torch
        >>> from torch.utils.data import TensorDataset
        >>> loader = DataLoader(TensorDataset(torch.zeros(8, 2), torch.zeros(8).long()), batch_size=4)
        >>> dm = LoaderDataModule(loader, None)
        >>> dm.train_dataloader() is loader, dm.batch_size
        (True, 4)
    """

    def __init__(self, train: DataLoader, val: Any = None, test: Any = None, source: str = "dataloaders") -> None:
        super().__init__()
        self._train, self._val, self._test = train, val, test
        self.source = source
        self.batch_size = train.batch_size
        self.dataset = type(train.dataset).__name__

    def train_dataloader(self) -> DataLoader:
        return self._train

    def val_dataloader(self) -> Any:
        if self._val is None:
            raise MisconfigurationException("no val_dataloaders were given")
        return self._val

    def test_dataloader(self) -> Any:
        if self._test is None:
            raise MisconfigurationException("no test dataloaders were given")
        return self._test


def fit_data(
    model: Any, train_dataloaders: Any, val_dataloaders: Any, datamodule: Any, engine: str
) -> L.LightningDataModule:
    """The data module of ``fit(model, train_dataloaders, val_dataloaders, datamodule)``, read as Lightning reads
    these arguments: a data module passed as ``train_dataloaders`` is the data module; loaders and a data module
    together are refused; without either, the module's own ``train_dataloader``/``val_dataloader``/
    ``test_dataloader`` hooks are the data (after its ``prepare_data``, and its ``setup("fit")`` under
    ``engine="lightning"``, which runs ``setup``; the other engines refuse a module overriding ``setup``).

    Example:
        >>> from lit_asyncfl.data import DigitsDataModule
        >>> dm = DigitsDataModule()
        >>> fit_data(None, dm, None, None, "fast") is dm
        True
    """
    datamodules = namespaces.classes("LightningDataModule")
    if isinstance(train_dataloaders, datamodules):
        if datamodule is not None:
            raise TypeError("fit: a data module was passed as train_dataloaders and as datamodule; pass one")
        datamodule, train_dataloaders = train_dataloaders, None
    if datamodule is not None:
        if train_dataloaders is not None or val_dataloaders is not None:
            raise TypeError(
                "fit: pass either train_dataloaders/val_dataloaders or datamodule, not both (as lightning.Trainer)"
            )
        return datamodule
    hooks = {name: _hook_loaders(model, name) for name in ("train_dataloader", "val_dataloader", "test_dataloader")}
    from_hooks = train_dataloaders is None
    if from_hooks and not hooks["train_dataloader"]:
        raise TypeError(
            f"fit: no training data: pass train_dataloaders (a DataLoader), datamodule=..., or define "
            f"train_dataloader() on {type(model).__name__}"
        )
    if any(hooks.values()):
        # a module that builds its data in setup(): refused here, before its loader hooks fail without it
        check_hooks_run(type(model).__name__, ["setup"] if namespaces.is_overridden("setup", model) else [], engine)
        model.prepare_data()
        if engine == "lightning" and namespaces.is_overridden("setup", model):
            model.setup("fit")
    train = model.train_dataloader() if from_hooks else train_dataloaders
    if not isinstance(train, DataLoader):
        raise TypeError(
            f"fit: train_dataloaders must be one DataLoader (its dataset is split into the clients), got "
            f"{type(train).__name__}; for several training sets, combine them into one dataset"
        )
    val = (
        val_dataloaders
        if val_dataloaders is not None
        else (model.val_dataloader() if hooks["val_dataloader"] else None)
    )
    test = model.test_dataloader() if hooks["test_dataloader"] else None
    return LoaderDataModule(train, val, test, source="module hooks" if from_hooks else "dataloaders")


def _hook_loaders(model: Any, name: str) -> bool:
    return isinstance(model, namespaces.classes("LightningModule")) and namespaces.is_overridden(name, model)


class _EvalLoaders(L.LightningDataModule):
    """Evaluation data given as to ``lightning.Trainer.validate``/``test``: loaders, or a module's own hooks.

    Args:
        loaders: What ``val_dataloader``/``test_dataloader`` return (a loader or a list of them), or ``None``.
        module: A module whose own ``val_dataloader``/``test_dataloader`` hooks are the data (after its
            ``setup(stage)`` where it overrides ``setup``, as Lightning runs it), when ``loaders`` is ``None``.

    Example:
        >>> _EvalLoaders([[1], [2]]).val_dataloader()
        [[1], [2]]
    """

    def __init__(self, loaders: Any = None, module: Any = None) -> None:
        super().__init__()
        self._loaders, self._module = loaders, module

    def setup(self, stage: str) -> None:
        if self._loaders is None and namespaces.is_overridden("setup", self._module):
            self._module.setup(stage)

    def val_dataloader(self) -> Any:
        return self._loaders if self._loaders is not None else self._module.val_dataloader()

    def test_dataloader(self) -> Any:
        return self._loaders if self._loaders is not None else self._module.test_dataloader()


def eval_data(stage: str, model: Any, dataloaders: Any, datamodule: Any) -> L.LightningDataModule | None:
    """The data of ``validate``/``test(model, dataloaders, ckpt_path, verbose, datamodule)``, read as Lightning reads
    these arguments: ``dataloaders`` (a loader, a list of them, or a data module, as Lightning accepts), else
    ``datamodule``, else the passed module's own ``val_dataloader``/``test_dataloader`` hook; ``None``: none of these
    (the trainer then evaluates on the data of its ``fit``). Loaders and a data module together are refused.

    Example:
        >>> from lit_asyncfl.data import DigitsDataModule
        >>> dm = DigitsDataModule()
        >>> eval_data("validate", None, dm, None) is dm, eval_data("test", None, None, None)
        (True, None)
    """
    if isinstance(dataloaders, namespaces.classes("LightningDataModule")):
        if datamodule is not None:
            raise TypeError(f"{stage}: a data module was passed as dataloaders and as datamodule; pass one")
        return dataloaders
    if dataloaders is not None:
        if datamodule is not None:
            raise TypeError(f"{stage}: pass either dataloaders or datamodule, not both (as lightning.Trainer)")
        return _EvalLoaders(dataloaders)
    if datamodule is not None:
        return datamodule
    hook = "val_dataloader" if stage == "validate" else "test_dataloader"
    if model is not None and _hook_loaders(model, hook):
        return _EvalLoaders(module=model)
    return None
