"""Peak memory and wall time of a short simulation with many clients (digits-sized shards, LeNet-5).

Each size runs in a fresh process: the digits training set is replicated until every client holds
``--samples`` samples (IID), and FedAsync with a fixed concurrency runs ``--versions`` aggregations, so the runs
differ only in the number of (mostly idle) clients. Memory should grow with the clients only by their data and
small per-client state; the table shows the growth per client next to the bytes of data per client.

    python scripts/bench_scale.py                          # 1,000 and 10,000 clients
    python scripts/bench_scale.py --clients 100 1000 10000 --versions 300

The last line is machine-readable: ``peak_rss_mb_<clients>=<MB> ...``.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import tempfile
import time
from typing import Any


def _rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def replicated_digits(n: int) -> tuple[Any, Any, Any]:
    """The digits training set repeated to ``n`` samples, as a data module split IID over the clients (validated
    on the digits), with its inputs and labels."""
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    from lit_asyncfl.data import DigitsDataModule, PartitionedDataModule

    base = DigitsDataModule()
    base.setup("fit")
    x, y = base.train_set.tensors
    copies = math.ceil(n / len(y))
    x_all, y_all = x.repeat(copies, 1, 1, 1)[:n].clone(), y.repeat(copies)[:n].clone()

    class Replicated(L.LightningDataModule):
        def train_dataloader(self) -> DataLoader:
            return DataLoader(TensorDataset(x_all, y_all), batch_size=10)

        def val_dataloader(self) -> DataLoader:
            return base.val_dataloader()

    return PartitionedDataModule(Replicated(), partition="iid"), x_all, y_all


def child(num_clients: int, samples: int, versions: int, concurrency: int, engine: str) -> dict[str, float]:
    """One run in this process; returns its measurements."""
    from lit_asyncfl import FederatedTrainer
    from lit_asyncfl.algorithms import FedAsync
    from lit_asyncfl.models import LeNet5

    datamodule, x_all, y_all = replicated_digits(num_clients * samples)
    data_mb = (x_all.nbytes + y_all.nbytes) / 2**20
    rss_before = _rss_mb()
    with tempfile.TemporaryDirectory() as root:
        trainer = FederatedTrainer(
            FedAsync(concurrency=concurrency),
            num_clients=num_clients,
            max_versions=versions,
            eval_every=versions,
            logger=False,
            enable_progress_bar=False,
            print_summary=False,
            default_root_dir=root,
            engine=engine,
        )
        t0 = time.perf_counter()
        trainer.fit(LeNet5(), datamodule=datamodule)
        wall = time.perf_counter() - t0
    return {
        "clients": num_clients,
        "data_mb": data_mb,
        "rss_before_fit_mb": rss_before,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "wall_s": wall,
        "versions": trainer.summary["versions"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--samples", type=int, default=18, help="training samples per client")
    parser.add_argument("--versions", type=int, default=200, help="aggregations per run")
    parser.add_argument("--concurrency", type=int, default=50, help="clients training at once")
    parser.add_argument("--engine", default="fast")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.child, args.samples, args.versions, args.concurrency, args.engine)))
        return
    rows = []
    for clients in args.clients:
        cmd = [sys.executable, __file__, "--child", str(clients), "--samples", str(args.samples)]
        cmd += ["--versions", str(args.versions), "--concurrency", str(args.concurrency), "--engine", args.engine]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
    print(
        f"FedAsync, concurrency {args.concurrency}, {args.versions} versions, {args.samples} samples/client, "
        f"LeNet-5, engine {args.engine}"
    )
    print(f"{'clients':>8}{'data MB':>10}{'RSS before fit MB':>19}{'peak RSS MB':>13}{'wall s':>9}{'versions':>10}")
    for r in rows:
        print(
            f"{r['clients']:>8}{r['data_mb']:>10.1f}{r['rss_before_fit_mb']:>19.1f}{r['peak_rss_mb']:>13.1f}"
            f"{r['wall_s']:>9.1f}{r['versions']:>10}"
        )
    if len(rows) > 1:
        first, last = rows[0], rows[-1]
        extra = last["clients"] - first["clients"]
        growth = (last["peak_rss_mb"] - first["peak_rss_mb"]) * 2**20 / extra
        data = (last["data_mb"] - first["data_mb"]) * 2**20 / extra
        print(f"peak RSS growth per extra client: {growth / 1024:.2f} KiB (of which data: {data / 1024:.2f} KiB)")
    print(" ".join(f"peak_rss_mb_{r['clients']}={r['peak_rss_mb']:.0f}" for r in rows))


if __name__ == "__main__":
    main()
