"""Updates per wall second of a whole quickstart run with resident client data against dataset-backed data.

The quickstart (FedAsync, 100 clients, Dirichlet(0.5) label skew on the bundled digits, LeNet-5, batch 10) runs
twice for the same number of versions, interleaved and repeated:

- ``resident``: the bundled ``DigitsDataModule`` — a ``TensorDataset``, kept as tensors; batches are gathered by
  index (the fast path for data that is static by construction);
- ``dataset``: the same digits behind a plain ``LightningDataModule`` whose dataset is an ordinary map-style
  ``Dataset`` (``__getitem__`` per sample), read afresh at every draw and collated as a ``DataLoader`` would, so
  random transforms are re-drawn as under ``lightning.Trainer``.

Both runs draw the same batches (same permutation from the job's generator), so they also end with the same
weights, which the script checks. The last line is machine-readable: ``dataset_vs_resident=<x>`` (time ratio).

    python scripts/bench_data_path.py --versions 1500 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

from lit_asyncfl import FederatedTrainer
from lit_asyncfl.algorithms import FedAsync
from lit_asyncfl.data import DigitsDataModule, PartitionedDataModule
from lit_asyncfl.models import LeNet5


class MapStyle(Dataset):
    """An ordinary map-style dataset over the same tensors."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


class UserDigits(L.LightningDataModule):
    """The digits as a user would write a data module around an ordinary dataset."""

    def setup(self, stage: str) -> None:
        self.digits = DigitsDataModule()
        self.digits.setup(stage)

    def train_dataloader(self) -> DataLoader:
        x, y = self.digits.train_set.tensors
        return DataLoader(MapStyle(x, y), batch_size=10, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self.digits.val_dataloader()


def run(kind: str, versions: int) -> tuple[float, int, torch.Tensor]:
    trainer = FederatedTrainer(
        FedAsync(alpha=0.6, staleness="polynomial", a=0.5, concurrency=10),
        num_clients=100,
        max_versions=versions,
        eval_every=25,
        seed=0,
        logger=False,
        enable_progress_bar=False,
        print_summary=False,
        default_root_dir=tempfile.mkdtemp(),
    )
    model = LeNet5(input_size=8, lr=0.05)
    if kind == "resident":
        data = DigitsDataModule(partition="dirichlet", alpha=0.5, batch_size=10)
    else:
        data = PartitionedDataModule(UserDigits(), partition="dirichlet", alpha=0.5)
    start = time.perf_counter()
    trainer.fit(model, datamodule=data)
    seconds = time.perf_counter() - start
    assert trainer.simulator is not None
    return seconds, trainer.summary["updates_received"], trainer.simulator.server.weights


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--versions", type=int, default=1500)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    times: dict[str, list[float]] = {"resident": [], "dataset": []}
    weights = {}
    updates = 0
    for _ in range(args.repeats):
        for kind in times:
            seconds, updates, w = run(kind, args.versions)
            times[kind].append(seconds)
            weights[kind] = w
    same = torch.equal(weights["resident"], weights["dataset"])
    for kind, values in times.items():
        median = statistics.median(values)
        print(f"{kind:9s} {median:7.2f} s for {updates} updates: {updates / median:8.1f} updates/s")
    print(f"same final weights: {same}")
    ratio = statistics.median(times["dataset"]) / statistics.median(times["resident"])
    print(f"dataset_vs_resident={ratio:.2f}")


if __name__ == "__main__":
    main()
