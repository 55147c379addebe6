"""Fingerprint the final global weights of a matrix of small runs, to show that a refactoring changes no result.

Every preset of :data:`lit_asyncfl.algorithms.PRESETS` runs on each engine (``fast``, ``lightning``, ``cohort``)
with the sequential executor, and a few presets run on the Ray executor with the ``fast`` engine: tiny runs on the
bundled digits (a LeNet-5, 50 clients, 6 versions; mobile devices for the semi-asynchronous rounds). Each cell's
result is the sha256 of the final global weights (the model's ``state_dict`` tensors' bytes, in order); a cell
that the engine refuses at construction or fit start is recorded as refused, with the message's first line.

    python scripts/refactor_weights.py --out /tmp/weights_before.json      # record, before the change
    python scripts/refactor_weights.py --compare /tmp/weights_before.json  # after: identical/different per cell

With ``--compare`` the last line is ``cells=N identical=M`` (a refused cell is identical when it is refused in both).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import logging
import sys
import tempfile
import time
import warnings

ENGINES = ("fast", "lightning", "cohort")
RAY_PRESETS = ("fedasync", "fedbuff", "fedavg", "fedasmu", "fedhist", "asfl", "moon")


def _algorithm(preset: str):
    from lit_asyncfl.algorithms import ASFL, PRESETS
    from lit_asyncfl.rl import FixedAction

    if preset == "asfl":  # ASFL's learned controller: a fixed action, few rounds
        return ASFL(controller=FixedAction(2, 1), selected=4, rounds=6, max_latency=300.0)
    return PRESETS[preset]()


def run_cell(preset: str, engine: str, executor: str) -> dict[str, str]:
    """One run: ``{"sha256": ...}``, or ``{"refused": message}`` when the configuration is refused up front."""
    from lit_asyncfl import FederatedTrainer
    from lit_asyncfl.data import DigitsDataModule
    from lit_asyncfl.executors import RayExecutor
    from lit_asyncfl.mobility import MobileEdgeDevices
    from lit_asyncfl.models import LeNet5

    try:
        algorithm = _algorithm(preset)
        rounds = type(algorithm.scheduler).__name__ == "SemiAsyncRounds"  # ASFL, SAFA, FedCS, Oort: mobile devices
        trainer = FederatedTrainer(
            algorithm,
            num_clients=50,
            device_model=MobileEdgeDevices() if rounds else None,
            max_versions=6,
            eval_every=2,
            seed=1,
            logger=False,
            enable_progress_bar=False,
            print_summary=False,
            checkpoint_every_seconds=None,
            default_root_dir=tempfile.mkdtemp(prefix="refactor_weights_"),
            engine=engine,
            executor=RayExecutor(num_workers=2) if executor == "ray" else "sequential",
        )
        model = LeNet5(lr=0.05)
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            trainer.fit(model, datamodule=DigitsDataModule())
    except (ValueError, TypeError) as exc:
        return {"refused": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"}
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    assert isinstance(trainer.summary.get("versions"), int)
    return {"sha256": digest.hexdigest(), "versions": str(trainer.summary["versions"])}


def cells() -> list[tuple[str, str, str]]:
    from lit_asyncfl.algorithms import PRESETS

    matrix = [(preset, engine, "sequential") for preset in PRESETS for engine in ENGINES]
    return matrix + [(preset, "fast", "ray") for preset in RAY_PRESETS]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the fingerprints (JSON) here")
    parser.add_argument("--compare", help="a JSON written by --out: print identical/different per cell")
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray cells")
    args = parser.parse_args()
    logging.getLogger("lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    logging.getLogger("lit_asyncfl").setLevel(logging.ERROR)
    results: dict[str, dict[str, str]] = {}
    start = time.perf_counter()
    for preset, engine, executor in cells():
        if executor == "ray" and args.no_ray:
            continue
        key = f"{preset}/{engine}/{executor}"
        results[key] = run_cell(preset, engine, executor)
        print(f"{key}: {results[key]}", file=sys.stderr, flush=True)
    with contextlib.suppress(Exception):
        import ray

        if ray.is_initialized():
            ray.shutdown()
    print(f"({time.perf_counter() - start:.0f} s)", file=sys.stderr)
    refused = [key for key, value in results.items() if "refused" in value]
    print(f"refused ({len(refused)}): {', '.join(refused) or 'none'}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1, sort_keys=True)
    if args.compare:
        with open(args.compare) as f:
            before = json.load(f)
        identical = 0
        for key, value in results.items():
            same = before.get(key) == value
            identical += same
            print(f"{key}: {'identical' if same else f'DIFFERENT (before {before.get(key)}, now {value})'}")
        missing = sorted(set(before) - set(results))
        if missing:
            print(f"not run now: {', '.join(missing)}")
        print(f"cells={len(results)} identical={identical}")
        return 0 if identical == len(results) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
