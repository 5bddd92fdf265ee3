r"""Generate a tiny visual question answering task offline: ``uv run apps/reasoning/prepare_vqa_data.py``.

Each image (``--size`` pixels square, PNG) shows 1 to 4 filled shapes (circle, square, triangle) in distinct
colours (red, green, blue, yellow) on a white background, drawn with Pillow at random non-overlapping places.
Each prompt asks one multiple-choice question about its image, in the format of RLinf's VQA reward:

- ``count``: "How many shapes are in the image?" (choices 1-4);
- ``color``: "What colour is the <shape>?" (the image has exactly one of that shape);
- ``shape``: "Which shape is <colour>?".

The row's ``answer`` is the correct choice as ``"<letter>. <text>"`` (``"C. 3"``) and the instruction asks for
``<think>...</think><answer>C. 3</answer>``, which the ``vqa`` reward scores. Three JSONL files and their
images are written under ``data/vqa_shapes/``: ``train.jsonl`` (RL prompts), ``eval.jsonl`` (held out: no
scene of it appears in train or SFT) and ``sft.jsonl`` (demonstrations with a ``solution`` that describes the
scene and answers); rows point at their image by a path relative to the file (``images/train_0000.png``).
Every SFT solution is checked by the ``vqa`` reward (accuracy and both format terms) before anything is written.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw

DEFAULT_OUT = Path(__file__).resolve().parent / "data" / "vqa_shapes"
COLORS = {"red": (220, 30, 30), "green": (30, 160, 60), "blue": (40, 70, 220), "yellow": (230, 200, 20)}
SHAPES = ("circle", "square", "triangle")
LETTERS = "ABCD"
INSTRUCTION = (
    "Look at the image and answer the question. Think inside <think></think>, then give the letter and text "
    "of the correct choice as <answer>X. text</answer>."
)


@dataclass(frozen=True)
class Item:
    """One shape of a scene: kind, colour, centre and half-size in pixels."""

    shape: str
    color: str
    x: int
    y: int
    r: int


def _scene(rng: random.Random, size: int) -> tuple[Item, ...]:
    """1-4 shapes of distinct colours, placed without overlap (rejection sampling)."""
    count = rng.randint(1, 4)
    colors = rng.sample(sorted(COLORS), count)
    r = max(6, size // 10)
    items: list[Item] = []
    while len(items) < count:
        x, y = rng.randint(r + 2, size - r - 3), rng.randint(r + 2, size - r - 3)
        if all((x - o.x) ** 2 + (y - o.y) ** 2 > (2 * r + 4) ** 2 for o in items):
            items.append(Item(rng.choice(SHAPES), colors[len(items)], x, y, r))
    return tuple(items)


def _draw(items: tuple[Item, ...], size: int, path: Path) -> None:
    img = Image.new("RGB", (size, size), (255, 255, 255))
    draw = ImageDraw.Draw(img)
    for it in items:
        box = (it.x - it.r, it.y - it.r, it.x + it.r, it.y + it.r)
        fill = COLORS[it.color]
        if it.shape == "circle":
            draw.ellipse(box, fill=fill)
        elif it.shape == "square":
            draw.rectangle(box, fill=fill)
        else:
            draw.polygon(
                [(it.x, it.y - it.r), (it.x - it.r, it.y + it.r), (it.x + it.r, it.y + it.r)], fill=fill
            )
    img.save(path, optimize=True)


def _question(rng: random.Random, items: tuple[Item, ...]) -> tuple[str, str, list[str], str]:
    """(kind, question, choices, correct text) of one scene."""
    unique_shapes = [s for s in SHAPES if sum(it.shape == s for it in items) == 1]
    kinds = ["count", "shape"] + (["color"] if unique_shapes else [])
    kind = rng.choice(kinds)
    if kind == "count":
        return kind, "How many shapes are in the image?", ["1", "2", "3", "4"], str(len(items))
    if kind == "shape":
        it = rng.choice(items)
        return kind, f"Which shape is {it.color}?", list(SHAPES), it.shape
    shape = rng.choice(unique_shapes)
    color = next(it.color for it in items if it.shape == shape)
    options = [*rng.sample([c for c in sorted(COLORS) if c != color], 3), color]
    rng.shuffle(options)
    return kind, f"What colour is the {shape}?", options, color


def _describe(items: tuple[Item, ...]) -> str:
    parts = [f"a {it.color} {it.shape}" for it in items]
    return f"I see {len(items)} shape{'s' if len(items) > 1 else ''}: {', '.join(parts)}."


def _row(rng: random.Random, items: tuple[Item, ...], image: str) -> dict[str, Any]:
    kind, question, choices, correct = _question(rng, items)
    letter = LETTERS[choices.index(correct)]
    listed = " ".join(f"{LETTERS[i]}. {c}" for i, c in enumerate(choices))
    answer = f"{letter}. {correct}"
    return {
        "prompt": f"<image>{question} Choices: {listed}. {INSTRUCTION}",
        "images": [image],
        "answer": answer,
        "solution": f"<think>{_describe(items)}</think><answer>{answer}</answer>",
        "kind": kind,
    }


def generate(*, train: int, eval_size: int, sft: int, size: int, seed: int, out: Path) -> dict[str, int]:
    """Draw distinct scenes, split them (eval held out), draw the images and write the three files.

    Returns:
        Rows written per split.
    """
    rng = random.Random(seed)
    total = train + eval_size + sft
    seen: set[frozenset[tuple[str, str]]] = set()
    scenes: list[tuple[Item, ...]] = []
    for _ in range(100 * total):
        scene = _scene(rng, size)
        # The same shapes in the same colours elsewhere in the image asks the same questions: one scene per set
        # (255 sets of 1-4 shapes in distinct colours exist).
        key = frozenset((it.shape, it.color) for it in scene)
        if key not in seen:
            seen.add(key)
            scenes.append(scene)
        if len(scenes) == total:
            break
    if len(scenes) < total:
        sys.exit(f"only {len(scenes)} distinct scenes for {total} rows; lower the split sizes")
    splits = {
        "eval": scenes[:eval_size],
        "sft": scenes[eval_size : eval_size + sft],
        "train": scenes[eval_size + sft :],
    }
    rows: dict[str, list[dict[str, Any]]] = {}
    staging = out.parent / f".{out.name}.staging"
    shutil.rmtree(staging, ignore_errors=True)
    (staging / "images").mkdir(parents=True)
    for name, split in splits.items():
        rows[name] = []
        for k, items in enumerate(split):
            rel = f"images/{name}_{k:04d}.png"
            _draw(items, size, staging / rel)
            rows[name].append(_row(rng, items, rel))
    _check(rows["sft"])
    for name, split_rows in rows.items():
        with (staging / f"{name}.jsonl").open("w", encoding="utf-8") as f:
            for row in split_rows:
                if name != "sft":
                    row = {k: v for k, v in row.items() if k != "solution"}
                f.write(json.dumps(row) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)
    return {name: len(r) for name, r in rows.items()}


def _check(rows: list[dict[str, Any]]) -> None:
    """Every demonstration must earn the full ``vqa`` reward (accuracy and both format terms)."""
    from rlinf_algos.rewards import VQAReward

    reward = VQAReward(reward_weights={"qa_accuracy": 1.0, "think_format": 1.0, "answer_format": 1.0})
    scores = reward.get_reward([r["solution"] for r in rows], [[r["answer"]] for r in rows])
    bad = [i for i, s in enumerate(scores) if s != 3.0]
    if bad:
        sys.exit(f"SFT solutions {bad[:5]} do not earn the full vqa reward")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--train", type=int, default=128, help="RL prompts")
    parser.add_argument("--eval", type=int, default=32, help="held-out prompts")
    parser.add_argument("--sft", type=int, default=32, help="demonstrations")
    parser.add_argument("--size", type=int, default=112, help="image side in pixels")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    counts = generate(
        train=args.train, eval_size=args.eval, sft=args.sft, size=args.size, seed=args.seed, out=args.out
    )
    print(f"wrote {counts} to {args.out}")


if __name__ == "__main__":
    main()
