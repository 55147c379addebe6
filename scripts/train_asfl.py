"""Train ASFL's soft actor-critic over episodes, each a whole federated run, and save the policy.

Every episode builds the run of ``--config`` (an ASFL config, e.g. ``configs/asfl/digits_cnn.yaml``) with seed
``--first-seed + episode`` (new device capabilities, positions, partition and model initialisation each time; keep
the seeds you evaluate on outside this range) and lets one shared :class:`~lit_asyncfl.rl.SACController` choose
``(M_k, tau_k)`` every round, store the transitions and learn. Writes into ``--out``:

- ``config.yaml``: a copy of ``--config`` taken at the start, which every episode reads (so editing the original
  during training changes nothing);
- ``policy.pt``: the policy (saved after every ``--save-every`` episodes and at the end; load it with
  ``--trainer.algorithm.init_args.controller=SACController --trainer.algorithm.init_args.controller.policy=...``);
- ``episodes.csv``: per episode the objective, return (sum of rewards), final accuracy, total latency, mean
  ``M_k`` and ``tau_k``, deprecated devices and wall seconds;
- ``learning_curve.png``: objective and return against the episode.

``--resume`` continues from ``policy.pt``, ``episodes.csv`` and ``config.yaml`` (the replay buffer starts empty
again; episodes after the last saved policy are dropped from ``episodes.csv`` and run again).

    python scripts/train_asfl.py --config configs/asfl/digits_cnn.yaml --episodes 150 --out runs/asfl_policy
"""

from __future__ import annotations

import argparse
import csv
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

COLUMNS = (
    "episode",
    "seed",
    "objective",
    "episode_return",
    "final_accuracy",
    "total_latency",
    "mean_picked",
    "mean_tolerance",
    "deprecated_total",
    "wall_seconds",
)


def build_run(config: str, settings: list[str], seed: int, root: str) -> Any:
    """The CLI's trainer, model and data module for one episode (nothing is run)."""
    from lit_asyncfl.cli import FederatedCLI

    argv = [
        "--config",
        config,
        "--trainer.algorithm.init_args.controller=FixedAction",  # replaced by the shared controller; loads nothing
        *settings,
        f"--trainer.seed={seed}",
        "--trainer.enable_progress_bar=false",
        "--trainer.print_summary=false",
        "--trainer.logger=false",
        f"--trainer.default_root_dir={root}",
    ]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="LightningCLI's args parameter")
        return FederatedCLI(args=argv, run=False)


