r"""Generate the coding task set offline: ``uv run apps/reasoning/prepare_code_data.py [--out DIR] ...``.

Each task asks for one small Python function from a template with a random parameter ("Write a Python
function ``scale(x)`` that returns x multiplied by 7."). A task instance is a (template, parameter) pair;
the splits hold disjoint instances, stratified by template, so the held-out evaluation asks for functions
never seen in training (same templates, new parameters). The SFT demonstrations cover only the 5 templates
marked ``sft=True`` (one expression, no special case); the other 8 (a condition, two steps, an empty list or
zero among the hidden tests) are in train and eval only, so what the model does on them after the warm-up is
what it generalises from the demonstrated ones, and RL has to teach the rest. Three JSONL files are written
under ``data/code_tasks/``:

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
    """One family of tasks: a function ``name(args)`` whose body is ``return <body with {k}>``.

    ``edge`` inputs (an empty list, zero, a negative number) are always among a task's hidden tests, before the
    random ones; ``sft`` says whether the warm-up may demonstrate the template.
    """

    name: str
    args: str
    description: str
    body: str
    params: tuple[Any, ...]
    inputs: Callable[[random.Random], tuple[Any, ...]]
    edge: tuple[tuple[Any, ...], ...] = ()
    sft: bool = True


def _ints(rng: random.Random) -> tuple[Any, ...]:
    return (rng.randint(-20, 40),)


def _lists(rng: random.Random) -> tuple[Any, ...]:
    return ([rng.randint(-9, 30) for _ in range(rng.randint(1, 6))],)


_K = tuple(range(2, 40))
_EMPTY_LIST: tuple[tuple[Any, ...], ...] = (([],),)
TEMPLATES = (
    # Demonstrated in the SFT warm-up: one expression of the parameter, no special case.
    Template("scale", "x", "returns x multiplied by {k}", "x * {k}", _K, _ints),
    Template("square_plus", "x", "returns x squared plus {k}", "x * x + {k}", _K, _ints),
    Template("scale_all", "xs", "returns a list with every element of xs multiplied by {k}",
             "[v * {k} for v in xs]", _K, _lists),
    Template("count_above", "xs", "returns how many elements of xs are greater than {k}",
             "len([v for v in xs if v > {k}])", tuple(range(0, 25)), _lists),
    Template("max_plus", "xs", "returns the largest element of xs plus {k}", "max(xs) + {k}", _K, _lists),
    # Never demonstrated (RL only): a condition, two steps, or an edge case among the hidden tests.
    Template("max_or", "xs", "returns the largest element of xs plus {k}, or {k} if xs is empty",
             "max(xs) + {k} if xs else {k}", _K, _lists, _EMPTY_LIST, sft=False),
    Template("min_or", "xs", "returns the smallest element of xs minus {k}, or 0 if xs is empty",
             "min(xs) - {k} if xs else 0", _K, _lists, _EMPTY_LIST, sft=False),
    Template("last_or", "xs", "returns the last element of xs, or {k} if xs is empty",
             "xs[-1] if xs else {k}", _K, _lists, _EMPTY_LIST, sft=False),
    Template("sign_scale", "x", "returns x multiplied by {k} if x is positive, otherwise 0",
             "x * {k} if x > 0 else 0", _K, _ints, ((-3,), (0,)), sft=False),
    Template("abs_diff", "x", "returns the absolute difference between x and {k}", "abs(x - {k})", _K, _ints,
             ((-5,),), sft=False),
    Template("fizz", "x", "returns the string 'fizz' if x is divisible by {k}, otherwise x",
             "'fizz' if x % {k} == 0 else x", tuple(range(2, 31)), _ints, ((0,),), sft=False),
    Template("evens_times", "xs", "returns a list of the even elements of xs, each multiplied by {k}",
             "[v * {k} for v in xs if v % 2 == 0]", _K, _lists, _EMPTY_LIST, sft=False),
    Template("sum_squares", "xs", "returns the sum of the squares of the elements of xs, plus {k}",
             "sum(v * v for v in xs) + {k}", _K, _lists, _EMPTY_LIST, sft=False),
)  # fmt: skip


def _task(template: Template, k: Any, rng: random.Random) -> dict[str, Any]:
    body = template.body.format(k=k)
    source = f"def {template.name}({template.args}):\n    return {body}\n"
    namespace: dict[str, Any] = {}
    exec(source, namespace)  # our own reference implementation, not model output
    fn = namespace[template.name]
    tests: list[str] = []
    edge = iter(template.edge)
    while len(tests) < TESTS_PER_TASK:
        args = next(edge, None) or template.inputs(rng)
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
    """Disjoint splits of task instances, stratified by template, filled in ``sizes`` order.

    Each template's parameters are shuffled once; a split takes, round after round, one unused instance from
    every template it may use (the ``sft`` split only templates with ``sft=True``), in a shuffled order and
    skipping templates with none left. So each split mixes the templates evenly, and no instance is in two
    splits.

    Raises:
        SystemExit: when the templates have fewer instances than the splits need.
    """
    rng = random.Random(seed)
    unused = {t.name: rng.sample(t.params, len(t.params)) for t in TEMPLATES}
    out: dict[str, list[dict[str, Any]]] = {}
    for name, size in sizes.items():
        allowed = [t for t in TEMPLATES if t.sft or name != "sft"]
        picked: list[tuple[Template, Any]] = []
        while len(picked) < size:
            left = [t for t in allowed if unused[t.name]]
            if not left:
                raise SystemExit(f"error: the templates have too few instances left for {size} {name} rows")
            rng.shuffle(left)
            picked.extend((t, unused[t.name].pop()) for t in left[: size - len(picked)])
        rng.shuffle(picked)
        out[name] = [_task(t, k, rng) for t, k in picked]
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
