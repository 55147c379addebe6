"""What availability costs: updates per wall second with and without devices that come and go.

Runs the quickstart setting (FedAsync, LeNet-5, 100 clients, Dirichlet 0.5 digits) for ``--time`` virtual seconds
three ways, interleaved and repeated (medians): every device always available (the default, the reference);
``MarkovOnOff`` with periods so long that no device ever goes offline (the availability machinery at work — who is
online, planned drops — with the reference's work; its results equal the reference's); and ``MarkovOnOff`` with half
of the devices offline (a different run: fewer updates, some dropped). Then the same three with ``--clients-large``
clients of LogisticRegression (where the per-event cost of asking who is online over many devices shows, since a
client update is cheap).

    python scripts/bench_availability.py                     # ~2 minutes on 2 cores
    python scripts/bench_availability.py --repeats 5 --time 20000

The last line is machine-readable: ``overhead_quickstart=<ratio> overhead_large=<ratio> identical=<bool>``
(ratio: the machinery's wall seconds per update over the reference's).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch
from bench_scale import replicated_digits  # (scripts/ is on the path when a script runs)

from lit_asyncfl import FederatedTrainer
from lit_asyncfl.algorithms import FedAsync
from lit_asyncfl.availability import AlwaysAvailable, MarkovOnOff
from lit_asyncfl.data import DigitsDataModule
from lit_asyncfl.devices import UniformRatio
from lit_asyncfl.models import LeNet5, LogisticRegression

SETTINGS = {
    "always": lambda: AlwaysAvailable(),
    "never offline": lambda: MarkovOnOff(mean_on=1e12, mean_off=1.0),  # online w.p. ~1 - 1e-12, for ~forever
    "half offline": lambda: MarkovOnOff(mean_on=400.0, mean_off=400.0),
}


def one_run(setting: str, clients: int, virtual_time: float, large: bool) -> tuple[float, int, int, torch.Tensor]:
    """(wall seconds, updates received, jobs dropped, final weights) of one run."""
    trainer = FederatedTrainer(
        FedAsync(alpha=0.6, a=0.5, concurrency=10 if not large else 50),
        num_clients=clients,
        max_virtual_time=virtual_time,
        device_model=UniformRatio(ratio=5.0),
        availability=SETTINGS[setting](),
        eval_every=10**9,  # evaluate at the start and the end only: the loop is what is measured
        logger=False,
        enable_progress_bar=False,
        print_summary=False,
        checkpoint_every_seconds=None,
        default_root_dir=tempfile.mkdtemp(),
    )
    if large:
        model, data = LogisticRegression(input_dim=64), replicated_digits(clients * 18)[0]
    else:
        model, data = LeNet5(input_size=8, lr=0.05), DigitsDataModule(partition="dirichlet", alpha=0.5, batch_size=10)
    start = time.perf_counter()
    trainer.fit(model, datamodule=data)
    wall = time.perf_counter() - start
    s = trainer.summary
    return wall, s["updates_received"], s["updates_dropped"], trainer.simulator.server.weights.clone()


def bench(clients: int, virtual_time: float, repeats: int, large: bool) -> tuple[dict[str, list[float]], bool]:
    per_update: dict[str, list[float]] = {k: [] for k in SETTINGS}
    counts: dict[str, tuple[int, int]] = {}
    weights: dict[str, torch.Tensor] = {}
    for _ in range(repeats):
        for setting in SETTINGS:
            wall, received, dropped, w = one_run(setting, clients, virtual_time, large)
            per_update[setting].append(wall / max(received, 1))
            counts[setting], weights[setting] = (received, dropped), w
    identical = torch.equal(weights["always"], weights["never offline"])
    label = f"{clients} clients, {'LogisticRegression' if large else 'LeNet-5'}, {virtual_time:g} virtual s"
    print(f"\n{label}")
    print("| availability | updates received | jobs dropped | updates / wall s (median) | vs always |")
    print("| --- | --- | --- | --- | --- |")
    reference = statistics.median(per_update["always"])
    for setting, values in per_update.items():
        median = statistics.median(values)
        received, dropped = counts[setting]
        print(f"| {setting} | {received:,} | {dropped:,} | {1 / median:,.0f} | {median / reference:.3f}x |")
    return per_update, identical


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time", type=float, default=15000.0, help="virtual seconds per quickstart run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--clients-large", type=int, default=10000)
    parser.add_argument("--time-large", type=float, default=3000.0, help="virtual seconds per large run")
    args = parser.parse_args()
    torch.set_num_threads(1)
    small, same_small = bench(100, args.time, args.repeats, large=False)
    large, same_large = bench(args.clients_large, args.time_large, args.repeats, large=True)

    def overhead(results: dict[str, list[float]]) -> float:
        return statistics.median(results["never offline"]) / statistics.median(results["always"])

    print(
        f"overhead_quickstart={overhead(small):.3f} overhead_large={overhead(large):.3f} "
        f"identical={same_small and same_large}"
    )


if __name__ == "__main__":
    main()