def read_episodes(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def write_episodes(rows: list[dict[str, Any]], path: Path) -> None:
    """Rewrite ``episodes.csv`` (atomically: an interruption leaves the previous version)."""
    tmp = path.with_suffix(".csv.tmp")
    with open(tmp, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    tmp.replace(path)


def plot_learning_curve(rows: list[dict[str, Any]], path: Path, window: int = 10) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    episodes = np.array([int(r["episode"]) for r in rows])
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    for ax, key in zip(axes, ("objective", "episode_return")):
        values = np.array([float(r[key]) if r[key] not in ("", "None") else np.nan for r in rows])
        ax.plot(episodes, values, alpha=0.35, label="episode")
        if len(values) >= window:
            smooth = np.convolve(np.nan_to_num(values), np.ones(window) / window, mode="valid")
            ax.plot(episodes[window - 1 :], smooth, label=f"mean of {window}")
        ax.set_xlabel("episode")
        ax.set_ylabel(key)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="an ASFL config (trainer.algorithm an ASFL)")
    parser.add_argument("--episodes", type=int, default=150, help="episodes (federated runs) to train for")
    parser.add_argument("--out", required=True, help="output directory (policy.pt, episodes.csv, learning_curve.png)")
    parser.add_argument("--first-seed", type=int, default=1000, help="seed of the first episode (then +1 each)")
    parser.add_argument("--set", nargs="*", default=[], help="extra CLI arguments for every run, as key=value")
    parser.add_argument("--picked", type=int, nargs="+", default=None, help="choices of M_k (default 1..S)")
    parser.add_argument("--tolerance", type=int, nargs="+", default=[1, 2, 3, 4], help="choices of tau_k")
    parser.add_argument("--lr", type=float, default=3e-4, help="Adam learning rate of the agent")
    parser.add_argument("--updates-per-round", type=int, default=4, help="gradient steps after each round")
    parser.add_argument("--batch-size", type=int, default=64, help="transitions per gradient step")
    parser.add_argument("--hidden", type=int, default=128, help="actor width (critics: hidden, hidden/2)")
    parser.add_argument("--target-entropy-ratio", type=float, default=0.5, help="target entropy / log |A|")
    parser.add_argument("--agent-seed", type=int, default=0, help="seed of the agent")
    parser.add_argument("--save-every", type=int, default=1, help="save the policy every this many episodes")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--resume", action="store_true", help="continue from --out's policy.pt and episodes.csv")
    args = parser.parse_args(argv)
    if args.episodes < 1:
        parser.error(f"--episodes must be >= 1, got {args.episodes}")
    if not Path(args.config).is_file():
        parser.error(f"config {args.config!r} not found")

    import numpy as np
    import torch
    from tqdm.auto import tqdm

    from lit_asyncfl.rl import SACController

    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    policy_path, episodes_path, config = out / "policy.pt", out / "episodes.csv", out / "config.yaml"
    rows = read_episodes(episodes_path) if args.resume else []
    if args.resume and not policy_path.exists():
        parser.error(f"--resume: {policy_path} does not exist")
    if not args.resume and (policy_path.exists() or episodes_path.exists()):
        parser.error(f"{out} already holds a training run; pass --resume to continue it or choose another --out")
    if not (args.resume and config.exists()):
        config.write_text(Path(args.config).read_text())
    saved = torch.load(policy_path, weights_only=True).get("episodes") if args.resume else 0
    saved = len(rows) if saved is None else saved
    if len(rows) > saved:  # episodes run after the last save: the policy has not learnt from them
        rows = rows[:saved]
        write_episodes(rows, episodes_path)
    settings = [s if s.startswith("--") else f"--{s}" for s in args.set]
    controller = SACController(
        picked_choices=args.picked,
        tolerance_choices=args.tolerance,
        policy=str(policy_path) if args.resume else None,
        train=True,
        updates_per_round=args.updates_per_round,
        lr=args.lr,
        batch_size=args.batch_size,
        hidden=args.hidden,
        target_entropy_ratio=args.target_entropy_ratio,
        seed=args.agent_seed,
    )
    start = len(rows)
    bar = tqdm(range(start, start + args.episodes), desc="ASFL episodes", unit="episode", dynamic_ncols=True)
    try:
        with tempfile.TemporaryDirectory() as root:
            for episode in bar:
                row = run_episode(args, parser, controller, str(config), settings, episode, root)
                rows.append(row)
                write_episodes(rows, episodes_path)
                recent = [float(r["objective"]) for r in rows[-10:]]
                bar.set_postfix(
                    objective=f"{row['objective']:.3f}", last10=f"{np.mean(recent):.3f}", M=row["mean_picked"]
                )
                if (episode + 1) % args.save_every == 0:
                    controller.save(policy_path, episodes=len(rows))
    finally:  # whatever stopped the training, keep what was learnt (with the episodes it saw, for --resume)
        if controller.is_set_up:
            controller.save(policy_path, episodes=len(rows))
        if rows:
            plot_learning_curve(rows, out / "learning_curve.png")
    print(f"policy saved to {policy_path}; {len(rows)} episodes in {episodes_path}")
    return 0


def run_episode(
    args: argparse.Namespace,
    parser: argparse.ArgumentParser,
    controller: Any,
    config: str,
    settings: list[str],
    episode: int,
    root: str,
) -> dict[str, Any]:
    """One federated run with the shared controller; its row of ``episodes.csv``."""
    import numpy as np

    from lit_asyncfl.schedulers import SemiAsyncRounds

    seed = args.first_seed + episode
    cli = build_run(config, settings, seed, root)
    scheduler = cli.trainer.algorithm.scheduler
    if not isinstance(scheduler, SemiAsyncRounds):
        parser.error(f"{args.config} is not an ASFL run (its scheduler is {type(scheduler).__name__})")
    budget = cli.trainer.max_versions
    if budget is not None and budget < scheduler.rounds:
        parser.error(f"trainer.max_versions={budget} ends an episode before its {scheduler.rounds} rounds; "
                     f"set it to >= {scheduler.rounds}")  # fmt: skip
    scheduler.controller = controller
    controller.setup(scheduler.count)
    began = time.perf_counter()
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    summary = cli.trainer.summary
    if summary["objective"] is None:  # Ctrl-C, a virtual-time budget, a stall: not a whole episode
        raise SystemExit(
            f"episode {episode} stopped after {summary['rounds']} of {scheduler.rounds} rounds "
            f"({summary['stop_reason']}); the policy is saved with the {episode} complete episodes before it"
        )
    rounds = [r for r in cli.trainer.history if "round" in r]
    return {
        "episode": episode,
        "seed": seed,
        "objective": summary["objective"],
        "episode_return": summary["episode_return"],
        "final_accuracy": summary["final_accuracy"],
        "total_latency": summary["total_latency"],
        "mean_picked": float(np.mean([r["num_picked"] for r in rounds])),
        "mean_tolerance": float(np.mean([r["lag_tolerance"] for r in rounds])),
        "deprecated_total": summary["deprecated_total"],
        "wall_seconds": round(time.perf_counter() - began, 2),
    }


if __name__ == "__main__":
    sys.exit(main())
