"""Cost of one per-client evaluation against one global evaluation, at 100 and 10,000 clients.

Each client holds ``--samples`` 8x8 images (10 classes) of which ``--holdout`` are held out (digits-sized: LeNet-5
of the quickstart); the global evaluation runs the module's ``validation_step`` over a validation set of
``--val-samples`` images in batches of 512, as :class:`~lit_asyncfl.evaluation.GlobalEvaluation` does in a run. Per
number of clients, interleaved and repeated (medians):

- ``global``: one global evaluation (``run_evaluation`` over the validation batches);
- ``batched``: one per-client evaluation of every client (all held-out samples in batches of 512, per-sample
  correctness scattered back to clients: :class:`~lit_asyncfl.per_client.ClientEvaluator`);
- ``per_client_loops``: the fallback for metrics that do not decompose per sample (one evaluation loop per client),
  timed on a subset of ``--loop-clients`` clients and scaled to all;
- ``personalized``: ``--steps`` fine-tuning steps and an evaluation per client, on the same subset, scaled.

    python scripts/bench_client_eval.py                  # 100 and 10,000 clients
    python scripts/bench_client_eval.py --clients 100 --repeats 3

Prints one line per number of clients and per measure: seconds and the ratio to one global evaluation.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from lit_asyncfl.data.shards import ClientShards
from lit_asyncfl.engines import LocalTrainer
from lit_asyncfl.loops.validation_loop import run_evaluation
from lit_asyncfl.models import LeNet5
from lit_asyncfl.per_client import ClientEvaluator, hold_out


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(num_clients: int, args: argparse.Namespace) -> None:
    gen = torch.Generator().manual_seed(0)
    n = num_clients * args.samples
    inputs = torch.randn(n, 1, 8, 8, generator=gen)
    targets = torch.randint(0, 10, (n,), generator=gen)
    train, held = hold_out(np.array_split(np.arange(n), num_clients), args.holdout, seed=0)
    shards = ClientShards(inputs, targets, train)
    torch.manual_seed(0)
    model = LeNet5(input_size=8, lr=0.05)
    val = [
        [torch.randn(len(chunk), 1, 8, 8, generator=gen), torch.randint(0, 10, (len(chunk),), generator=gen)]
        for chunk in torch.arange(args.val_samples).split(512)
    ]
    evaluator = ClientEvaluator(model, shards, held, lambda x: x, 512, torch.device("cpu"))
    weights = evaluator.workspace.flat.read()
    clients = np.arange(num_clients)
    subset = clients[: min(args.loop_clients, num_clients)]
    engine = LocalTrainer(model, shards, 10, (), "cpu")
    times: dict[str, list[float]] = {"global": [], "batched": [], "per_client_loops": [], "personalized": []}
    scale = num_clients / len(subset)
    for _ in range(args.repeats):
        times["global"].append(_timed(lambda: run_evaluation(evaluator.module, [val], "val")))
        times["batched"].append(_timed(lambda: evaluator.evaluate(weights, clients)))
        evaluator.decomposes = False
        times["per_client_loops"].append(scale * _timed(lambda: evaluator.evaluate(weights, subset)))
        evaluator.decomposes = True
        tuned = _timed(lambda: evaluator.personalized(engine, weights, subset, args.steps, 0, 0, 0.0))
        times["personalized"].append(scale * tuned)
    base = statistics.median(times["global"])
    held_total = int(sum(len(h) for h in held))
    print(f"clients={num_clients} held_out_samples={held_total} val_samples={args.val_samples}")
    for name, values in times.items():
        seconds = statistics.median(values)
        print(f"  {name:<17} {seconds:9.4f} s  ratio_to_global={seconds / base:8.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, nargs="+", default=[100, 10_000])
    parser.add_argument("--samples", type=int, default=18, help="samples per client (digits: 1,437 / 80 clients)")
    parser.add_argument("--holdout", type=float, default=0.2)
    parser.add_argument("--val-samples", type=int, default=10_000)
    parser.add_argument("--loop-clients", type=int, default=100, help="clients timed for the per-client loops")
    parser.add_argument("--steps", type=int, default=5, help="personalization steps")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for num_clients in args.clients:
        measure(num_clients, args)


if __name__ == "__main__":
    main()
