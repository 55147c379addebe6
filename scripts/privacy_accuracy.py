"""Accuracy against the privacy spent: FedAsync and FedBuff on digits under central client-level DP.

Runs each algorithm without DP, with clipping only (z = 0), and at a few noise multipliers z, one seed each, and
prints a Markdown table (final and best accuracy, epsilon at delta). Short runs: a sanity measurement, not a study.

    nice -n 5 python scripts/privacy_accuracy.py --noise 0.1 0.3 1.0
    nice -n 5 python scripts/privacy_accuracy.py --mode local --no-baseline --clip 0.3 --noise 0.03 0.1 0.3
"""

from __future__ import annotations

import argparse
import math
import tempfile

from lit_asyncfl import FederatedTrainer
from lit_asyncfl.algorithms import FedAsync, FedBuff
from lit_asyncfl.data import DigitsDataModule
from lit_asyncfl.devices import UniformRatio
from lit_asyncfl.models import LeNet5
from lit_asyncfl.privacy import DifferentiallyPrivate

ALGORITHMS = {
    # configs/fedbuff.yaml and configs/fedasync.yaml, with the same number of client updates (max_updates)
    "FedBuff": lambda: FedBuff(buffer_size=10, server_lr=1.0, staleness_weighting=True, concurrency=20),
    "FedAsync": lambda: FedAsync(alpha=0.6, staleness="hinge", a=10, b=4, concurrency=10),
}


def fit(algorithm, args) -> dict:
    trainer = FederatedTrainer(
        algorithm=algorithm, num_clients=args.clients, local_epochs=1, max_virtual_time=args.time,
        device_model=UniformRatio(ratio=5.0), eval_every=args.eval_every, seed=args.seed, logger=False,
        enable_progress_bar=False, print_summary=False, default_root_dir=tempfile.mkdtemp(),
    )  # fmt: skip
    trainer.fit(LeNet5(input_size=8, lr=0.05), DigitsDataModule(partition="dirichlet", alpha=0.5, batch_size=10))
    return trainer.summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--noise", type=float, nargs="+", default=[0.1, 0.3, 1.0], help="noise multipliers z")
    parser.add_argument("--clip", type=float, default=1.0, help="clipping bound C")
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--time", type=float, default=12000.0, help="virtual seconds per run")
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS))
    parser.add_argument("--mode", choices=("central", "local"), default="central", help="who adds the noise")
    parser.add_argument("--no-baseline", action="store_true", help="skip the run without DP")
    parser.add_argument("--accountant", choices=("rdp", "prv"), default="rdp", help="Opacus's RDP or PRV accountant")
    args = parser.parse_args()
    print(f"digits, {args.clients} clients, Dirichlet(0.5), LeNet-5, {args.time:g} virtual s, seed {args.seed}, "
          f"{args.mode} DP, C = {args.clip:g}, delta = {args.delta:g}\n")  # fmt: skip
    print("| algorithm | z | versions | final accuracy | best accuracy | epsilon | clipped |")
    print("|---|---|---|---|---|---|---|")
    for name in args.algorithms:
        for z in [*([] if args.no_baseline else [None]), 0.0, *args.noise]:
            algo = ALGORITHMS[name]()
            if z is not None:
                algo = DifferentiallyPrivate(
                    algo, args.clip, z, delta=args.delta, mode=args.mode, accountant=args.accountant
                )
            s = fit(algo, args)
            eps = s.get("dp_epsilon" if args.mode == "central" else "dp_local_epsilon")
            eps_text = "no DP" if eps is None else ("inf" if math.isinf(eps) else f"{eps:.3g}")
            clipped = "-" if z is None or args.mode == "local" else f"{s['dp_clipped_fraction']:.2f}"
            print(f"| {name} | {'-' if z is None else f'{z:g}'} | {s['versions']} | {s['final_accuracy']:.3f} | "
                  f"{s['best_accuracy']:.3f} | {eps_text} | {clipped} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
