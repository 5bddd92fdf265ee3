r"""Generate the reasoning app's data offline: ``uv run apps/reasoning/prepare_data.py [--out DIR] ...``.

Problems come from reasoning-gym's ``chain_sum`` task (sums and differences of a few small integers, e.g.
``37 - 8 + 5``). Three JSONL files are written:

- ``train.jsonl``: RL prompts ``{"prompt", "answer", "expression"}``;
- ``eval.jsonl``: held-out prompts (no expression shared with train or SFT);
- ``sft.jsonl``: SFT demonstrations with a short worked ``solution`` ending in ``\boxed{answer}``
  (``12 + 7 - 3`` → ``12 + 7 = 19. 19 - 3 = 16. The answer is \boxed{16}.``).

Every answer is checked by the same math verifier as the reward (``rlinf_algos`` ``MathReward``): a
demonstration's ``\boxed{}`` must verify against its answer.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

DEFAULT_OUT = Path(__file__).resolve().parent / "data" / "chain_sum"
INSTRUCTION = "Compute {expression}. Put the final answer in \\boxed{{}}."


def _terms(expression: str) -> tuple[list[int], list[str]]:
    """``"12 + 7 - 3"`` → ``([12, 7, 3], ["+", "-"])``."""
    tokens = expression.split()
    numbers = [int(t) for t in tokens[0::2]]
    ops = tokens[1::2]
    if any(op not in "+-" for op in ops) or len(numbers) != len(ops) + 1:
        raise ValueError(f"unexpected chain_sum expression {expression!r}")
    return numbers, ops


def worked_solution(expression: str) -> tuple[str, int]:
    r"""A left-to-right worked solution ending in ``\boxed{}``, and the value."""
    numbers, ops = _terms(expression)
    value = numbers[0]
    steps = []
    for op, n in zip(ops, numbers[1:], strict=True):
        new = value + n if op == "+" else value - n
        steps.append(f"{value} {op} {n} = {new}.")
        value = new
    return " ".join(steps) + f" The answer is \\boxed{{{value}}}.", value


def _generate(size: int, seed: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    import reasoning_gym

    dataset = reasoning_gym.create_dataset(
        "chain_sum",
        size=size,
        seed=seed,
        min_terms=args.min_terms,
        max_terms=args.max_terms,
        min_digits=args.min_digits,
        max_digits=args.max_digits,
    )
    rows = []
    for item in dataset:
        expression = item["metadata"]["expression"]
        solution, value = worked_solution(expression)
        if str(value) != str(item["answer"]):
            raise ValueError(
                f"{expression}: reasoning-gym says {item['answer']}, the worked solution {value}"
            )
        rows.append(
            {
                "prompt": INSTRUCTION.format(expression=expression),
                "answer": str(item["answer"]),
                "solution": solution,
                "expression": expression,
            }
        )
    return rows


def _num_terms(row: dict[str, Any]) -> int:
    return len(row["expression"].split()) // 2 + 1


def _split(pool: list[dict[str, Any]], sizes: dict[str, int]) -> dict[str, list[dict[str, Any]]]:
    """Split ``pool`` into disjoint sets of distinct expressions with the SAME mix of term counts.

    Problems are stratified by their number of terms: each split takes from each stratum its share of the
    generated pool (rounded, the remainder going to the largest strata), so the held-out evaluation measures
    the distribution RL trains on. Deduplicating without strata would drain the small strata (there are only
    200 distinct one-digit two-term sums) into the first split and leave the training set almost without them.

    Raises:
        SystemExit: when a stratum has fewer distinct expressions than its quotas need.
    """
    strata: dict[int, list[dict[str, Any]]] = {}
    seen: set[str] = set()
    counts: dict[int, int] = {}
    for row in pool:
        n = _num_terms(row)
        counts[n] = counts.get(n, 0) + 1
        if row["expression"] not in seen:
            seen.add(row["expression"])
            strata.setdefault(n, []).append(row)
    total = sum(counts.values())
    quotas: dict[str, dict[int, int]] = {}
    for name, size in sizes.items():
        exact = {n: size * c / total for n, c in counts.items()}
        quota = {n: int(x) for n, x in exact.items()}
        for n in sorted(exact, key=lambda k: exact[k] - quota[k], reverse=True)[: size - sum(quota.values())]:
            quota[n] += 1
        quotas[name] = quota
    for n, rows in strata.items():
        need = sum(q.get(n, 0) for q in quotas.values())
        if need > len(rows):
            raise SystemExit(
                f"error: {n}-term problems: the splits need {need} distinct expressions, the task has only "
                f"{len(rows)} (sizes {sizes}); raise --min-terms or --max-digits, or ask for fewer problems"
            )
    out: dict[str, list[dict[str, Any]]] = {name: [] for name in sizes}
    cursor = dict.fromkeys(strata, 0)
    for name in sizes:  # eval first: held out before SFT and train take theirs
        for n, q in quotas[name].items():
            out[name] += strata[n][cursor[n] : cursor[n] + q]
            cursor[n] += q
    order = {id(row): i for i, row in enumerate(pool)}
    return {name: sorted(rows, key=lambda r: order[id(r)]) for name, rows in out.items()}


def _write(path: Path, rows: list[dict[str, Any]], keys: tuple[str, ...]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps({k: r[k] for k in keys}) + "\n" for r in rows))
    tmp.replace(path)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="prepare_data.py", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help=f"output directory (default {DEFAULT_OUT})"
    )
    parser.add_argument("--train", type=int, default=2000, help="RL prompts")
    parser.add_argument("--eval", type=int, default=200, help="held-out evaluation prompts")
    parser.add_argument("--sft", type=int, default=400, help="SFT demonstrations")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--min-terms", type=int, default=3)
    parser.add_argument("--max-terms", type=int, default=3)
    parser.add_argument("--min-digits", type=int, default=1)
    parser.add_argument("--max-digits", type=int, default=1)
    parser.add_argument(
        "--no-verify", action="store_true", help="skip checking answers with the math verifier"
    )
    args = parser.parse_args(argv)
    for name in ("train", "eval", "sft"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")
    pool = _generate(3 * (args.train + args.eval + args.sft), args.seed, args)
    splits = _split(pool, {"eval": args.eval, "sft": args.sft, "train": args.train})
    evals, sft, train = splits["eval"], splits["sft"], splits["train"]
    if not args.no_verify:
        from rlinf_core.rewards import MathVerifier

        with MathVerifier(1) as verifier:
            sample = sft + evals[:50]
            ok = verifier.verify(
                [r["solution"] for r in sample], [[r["answer"]] for r in sample], timeout_s=30.0
            )
        if not all(ok):
            bad = [r["expression"] for r, good in zip(sample, ok, strict=True) if not good]
            raise SystemExit(f"error: the math verifier rejects the worked solutions of {bad[:5]}")
    args.out.mkdir(parents=True, exist_ok=True)
    _write(args.out / "train.jsonl", train, ("prompt", "answer", "expression"))
    _write(args.out / "eval.jsonl", evals, ("prompt", "answer", "expression"))
    _write(args.out / "sft.jsonl", sft, ("prompt", "answer", "solution", "expression"))
    print(f"wrote {len(train)} train, {len(evals)} eval and {len(sft)} SFT rows to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
