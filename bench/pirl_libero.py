"""πRL in miniature on LIBERO-Spatial task 0: SFT of a flow-matching policy, then GRPO with Flow-SDE.

    uv run python bench/pirl_libero.py [--sft-steps 8000] [--start-below 0.8] [--rl-steps 10] [--eval-every 5]
        [--root runs/pirl_libero] [--sft-dir DIR] [--start-step N] [--out FILE] [--plot PNG]
        [--seed S] [--replot OUT_FILE... --plot PNG]

The stages run as a user runs them, each a ``uv run`` spawned by the bench, with logs under ``--root``:

1. ``apps/embodied/sft.py --config-name libero_spatial_sft_flow`` for ``--sft-steps`` optimizer steps (a
   checkpoint every ``runner.save_interval`` of the config), then its env evaluation of the final weights on
   the held-out initial states 40-49 (``data.eval_env``). The demonstrations must exist (the config's header
   gives the ``collect.py`` command). ``--sft-dir`` reuses an earlier SFT run instead.
2. The start of RL: the final SFT checkpoint when its success is below ``--start-below``; otherwise the earlier
   checkpoints are evaluated, latest first, with ``apps/embodied/eval.py`` (``runner.resume_dir=none
   actor.model.model_path=<checkpoint>``) until one scores below it, so that RL has room to improve.
   ``--start-step`` names the checkpoint instead.
3. ``apps/embodied/train.py --config-name libero_spatial_task0_grpo_flow actor.model.model_path=<start>`` for
   ``--rl-steps`` steps, evaluated every ``--eval-every`` steps (step 0 evaluates the start policy on the same
   held-out states as SFT's evaluation).

The bench reads the runs' ``metrics.jsonl`` and prints a markdown table (SFT success, the start policy's, RL's
per evaluation, the training episodes' success and seconds per RL step), to stdout and to ``--out`` with one
JSON row; ``--plot`` draws the evaluation success against the RL step.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from pickcube_rlpd import _records
from startup_cartpole import _seed_args, _user_env, _uv

ROOT = Path(__file__).resolve().parents[1]
SFT_CONFIG = "libero_spatial_sft_flow"
RL_CONFIG = "libero_spatial_task0_grpo_flow"
TARGET_GAIN = 0.2  # RL must raise the held-out success by this much over the policy it starts from


def _spawn(cmd: list[str], log: Path) -> tuple[str, float]:
    """Run ``cmd`` in the repository root (stderr to ``log``); its stdout and wall seconds, or raise."""
    start = time.perf_counter()
    with open(log, "w") as err:
        done = subprocess.run(cmd, cwd=ROOT, env=_user_env(), stdout=subprocess.PIPE, stderr=err, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[2:5])} failed ({done.returncode}):\n{log.read_text()[-3000:]}")
    return done.stdout, wall


def _last_json(text: str) -> dict[str, Any]:
    """The last JSON object printed at the start of a line (``sft.py`` / ``eval.py`` print their metrics so)."""
    decoder = json.JSONDecoder()
    for match in reversed(list(re.finditer(r"(?m)^\{|: \{", text))):
        try:
            obj, _ = decoder.raw_decode(text, match.end() - 1)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            return obj
    raise RuntimeError(f"no JSON metrics in the output:\n{text[-2000:]}")


def _checkpoints(run: Path) -> dict[int, Path]:
    found = {}
    for path in (run / "checkpoints").glob("global_step_*"):
        found[int(path.name.rsplit("_", 1)[1])] = path
    return dict(sorted(found.items()))


def run_sft(root: Path, steps: int) -> dict[str, Any]:
    """Stage 1: SFT and its env evaluation of the final weights."""
    run = root / "sft"
    run.mkdir(parents=True, exist_ok=True)
    cmd = [_uv(), "run", "apps/embodied/sft.py", "--config-name", SFT_CONFIG, f"runner.logger.log_path={run}"]
    cmd += ["runner.logger.logger_backends=[]", "runner.progress_bar=false", f"runner.max_epochs={steps}"]
    out, wall = _spawn(cmd, root / "sft.stderr.txt")
    evaluation = _last_json(out)
    records = _records(run / "metrics.jsonl")
    train_s = max((r["time/train_wall_s"] for r in records if "time/train_wall_s" in r), default=None)
    return {
        "dir": str(run),
        "steps": steps,
        "success": evaluation["eval/success_rate"],
        "train_s": train_s,
        "wall_s": wall,
    }


def evaluate_checkpoint(root: Path, checkpoint: Path) -> float:
    """The held-out success of an SFT checkpoint, with ``eval.py`` and the RL config's evaluation envs."""
    log = root / f"eval_{checkpoint.name}"
    cmd = [_uv(), "run", "apps/embodied/eval.py", "--config-name", RL_CONFIG, "runner.resume_dir=none"]
    cmd += [f"actor.model.model_path={checkpoint}", f"runner.logger.log_path={log}"]
    cmd += ["runner.logger.logger_backends=[]", "runner.progress_bar=false"]
    out, _ = _spawn(cmd, root / f"eval_{checkpoint.name}.stderr.txt")
    return float(_last_json(out)["eval/success_rate"])


