"""``data:`` — where the prompts come from and how many the runner draws per step."""

from __future__ import annotations

import attrs
from attrs import validators as v

__all__ = ["DataConfig"]


def _positive_or_none(_inst: object, attr: attrs.Attribute[int | None], value: int | None) -> None:
    if value is not None and value < 1:
        raise ValueError(f"'{attr.name}' must be >= 1 or null: {value}")


@attrs.frozen(kw_only=True)
class DataConfig:
    """Prompt datasets of a reasoning run (config ``data``)."""

    train_path: str = ""
    """JSONL / Parquet file of training prompts with reference answers (required)."""
    eval_path: str | None = None
    """Held-out prompts for the greedy evaluation accuracy (``null``: no evaluation)."""
    sft_path: str | None = None
    """SFT demonstrations (rows with a ``solution``) for the warm-up (``null``: no warm-up)."""
    prompt_key: str = "prompt"
    """Row key of a plain-text prompt (a user message)."""
    messages_key: str = "messages"
    """Row key of a chat prompt (list of ``{role, content}``); used when present."""
    answer_key: str = "answer"
    """Row key of the reference answer(s)."""
    solution_key: str = "solution"
    """Row key of the SFT target text."""
    image_key: str = "images"
    """Row key of a vision-language prompt's images (file paths, relative to the dataset file, or ``data:``
    URIs); needs a vision-language ``actor.model`` (Qwen2.5-VL)."""
    rollout_batch_size: int = attrs.field(default=8, validator=v.ge(1))
    """Prompts per generation batch; each is sampled ``algorithm.group_size`` times."""
    eval_size: int | None = attrs.field(default=None, validator=_positive_or_none)
    """Evaluate on the first N held-out prompts (``null``: all)."""
    shuffle: bool = True
    """Shuffle the training prompts each epoch."""
    seed: int = 0
    """Shuffle seed."""
    max_prompt_length: int = attrs.field(default=512, validator=v.ge(1))
    """Longest prompt in tokens (chat template included); longer ones are an error at start-up."""
    system_prompt: str | None = None
    """System message put before each prompt that has none (``null``: none)."""
    use_chat_template: bool = True
    """Format prompts with the tokenizer's chat template (plain text when false or when it has none)."""
