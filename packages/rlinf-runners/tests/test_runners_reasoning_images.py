"""ReasoningRunner with image prompts (vision-language runs) on fake groups: images travel with their prompts."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from rlinf_core.config import AlgorithmConfig
from rlinf_core.data import DataConfig, PromptDataset, PromptExample, unpack_images
from rlinf_runners import LoggerConfig, ReasoningRunner, RunnerConfig, SFTConfig


class _Done:
    def __init__(self, results: list[Any]) -> None:
        self.results = results

    def wait(self, timeout: float | None = None) -> list[Any]:
        return self.results


class _Group:
    """One rank; ``handlers[method](*args, **kwargs)`` answers; every call is recorded with its kwargs."""

    def __init__(self, name: str, handlers: dict[str, Callable[..., Any]]) -> None:
        self.name, self.handlers, self.world_size = name, handlers, 1
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> _Done:
        self.calls.append((fn.__name__, kwargs))
        handler = self.handlers.get(fn.__name__)
        return _Done([handler(*args, **kwargs) if handler else None])


def _image(value: int, h: int, w: int) -> npt.NDArray[np.uint8]:
    return np.full((h, w, 3), value, dtype=np.uint8)


class ImageEncoder:
    """Prompt ids: the question's number, then one placeholder (9) per image; images from the refs' numbers."""

    pad_token_id = 0

    def encode_prompt(self, example: PromptExample) -> list[int]:
        return [int(example.prompt_text), *([9] * len(example.images)), 1]

    def encode_completion(self, text: str) -> list[int]:
        return [2]

    def prompt_images(self, example: PromptExample) -> list[npt.NDArray[np.uint8]]:
        return [_image(int(ref), 4 + int(ref) % 3, 5) for ref in example.images]


def _dataset(n: int, *, solution: bool = False) -> PromptDataset:
    rows = [
        PromptExample(
            messages=({"role": "user", "content": str(i)},),
            answers=(str(i),),
            images=tuple(str(10 * i + k) for k in range(1 + i % 2)),  # one or two images
            solution="x" if solution else None,
        )
        for i in range(n)
    ]
    return PromptDataset(rows, "images")


def test_images_go_to_the_rollout_and_into_the_training_batch(tmp_path: Path) -> None:
    seen: list[tuple[list[list[int]], Any]] = []
    batches: list[dict[str, Any]] = []

    def generate(
        prompts: list[list[int]], sampling: dict[str, Any], images: Any = None
    ) -> list[dict[str, Any]]:
        seen.append((prompts, images))
        return [
            {"token_ids": [5, 6], "logprobs": [-0.5, -0.5], "text": "t", "finish_reason": "stop"}
            for _ in prompts
        ]

    def reward(texts: list[str], refs: list[list[str]]) -> dict[str, Any]:
        return {
            "rewards": [float(i % 2) for i in range(len(texts))],
            "correct": [i % 2 == 1 for i in range(len(texts))],
        }

    def record(batch: dict[str, Any]) -> dict[str, float]:
        batches.append(batch)
        return {}

    actor = _Group("actor", {"run_training": record, "run_sft": record})
    rollout = _Group("rollout", {"generate": generate})
    runner = ReasoningRunner(
        RunnerConfig(
            progress_bar=False,
            max_epochs=1,
            val_check_interval=1,
            save_interval=-1,
            logger=LoggerConfig(log_path=str(tmp_path), logger_backends=()),
        ),
        actor=actor,
        rollout=rollout,
        reward=_Group("reward", {"compute": reward}),
        algorithm=AlgorithmConfig(adv_type="grpo", loss_type="actor", group_size=2),
        data=DataConfig(train_path="x", rollout_batch_size=2, max_prompt_length=8, shuffle=False),
        encoder=ImageEncoder(),
        train_data=_dataset(2),
        eval_data=_dataset(2),
        sampling={"temperature": 1.0, "max_new_tokens": 4},
        sft=SFTConfig(steps=1, batch_size=2),
        sft_data=_dataset(2, solution=True),
    )
    runner.run()
    # Every generate call (eval at steps 0 and 1, and the training batch) carries one image list per prompt.
    assert len(seen) == 3 and all(
        kw.get("images") is not None for name, kw in rollout.calls if name == "generate"
    )
    prompts, images = seen[1]  # the training batch: 2 prompts x group 2
    assert [p[0] for p in prompts] == [0, 0, 1, 1]
    assert [[int(img[0, 0, 0]) for img in row] for row in images] == [[0], [0], [10, 11], [10, 11]]
    # The SFT batch and the training batch hold the packed images, row-aligned with input_ids.
    sft, train = batches
    for batch, rows in ((sft, [[0], [10, 11]]), (train, [[0], [0], [10, 11], [10, 11]])):
        assert batch["images"].shape[:2] == (len(rows), 2) and batch["images"].dtype == np.uint8
        back = unpack_images(batch["images"], batch["image_sizes"])
        assert [[int(img[0, 0, 0]) for img in row] for row in back] == rows
        assert [[img.shape[0] for img in row] for row in back] == [[4 + v % 3 for v in row] for row in rows]
        assert batch["images"].shape[0] == batch["input_ids"].shape[0]


def test_text_encoder_refuses_image_prompts(tmp_path: Path) -> None:
    class TextEncoder:
        pad_token_id = 0

        def encode_prompt(self, example: PromptExample) -> list[int]:
            return [1]

        def encode_completion(self, text: str) -> list[int]:
            return [2]

    group = _Group("g", {})
    with pytest.raises(ValueError, match="prompts with images need a vision-language model"):
        ReasoningRunner(
            RunnerConfig(progress_bar=False, logger=LoggerConfig(log_path=str(tmp_path), logger_backends=())),
            actor=group,
            rollout=group,
            reward=group,
            algorithm=AlgorithmConfig(adv_type="grpo", loss_type="actor", group_size=2),
            data=DataConfig(train_path="x"),
            encoder=TextEncoder(),
            train_data=_dataset(2),
            sampling={},
        )
