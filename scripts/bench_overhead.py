"""Per-update overhead of the fast local trainer against a raw PyTorch loop doing the same SGD steps.

The raw loop is the physical limit for the same work: one reused model, client shards pre-sliced as tensors, a
fresh SGD optimizer per update, weights loaded and read as flat vectors. Both run the same jobs (same start
weights, same batch order), interleaved in one process and repeated; medians are compared.

    python scripts/bench_overhead.py                 # digits, LeNet-5, ~18 samples per client, E=1, batch 10
    python scripts/bench_overhead.py --epochs 5 --clients 8

The last line is machine-readable: ``fast_vs_raw=<ratio> identical=<bool>``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.utils import parameters_to_vector

from lit_asyncfl.core.update import ClientJob, JobTiming, derive_seed
from lit_asyncfl.data import DigitsDataModule
from lit_asyncfl.engines.fast import FastEngine
from lit_asyncfl.models import LeNet5


def raw_update(model, x, y, start_views, seed, epochs, batch_size, lr):
    with torch.no_grad():
        torch._foreach_copy_(list(model.parameters()), start_views)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(epochs):
        order = torch.randperm(len(y), generator=generator).to(y.device)  # (once per epoch, as the engines)
        for s in range(0, len(y), batch_size):
            idx = order[s : s + batch_size]
            loss = F.cross_entropy(model(x[idx]), y[idx])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    return parameters_to_vector(model.parameters()).detach().clone()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=80, help="IID clients (80 gives ~18 samples each)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    dm = DigitsDataModule(partition="iid", batch_size=args.batch_size)
    dm.setup("fit")
    shards = dm.client_shards(args.clients, seed=0)
    model = LeNet5(lr=0.05)
    fast = FastEngine(model, shards, args.batch_size)
    raw_model = LeNet5(lr=0.05)
    sliced = [(shards.inputs[i], shards.targets[i]) for i in shards.indices]  # pre-sliced per client
    start = fast.flat.read()
    start_views = fast.flat.param_views(start)  # shaped like the parameters, for the raw loop's copy
    jobs = [
        ClientJob(j, j % args.clients, 0, 0.0, JobTiming(0, 0, 0), derive_seed(0, j), args.epochs)
        for j in range(args.clients)
    ]

    def run_raw():
        return [
            raw_update(raw_model, *sliced[j.client], start_views, j.seed, args.epochs, args.batch_size, 0.05)
            for j in jobs
        ]

    def run_fast():
        return [fast.train(j, start).weights for j in jobs]

    identical = all(torch.equal(a, b) for a, b in zip(run_raw(), run_fast()))  # warm-up and equality check
    times = {"raw": [], "fast": []}
    for _ in range(args.repeats):
        for name, fn in (("raw", run_raw), ("fast", run_fast)):
            t0 = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - t0) / len(jobs))
    med = {k: statistics.median(v) for k, v in times.items()}
    samples = np.mean([len(i) for i in shards.indices])
    print(
        f"{len(jobs)} updates x {args.repeats} repeats, {samples:.1f} samples/client, E={args.epochs}, "
        f"batch {args.batch_size}, {args.threads} thread(s)"
    )
    print(f"{'engine':<8}{'median ms/update':>18}{'ratio vs raw':>14}")
    for name in ("raw", "fast"):
        print(f"{name:<8}{med[name] * 1e3:>18.3f}{med[name] / med['raw']:>14.3f}")
    print(f"fast_vs_raw={med['fast'] / med['raw']:.3f} identical={identical}")


if __name__ == "__main__":
    main()
