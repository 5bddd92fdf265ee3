"""Generate the agent tasks and the local search corpus: ``uv run apps/agent/prepare_data.py [--out DIR]``.

Two kinds of tasks, each answerable exactly only with a tool:

- ``calc``: multiplication/addition of multi-digit numbers (``What is 347 * 28?``); the calculator returns
  the exact answer, a 135M-parameter model does not know it;
- ``search``: facts about fictional kingdoms and inventors (``What is the capital of Varnholt?``); the
  answer is only in the local corpus (``corpus.jsonl``), found with the BM25 ``search`` tool.

Held-out tasks (``eval.jsonl``) ask about entities and numbers not seen in training, so success needs tool
use, not memorisation. ``sft.jsonl`` holds demonstrations: the assistant turns as text in ``demo`` (a tool
call, then ``<answer>...</answer>``); the tool responses are produced by the real tools when the SFT batch is
built. ``searchr1_{train,eval,sft}.jsonl`` are the ``search`` rows of each split alone: question answering over
the corpus for ``config/searchr1_smollm2.yaml``. Everything is deterministic in ``--seed``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

DATA_DIR = Path(__file__).resolve().parent / "data"

_ONSETS = [
    "b",
    "d",
    "f",
    "g",
    "k",
    "l",
    "m",
    "n",
    "p",
    "r",
    "s",
    "t",
    "v",
    "z",
    "br",
    "dr",
    "gr",
    "kr",
    "tr",
    "st",
]
_VOWELS = ["a", "e", "i", "o", "u", "ae", "ou"]
_CODAS = ["", "n", "r", "l", "s", "th", "x", "nd", "sk", "m"]
_ELEMENTS = ["cobalt", "argon", "zinc", "boron", "helium", "nickel", "silver", "copper", "iodine", "radon"]
_TRADES = ["weavers", "fishers", "miners", "bakers", "sailors", "potters", "smiths", "farmers"]
_INVENTIONS = ["loom", "compass", "lantern", "pump", "clock", "kite", "telescope", "bridge", "printing press"]


def _name(rng: random.Random, used: set[str]) -> str:
    while True:
        parts = [
            rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS)
            for _ in range(rng.choice((2, 2, 3)))
        ]
        name = "".join(parts).capitalize()
        if 5 <= len(name) <= 11 and name not in used:
            used.add(name)
            return name


def build_world(
    seed: int, n_kingdoms: int, n_inventors: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Fictional entities with facts: ``(passages, facts)``; each fact is ``{entity, question, answer}``."""
    rng = random.Random(seed)
    used: set[str] = set()
    passages: list[dict[str, Any]] = []
    facts: list[dict[str, Any]] = []
    for _ in range(n_kingdoms):
        kingdom, capital, river = _name(rng, used), _name(rng, used), _name(rng, used)
        year = rng.randint(1100, 1890)
        trade = rng.choice(_TRADES)
        text = (
            f"{kingdom} is a small kingdom whose capital is {capital}. It was founded in {year} by {trade} "
            f"and lies along the {river} river."
        )
        passages.append({"id": f"k-{kingdom.lower()}", "title": kingdom, "text": text})
        facts += [
            {"entity": kingdom, "question": f"What is the capital of {kingdom}?", "answer": capital},
            {"entity": kingdom, "question": f"In which year was {kingdom} founded?", "answer": str(year)},
            {"entity": kingdom, "question": f"Along which river does {kingdom} lie?", "answer": river},
        ]
    for _ in range(n_inventors):
        person, town = _name(rng, used), _name(rng, used)
        year = rng.randint(1500, 1950)
        element, invention = rng.choice(_ELEMENTS), rng.choice(_INVENTIONS)
        text = (
            f"{person} was an inventor born in {year} in the town of {town}. {person} built the first "
            f"{invention} powered by {element}."
        )
        passages.append({"id": f"p-{person.lower()}", "title": person, "text": text})
        facts += [
            {"entity": person, "question": f"In which town was {person} born?", "answer": town},
            {"entity": person, "question": f"In which year was {person} born?", "answer": str(year)},
            {"entity": person, "question": f"What did {person} build first?", "answer": invention},
        ]
    return passages, facts


