"""``lit-asyncfl``: the LightningCLI of the federated trainer (``fit``, ``validate``, ``test``).

``FederatedTrainer`` is not a ``lightning.Trainer`` subclass (it runs a simulation, not a training loop, and needs
none of the Trainer's 60 arguments), so this CLI adds it to the ``trainer`` group itself; ``model`` and ``data``
are the usual LightningCLI groups. The run seed is ``trainer.seed`` and seeds model construction too. As in
LightningCLI, ``--ckpt_path`` also sets the model's hyper-parameters from the checkpoint (they take precedence over
the config), so ``test --ckpt_path`` rebuilds the model the run trained. Unlike LightningCLI, a checkpoint never
chooses the code that is imported: a model class it names (``hyper_parameters._class_path``) must be the config's
model class, else the command is refused naming both (give ``--model=<the class>`` to accept it explicitly).

Example::

    lit-asyncfl fit --config configs/quickstart.yaml --trainer.algorithm.init_args.alpha=0.5
    lit-asyncfl fit --config configs/quickstart.yaml --print_config
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.utilities.seed import seed_everything
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

import lit_asyncfl.algorithms
import lit_asyncfl.data
import lit_asyncfl.devices
import lit_asyncfl.models  # noqa: F401  (registers short class names for --model=LeNet5 etc.)
from lit_asyncfl import namespaces
from lit_asyncfl.checks import check, is_int
from lit_asyncfl.trainer import FederatedTrainer

_PACKAGE = Path(__file__).resolve().parent


def settings_error(error: BaseException) -> BaseException | None:
    """The error one of this package's constructors raised for a bad setting, found in the chain of errors that
    jsonargparse wraps around it (``None``: the error did not come from this package).

    Example:
        >>> try:
        ...     from lit_asyncfl.models import LeNet5
        ...     try:
        ...         LeNet5(lr=float("nan"))
        ...     except ValueError as inner:
        ...         raise ValueError("Does not validate against any of the Union subtypes") from inner
        ... except ValueError as outer:
        ...     print(settings_error(outer))
        lr must be a finite number > 0, got nan
    """
    found, seen = None, set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ValueError | TypeError) and _raised_here(current):
            found = current  # keep the innermost one
        current = current.__cause__ or current.__context__
    return found


def _raised_here(error: BaseException) -> bool:
    """Whether the last frame of ``error``'s traceback is in this package."""
    tb = error.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return Path(tb.tb_frame.f_code.co_filename).resolve().is_relative_to(_PACKAGE)