def choose_start(root: Path, sft: dict[str, Any], below: float, step: int | None) -> dict[str, Any]:
    """Stage 2: the SFT checkpoint RL starts from, with the evaluations that chose it."""
    found = _checkpoints(Path(sft["dir"]))
    if not found:
        raise RuntimeError(f"no checkpoint under {sft['dir']}/checkpoints")
    if step is not None:
        if step not in found:
            raise SystemExit(f"--start-step {step}: the SFT run has checkpoints {sorted(found)}")
        return {"step": step, "path": str(found[step]), "tried": {}}
    last = max(found)
    tried = {last: sft["success"]}
    if sft["success"] < below:
        return {"step": last, "path": str(found[last]), "tried": tried}
    for s in sorted(found, reverse=True)[1:]:
        tried[s] = evaluate_checkpoint(root, found[s])
        print(f"SFT checkpoint {s}: held-out success {tried[s]:.2f}", file=sys.stderr, flush=True)
        if tried[s] < below:
            return {"step": s, "path": str(found[s]), "tried": tried}
    first = min(found)
    return {"step": first, "path": str(found[first]), "tried": tried}


def run_rl(root: Path, start: Path, steps: int, eval_every: int, seed: int | None) -> dict[str, Any]:
    """Stage 3: GRPO from ``start`` (the config's seeds, or ``seed``'s); its evaluations and per-step timings.

    The final weights are kept (``<root>/rl/checkpoints``) for ``eval.py``.
    """
    run = root / "rl"
    run.mkdir(parents=True, exist_ok=True)
    cmd = [
        _uv(),
        "run",
        "apps/embodied/train.py",
        "--config-name",
        RL_CONFIG,
        f"actor.model.model_path={start}",
    ]
    cmd += [f"runner.logger.log_path={run}", "runner.logger.logger_backends=[]", "runner.progress_bar=false"]
    cmd += [
        f"runner.max_epochs={steps}",
        f"runner.val_check_interval={eval_every}",
        "runner.save_interval=0",
    ]
    cmd += [] if seed is None else _seed_args(seed)
    _, wall = _spawn(cmd, root / "rl.stderr.txt")
    records = _records(run / "metrics.jsonl")
    evals = [(int(r["step"]), r["eval/success_rate"]) for r in records if "eval/success_rate" in r]
    steps_rec = [r for r in records if "time/step_s" in r]
    return {
        "dir": str(run),
        "evals": evals,
        "train_success": [r.get("env/success_rate") for r in steps_rec],
        "step_s": [r["time/step_s"] for r in steps_rec],
        "eval_s": [r["time/eval_s"] for r in records if "time/eval_s" in r],
        "wall_s": wall,
    }