def _calc_task(rng: random.Random) -> dict[str, Any]:
    op = rng.choice(("*", "*", "+"))
    if op == "*":
        a, b = rng.randint(100, 999), rng.randint(12, 99)
        value = a * b
    else:
        a, b = rng.randint(1000, 9999), rng.randint(1000, 9999)
        value = a + b
    expr = f"{a} {op} {b}"
    return {"question": f"What is {expr}?", "answer": str(value), "kind": "calc", "expression": expr}


def _search_query(question: str) -> str:
    return question.rstrip("?").replace("What is the ", "").replace("In which ", "").replace("What did ", "")


def _demo(task: dict[str, Any]) -> list[str]:
    if task["kind"] == "calc":
        call = {"name": "calculator", "arguments": {"expression": task["expression"]}}
    else:
        call = {"name": "search", "arguments": {"query": _search_query(task["question"])}}
    return [f"<tool_call>{json.dumps(call)}</tool_call>", f"<answer>{task['answer']}</answer>"]


def _row(task: dict[str, Any], *, demo: bool) -> dict[str, Any]:
    row = {"prompt": task["question"], "answer": task["answer"], "kind": task["kind"]}
    if demo:
        row["demo"] = _demo(task)
    return row


def generate(
    out: Path, *, seed: int = 0, n_train: int = 400, n_eval: int = 64, n_sft: int = 64
) -> dict[str, int]:
    """Write ``corpus.jsonl``, ``train.jsonl``, ``eval.jsonl``, ``sft.jsonl`` and the ``searchr1_*`` (search-only)
    subsets of the last three into ``out``; returns row counts.

    Half of each split is ``calc``, half ``search``. Search entities are split 75/25 between training (train and
    SFT rows) and evaluation; calc numbers are drawn from separate seeds (and eval questions seen in training
    are redrawn).
    """
    passages, facts = build_world(seed, n_kingdoms=40, n_inventors=40)
    rng = random.Random(seed + 1)
    entities = sorted({f["entity"] for f in facts})
    rng.shuffle(entities)
    held_out = set(entities[: len(entities) // 4])
    train_facts = [f for f in facts if f["entity"] not in held_out]
    eval_facts = [f for f in facts if f["entity"] in held_out]

    def search_tasks(pool: list[dict[str, Any]], n: int, r: random.Random) -> list[dict[str, Any]]:
        picked = [pool[i % len(pool)] for i in r.sample(range(max(n, len(pool))), n)] if pool else []
        return [{"question": f["question"], "answer": f["answer"], "kind": "search"} for f in picked]

    def split(n: int, r: random.Random, pool: list[dict[str, Any]], avoid: set[str]) -> list[dict[str, Any]]:
        calc: list[dict[str, Any]] = []
        while len(calc) < n - n // 2:
            t = _calc_task(r)
            if t["question"] not in avoid:
                calc.append(t)
        tasks = calc + search_tasks(pool, n // 2, r)
        r.shuffle(tasks)
        return tasks

    train = split(n_train, random.Random(seed + 2), train_facts, set())
    sft = split(n_sft, random.Random(seed + 3), train_facts, set())
    seen = {t["question"] for t in train + sft if t["kind"] == "calc"}
    evals = split(n_eval, random.Random(seed + 4), eval_facts, seen)
    out.mkdir(parents=True, exist_ok=True)
    files = {
        "corpus.jsonl": passages,
        "train.jsonl": [_row(t, demo=False) for t in train],
        "eval.jsonl": [_row(t, demo=False) for t in evals],
        "sft.jsonl": [_row(t, demo=True) for t in sft],
    }
    for split_name in ("train", "eval", "sft"):
        files[f"searchr1_{split_name}.jsonl"] = [
            r for r in files[f"{split_name}.jsonl"] if r["kind"] == "search"
        ]
    for name, rows in files.items():
        tmp = out / f".{name}.tmp"
        tmp.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        tmp.replace(out / name)
    return {name: len(rows) for name, rows in files.items()}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="prepare_data.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DATA_DIR, help=f"output directory (default {DATA_DIR})")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train", type=int, default=400, help="RL training tasks")
    parser.add_argument("--eval", type=int, default=64, help="held-out tasks")
    parser.add_argument("--sft", type=int, default=64, help="SFT demonstrations")
    args = parser.parse_args(argv)
    counts = generate(args.out, seed=args.seed, n_train=args.train, n_eval=args.eval, n_sft=args.sft)
    for name, n in counts.items():
        print(f"{args.out / name}: {n} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