class FederatedCLI(LightningCLI):
    """LightningCLI whose ``trainer`` group is :class:`~lit_asyncfl.FederatedTrainer`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("trainer_class", FederatedTrainer)  # type: ignore[arg-type]
        kwargs.setdefault("save_config_callback", None)  # the trainer writes config.yaml into its log dir
        kwargs.setdefault("auto_configure_optimizers", False)  # clients call the module's configure_optimizers
        super().__init__(*args, **kwargs)

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        return {
            "fit": {"model", "train_dataloaders", "val_dataloaders", "datamodule"},
            "validate": {"model", "dataloaders", "datamodule"},
            "test": {"model", "dataloaders", "datamodule"},
        }

    def add_default_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """No ``--seed_everything``: ``--trainer.seed`` seeds the whole run."""

    def add_core_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_class_arguments(
            self.trainer_class, "trainer", fail_untyped=False, instantiate=False, sub_configs=True
        )
        for key, given, base, subclass_mode, required in (
            ("model", self.model_class, "LightningModule", self.subclass_mode_model, True),
            ("data", self.datamodule_class, "LightningDataModule", self.subclass_mode_data, False),
        ):
            if given is None:  # any subclass of either namespace's base (import lightning / pytorch_lightning)
                bases = namespaces.installed_classes(base)
                parser.add_subclass_arguments(bases, key, fail_untyped=False, required=required)
            else:
                parser.add_lightning_class_args(given, key, subclass_mode=subclass_mode, required=required)

    def _add_instantiators(self) -> None:
        """Lightning's, and the same for ``pytorch_lightning`` modules (their hyper-parameters record the config)."""
        super()._add_instantiators()
        standalone = namespaces.standalone()
        if standalone is None:
            return
        for key, given, base in (("model", self.model_class, "LightningModule"),
                                 ("data", self.datamodule_class, "LightningDataModule")):  # fmt: skip
            if given is None:
                self.parser.add_instantiator(
                    standalone.cli._InstantiatorFn(cli=self, key=key), getattr(standalone, base), subclasses=True
                )

    @contextmanager
    def _settings_errors(self) -> Iterator[None]:
        """Report a bad setting refused by one of this package's constructors as one ``error:`` line (exit 2)."""
        try:
            yield
        except (ValueError, TypeError) as error:
            found = settings_error(error)
            if found is None:
                raise
            self.parser.error(str(found))

    def _parse_ckpt_path(self) -> None:
        """LightningCLI's, after checking that the model class the checkpoint names is the config's (LightningCLI
        would import and instantiate whatever class a checkpoint names)."""
        subcommand = self.config.get("subcommand")
        ckpt_path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if ckpt_path and Path(ckpt_path).is_file():
            try:
                hparams = torch.load(ckpt_path, weights_only=True, map_location="cpu").get("hyper_parameters")
            except Exception:  # not a checkpoint: LightningCLI and the trainer report it
                hparams = None
            named = hparams.get("_class_path") if isinstance(hparams, dict) else None
            if named is not None:
                self._check_checkpoint_class(str(named), str(ckpt_path), self.config[subcommand].get("model"))
        super()._parse_ckpt_path()

    def _check_checkpoint_class(self, named: str, ckpt_path: str, model: Any) -> None:
        given = model.get("class_path") if model is not None and hasattr(model, "get") else None
        if given is None:
            self.parser.error(
                f"{ckpt_path} names the model class {named!r} and the config gives no model: a checkpoint does not "
                f"choose the code that is imported; give the model (--model={named} if you trust the file)"
            )
        module, _, name = str(given).rpartition(".")
        cls = getattr(importlib.import_module(module), name, None) if module else None  # the user's own choice
        full = f"{cls.__module__}.{cls.__qualname__}" if cls is not None else given
        if named not in (given, full):
            self.parser.error(
                f"{ckpt_path} was written by the model class {named!r}, but the config's model is {given!r}: refused "
                f"(a checkpoint does not choose the code that is imported); use the config of the run that wrote it, "
                f"or --model={named} if you trust the file"
            )

    def _set_seed(self) -> None:
        trainer = self._get(self.config, "trainer")
        seed = trainer.get("seed", 0) if trainer is not None else 0
        with self._settings_errors():
            check(is_int(seed) and 0 <= seed < 2**32, f"seed must be an integer in [0, 2**32), got {seed!r}")
        seed_everything(int(seed), verbose=False)

    def instantiate_classes(self) -> None:
        """Instantiate the model, data module and trainer; a refused setting ends the command with its message."""
        with self._settings_errors():
            super().instantiate_classes()

    def instantiate_trainer(self, **kwargs: Any) -> Any:
        config = {**self._get(self.config_init, "trainer", default={}), **kwargs}
        trainer = self.trainer_class(**config)
        self._dump_config()
        trainer.run_config = self.config_dump
        return trainer


def main(args: list[str] | None = None) -> int:
    """Entry point of ``lit-asyncfl`` (``args`` instead of ``sys.argv`` lets Python code call it); returns 0.

    Use :class:`FederatedCLI` directly to keep the parsed objects (``cli.trainer``, ``cli.model``).
    """
    FederatedCLI(args=args)
    return 0


if __name__ == "__main__":
    main()
