r"""Generate the coding task set offline: ``uv run apps/reasoning/prepare_code_data.py [--out DIR] ...``.

Each task asks for one small Python function from a template with a random parameter ("Write a Python
function ``scale(x)`` that returns x multiplied by 7."). A task instance is a (template, parameter) pair;
the splits hold disjoint instances, so the held-out evaluation asks for functions never seen in training
(same templates, new parameters). Three JSONL files are written under ``data/code_tasks/``:

- ``train.jsonl``: RL prompts ``{"prompt", "answer", "task"}``;
- ``eval.jsonl``: held-out prompts;
- ``sft.jsonl``: demonstrations whose ``solution`` is the reference function in a ```` ```python ```` block.

The ``answer`` of a row is its list of hidden tests (``assert scale(3) == 21``): the ``code`` reward runs each
one after the response's program in the sandbox. Expected values come from the reference implementation,
and every SFT solution and a sample of the others are checked by that same reward before anything is
written.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_OUT = Path(__file__).resolve().parent / "data" / "code_tasks"
INSTRUCTION = (
    "Write a Python function `{signature}` that {description}. Reply with the code in a ```python block."
)
TESTS_PER_TASK = 4


@dataclass(frozen=True)
class Template:
    """One family of tasks: a function ``name(args)`` whose body is ``return <body with {k}>``."""

    name: str
    args: str
    description: str
    body: str
    params: tuple[Any, ...]
    inputs: Callable[[random.Random], tuple[Any, ...]]


def _ints(rng: random.Random) -> tuple[Any, ...]:
    return (rng.randint(-20, 40),)


def _lists(rng: random.Random) -> tuple[Any, ...]:
    return ([rng.randint(-9, 30) for _ in range(rng.randint(1, 6))],)


def _words(rng: random.Random) -> tuple[Any, ...]:
    return ("".join(rng.choice("abcdexyz") for _ in range(rng.randint(1, 8))),)


_K = tuple(range(2, 40))
TEMPLATES = (
    Template("scale", "x", "returns x multiplied by {k}", "x * {k}", _K, _ints),
    Template("shift", "x", "returns x plus {k}", "x + {k}", _K, _ints),
    Template("lower", "x", "returns x minus {k}", "x - {k}", _K, _ints),
    Template("square_plus", "x", "returns x squared plus {k}", "x * x + {k}", _K, _ints),
    Template("divides", "x", "returns True if x is divisible by {k}, else False", "x % {k} == 0", _K, _ints),
    Template("scale_all", "xs", "returns a list with every element of xs multiplied by {k}",
             "[v * {k} for v in xs]", _K, _lists),
    Template("sum_above", "xs", "returns the sum of the elements of xs that are greater than {k}",
             "sum(v for v in xs if v > {k})", tuple(range(0, 25)), _lists),
    Template("count_above", "xs", "returns how many elements of xs are greater than {k}",
             "len([v for v in xs if v > {k}])", tuple(range(0, 25)), _lists),
    Template("max_plus", "xs", "returns the largest element of xs plus {k}", "max(xs) + {k}", _K, _lists),
    Template("repeat", "s", "returns the string s repeated {k} times", "s * {k}", tuple(range(2, 6)), _words),
    Template("count_char", "s", "returns how many times the character {k!r} occurs in s",
             "s.count({k!r})", tuple("abcdexyz"), _words),
    Template("pad_end", "s", "returns s followed by the character {k!r} three times",
             "s + {k!r} * 3", tuple("abcdexyz"), _words),
)  # fmt: skip


def _task(template: Template, k: Any, rng: random.Random) -> dict[str, Any]:
    body = template.body.format(k=k)
    source = f"def {template.name}({template.args}):\n    return {body}\n"
    namespace: dict[str, Any] = {}
    exec(source, namespace)  # our own reference implementation, not model output
    fn = namespace[template.name]
    tests: list[str] = []
    while len(tests) < TESTS_PER_TASK:
        args = template.inputs(rng)
        test = f"assert {template.name}({', '.join(map(repr, args))}) == {fn(*args)!r}"
        if test not in tests:
            tests.append(test)
    signature = f"{template.name}({template.args})"
    return {
        "prompt": INSTRUCTION.format(signature=signature, description=template.description.format(k=k)),
        "answer": tests,
        "solution": f"```python\n{source}```",
        "task": f"{template.name}/{k}",
    }


def generate(sizes: dict[str, int], seed: int) -> dict[str, list[dict[str, Any]]]:
    """Disjoint splits of task instances, taken in ``sizes`` order from one shuffled pool.

    Raises:
        SystemExit: when the templates have fewer instances than the splits need.
    """
    rng = random.Random(seed)
    pool = [(t, k) for t in TEMPLATES for k in t.params]
    rng.shuffle(pool)
    if sum(sizes.values()) > len(pool):
        raise SystemExit(
            f"error: the splits need {sum(sizes.values())} task instances, there are {len(pool)}"
        )
    out: dict[str, list[dict[str, Any]]] = {}
    start = 0
    for name, size in sizes.items():
        out[name] = [_task(t, k, rng) for t, k in pool[start : start + size]]
        start += size
    return out


def _write(path: Path, rows: list[dict[str, Any]], keys: tuple[str, ...]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps({k: r[k] for k in keys}) + "\n" for r in rows))
    tmp.replace(path)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="prepare_code_data.py", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help=f"output directory (default {DEFAULT_OUT})"
    )
    parser.add_argument("--train", type=int, default=160, help="RL prompts")
    parser.add_argument("--eval", type=int, default=100, help="held-out evaluation prompts")
    parser.add_argument("--sft", type=int, default=60, help="SFT demonstrations")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-verify", action="store_true", help="skip running the solutions in the sandbox")
    args = parser.parse_args(argv)
    for name in ("train", "eval", "sft"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")
    splits = generate({"eval": args.eval, "sft": args.sft, "train": args.train}, args.seed)
    if not args.no_verify:
        from rlinf_algos.rewards import CodeReward

        sample = splits["sft"] + splits["eval"][:20] + splits["train"][:20]
        scores = CodeReward(num_workers=2).score(
            [r["solution"] for r in sample], [r["answer"] for r in sample]
        )
        bad = [(r["task"], s.reason) for r, s in zip(sample, scores, strict=True) if s.reward != 1.0]
        if bad:
            raise SystemExit(f"error: the code reward rejects reference solutions: {bad[:5]}")
    args.out.mkdir(parents=True, exist_ok=True)
    _write(args.out / "train.jsonl", splits["train"], ("prompt", "answer", "task"))
    _write(args.out / "eval.jsonl", splits["eval"], ("prompt", "answer", "task"))
    _write(args.out / "sft.jsonl", splits["sft"], ("prompt", "answer", "solution", "task"))
    print(f"wrote {args.train} train, {args.eval} eval and {args.sft} SFT rows to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