def table(row: dict[str, Any]) -> str:
    sft, start, rl = row["sft"], row["start"], row["rl"]
    base = rl["evals"][0][1]
    lines = ["| stage | held-out success (10 episodes) | cost |", "|---|---:|---|"]
    if sft["train_s"] is None:
        cost = f"reused: {sft['dir']}"
    else:
        cost = f"{sft['train_s']:.0f} s of training, {sft['wall_s']:.0f} s from spawn"
    lines.append(f"| SFT, final checkpoint (step {sft['steps']}) | {sft['success']:.2f} | {cost} |")
    for s, rate in sorted(start["tried"].items(), reverse=True)[1:]:
        lines.append(f"| SFT checkpoint step {s} (`eval.py`) | {rate:.2f} | |")
    lines.append(f"| RL step 0 = start policy (SFT step {start['step']}) | {base:.2f} | |")
    for step, rate in rl["evals"][1:]:
        lines.append(f"| RL step {step} | {rate:.2f} | |")
    steps = rl["step_s"]
    lines.append("")
    lines.append(
        f"RL: {len(steps)} steps, {statistics.median(steps):.0f} s per step (median; min {min(steps):.0f}, "
        f"max {max(steps):.0f}), {statistics.mean(rl['eval_s']):.0f} s per evaluation, "
        f"{rl['wall_s']:.0f} s from spawn."
    )
    rates = ", ".join("-" if r is None else f"{r:.2f}" for r in rl["train_success"])
    lines.append(f"Training episodes' success per RL step: {rates}.")
    best = max(rate for _, rate in rl["evals"])
    gain = best - base
    verdict = "met" if gain >= TARGET_GAIN - 1e-9 else "not met"
    lines.append(
        f"Gain over the start policy: best {best:.2f} - {base:.2f} = {gain:+.2f}, last "
        f"{rl['evals'][-1][1] - base:+.2f} (target +{TARGET_GAIN:.2f}: {verdict})."
    )
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Held-out success against the RL step (step 0: the SFT start policy), one line per RL run, the target dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for row in rows:
        evals = row["rl"]["evals"]
        seed = "config's seeds" if row.get("seed") is None else f"--seed {row['seed']}"
        ax.plot([s for s, _ in evals], [r for _, r in evals], marker="o", label=f"GRPO + Flow-SDE ({seed})")
    row = rows[0]
    base = row["rl"]["evals"][0][1]
    ax.axhline(
        row["sft"]["success"],
        color="black",
        linestyle=":",
        linewidth=1,
        label=f"SFT final (step {row['sft']['steps']})",
    )
    ax.axhline(
        min(1.0, base + TARGET_GAIN),
        color="grey",
        linestyle="--",
        linewidth=1,
        label=f"target: start + {TARGET_GAIN:.1f}",
    )
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel("RL step")
    ax.set_ylabel("held-out success (states 40-49)")
    ax.set_title(f"LIBERO-Spatial task 0: flow policy SFT (start: step {row['start']['step']}) then GRPO")
    ax.title.set_fontsize(9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sft-steps", type=int, default=8000)
    parser.add_argument("--start-below", type=float, default=0.8)
    parser.add_argument("--rl-steps", type=int, default=10)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--root", type=Path, default=ROOT / "runs" / "pirl_libero")
    parser.add_argument("--sft-dir", type=Path, help="reuse this SFT run instead of stage 1")
    parser.add_argument("--sft-success", type=float, help="with --sft-dir: its final checkpoint's success")
    parser.add_argument("--start-step", type=int, help="start RL from this SFT checkpoint")
    parser.add_argument(
        "--seed",
        type=int,
        help="RL seeds actor.seed=s+1 env.train.seed=s rollout.seed=s (default: the config's)",
    )
    parser.add_argument("--out", type=Path)
    parser.add_argument("--plot", type=Path, help="write the evaluation curve to this PNG")
    parser.add_argument(
        "--replot",
        type=Path,
        nargs="+",
        help="only redraw --plot from earlier runs' --out files (one line each)",
    )
    args = parser.parse_args()
    if args.replot is not None:
        if args.plot is None:
            parser.error("--replot needs --plot")
        rows = []
        for out in args.replot:
            lines = out.read_text().splitlines()
            rows.append(json.loads(next(line for line in lines if line.startswith("{"))))
        plot(rows, args.plot)
        return 0
    root = args.root.resolve()
    root.mkdir(parents=True, exist_ok=True)
    if args.sft_dir is not None:
        if args.sft_success is None:
            parser.error("--sft-dir needs --sft-success")
        last = max(_checkpoints(args.sft_dir.resolve()))
        sft = {
            "dir": str(args.sft_dir.resolve()),
            "steps": last,
            "success": args.sft_success,
            "train_s": None,
            "wall_s": 0.0,
        }
    else:
        sft = run_sft(root, args.sft_steps)
    print(json.dumps({"sft": sft}), file=sys.stderr, flush=True)
    start = choose_start(root, sft, args.start_below, args.start_step)
    print(json.dumps({"start": start}), file=sys.stderr, flush=True)
    rl = run_rl(root, Path(start["path"]), args.rl_steps, args.eval_every, args.seed)
    row = {"sft": sft, "start": start, "rl": rl, "seed": args.seed}
    text = table(row)
    print(text)
    if args.plot is not None:
        plot([row], args.plot)
    if args.out is not None:
        args.out.write_text(text + "\n\n" + json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
