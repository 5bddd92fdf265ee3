"""Prompts → token ids (through any Hugging Face-style tokenizer) and token ids → padded training batches.

rlinf-core imports no tokenizer library: :class:`ChatPromptEncoder` duck-types the tokenizer
(``apply_chat_template``, ``__call__``/``encode``, ``eos_token_id``, ``pad_token_id``), so it works with
``transformers`` tokenizers without depending on them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from ._dataset import PromptExample

__all__ = [
    "ChatPromptEncoder",
    "ImagePromptEncoder",
    "PromptEncoder",
    "pack_images",
    "pack_sequences",
    "unpack_images",
]


class PromptEncoder(Protocol):
    """What the reasoning runner needs to turn examples into token ids."""

    @property
    def pad_token_id(self) -> int: ...

    def encode_prompt(self, example: PromptExample) -> list[int]:
        """Token ids of the prompt, ending where the model's answer starts."""
        ...

    def encode_completion(self, text: str) -> list[int]:
        """Token ids of an assistant answer (SFT target), ending with the end-of-turn token."""
        ...


@runtime_checkable
class ImagePromptEncoder(PromptEncoder, Protocol):
    """A :class:`PromptEncoder` of a vision-language model: prompts may show images.

    :meth:`encode_prompt` returns the ids the model reads, image placeholders included (one token per image
    embedding), and :meth:`prompt_images` the pixels those placeholders stand for, in the same order.
    """

    def prompt_images(self, example: PromptExample) -> list[npt.NDArray[np.uint8]]:
        """The example's images as ``[H, W, 3]`` uint8 RGB arrays (empty for a text prompt)."""
        ...


def pack_images(rows: Sequence[Sequence[npt.NDArray[np.uint8]]]) -> dict[str, npt.NDArray[Any]]:
    """Pad each row's images into one array that travels with the batch rows (sliced, shuffled, sharded alike).

    Args:
        rows: ``N`` lists of ``[H, W, 3]`` uint8 images (any count and sizes; a row may have none).

    Returns:
        ``images [N, K, H_max, W_max, 3] uint8`` (each image in the top-left corner, zeros elsewhere) and
        ``image_sizes [N, K, 2] int64`` (``(H, W)`` of each image; ``(0, 0)`` marks a missing one), where ``K``
        is the most images of a row (at least 1).

    Raises:
        ValueError: for an image that is not ``[H, W, 3]`` uint8.
    """
    n = len(rows)
    k = max([1, *(len(r) for r in rows)])
    shapes = []
    for i, row in enumerate(rows):
        for j, img in enumerate(row):
            if img.ndim != 3 or img.shape[2] != 3 or img.dtype != np.uint8:
                raise ValueError(
                    f"rows[{i}][{j}] must be an [H, W, 3] uint8 image, got {img.dtype} {img.shape}"
                )
            shapes.append(img.shape)
    h = max([1, *(s[0] for s in shapes)])
    w = max([1, *(s[1] for s in shapes)])
    images = np.zeros((n, k, h, w, 3), dtype=np.uint8)
    sizes = np.zeros((n, k, 2), dtype=np.int64)
    for i, row in enumerate(rows):
        for j, img in enumerate(row):
            images[i, j, : img.shape[0], : img.shape[1]] = img
            sizes[i, j] = img.shape[:2]
    return {"images": images, "image_sizes": sizes}


def unpack_images(
    images: npt.NDArray[np.uint8], image_sizes: npt.NDArray[Any]
) -> list[list[npt.NDArray[np.uint8]]]:
    """The inverse of :func:`pack_images`: each row's images, cropped to their sizes."""
    return [
        [images[i, j, : int(hw[0]), : int(hw[1])] for j, hw in enumerate(image_sizes[i]) if hw[0] > 0]
        for i in range(images.shape[0])
    ]


class ChatPromptEncoder:
    """Encode prompts with the tokenizer's chat template (or plain text when it has none).

    Args:
        tokenizer: a Hugging Face-style tokenizer.
        system_prompt: a system message put first when the example has none (``None``: no system message).
        use_chat_template: apply the chat template (``False``: the last user message's text as is).

    Raises:
        ValueError: if the tokenizer has neither a pad nor an eos token id.
    """

    def __init__(
        self, tokenizer: Any, *, system_prompt: str | None = None, use_chat_template: bool = True
    ) -> None:
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt
        self.use_chat_template = use_chat_template and getattr(tokenizer, "chat_template", None) is not None
        eos = getattr(tokenizer, "eos_token_id", None)
        pad = getattr(tokenizer, "pad_token_id", None)
        if pad is None:
            pad = eos
        if pad is None:
            raise ValueError("the tokenizer has neither pad_token_id nor eos_token_id")
        self._pad = int(pad)
        self._eos = None if eos is None else int(eos)

    @property
    def pad_token_id(self) -> int:
        """Id used for padding (the tokenizer's pad token, else its eos token)."""
        return self._pad

    @property
    def eos_token_id(self) -> int | None:
        """The end-of-sequence (end-of-turn) id."""
        return self._eos

    def _ids(self, text: str) -> list[int]:
        out = self.tokenizer(text, add_special_tokens=False)
        ids = out["input_ids"] if isinstance(out, Mapping) or hasattr(out, "keys") else out
        return [int(i) for i in ids]

    def messages(self, example: PromptExample) -> list[dict[str, str]]:
        """The chat sent to the template (with the default system prompt when the example has none)."""
        messages = [dict(m) for m in example.messages]
        if self.system_prompt is not None and not any(m.get("role") == "system" for m in messages):
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return messages

    def prompt_text(self, example: PromptExample) -> str:
        """The prompt as text, ending where the assistant's answer starts."""
        if not self.use_chat_template:
            return example.prompt_text
        text = self.tokenizer.apply_chat_template(
            self.messages(example), add_generation_prompt=True, tokenize=False
        )
        return str(text)

    def encode_prompt(self, example: PromptExample) -> list[int]:
        """Token ids of :meth:`prompt_text`."""
        return self._ids(self.prompt_text(example))

    def encode_completion(self, text: str) -> list[int]:
        """Token ids of ``text`` followed by the eos (end-of-turn) id."""
        ids = self._ids(text)
        if self._eos is not None:
            ids.append(self._eos)
        return ids


def pack_sequences(
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    *,
    pad_token_id: int,
    train_response: Sequence[bool] | None = None,
    prompt_length: int | None = None,
    response_length: int | None = None,
) -> dict[str, npt.NDArray[Any]]:
    """Pad prompt + response pairs into one batch: prompts LEFT-padded, responses RIGHT-padded.

    Every prompt ends at column ``P`` (the longest prompt, or ``prompt_length``), so the responses start at the
    same column; the total length is ``T = P + R``.

    Args:
        prompts: ``N`` prompt token-id lists.
        responses: ``N`` response token-id lists (generated tokens or SFT targets).
        pad_token_id: the padding id.
        train_response: ``N`` booleans; False clears that row's ``loss_mask`` (e.g. DAPO overlong filtering).
        prompt_length: pad prompts to this length (at least the longest prompt).
        response_length: pad responses to this length (at least the longest response).

    Returns:
        ``input_ids [N, T] int64``, ``attention_mask [N, T] int64`` (1 on real tokens), ``loss_mask [N, T] bool``
        (True on response tokens that are trained), ``response_mask [N, T] bool`` (True on every response token),
        ``prompt_lengths [N] int64``, ``response_lengths [N] int64``.

    Raises:
        ValueError: on mismatched lengths or a padding length shorter than the data.
    """
    n = len(prompts)
    if len(responses) != n:
        raise ValueError(f"{n} prompts but {len(responses)} responses")
    if n == 0:
        raise ValueError("pack_sequences needs at least one sequence")
    if train_response is not None and len(train_response) != n:
        raise ValueError(f"train_response has {len(train_response)} entries for {n} sequences")
    longest_p = max(len(p) for p in prompts)
    longest_r = max(1, max(len(r) for r in responses))
    p_len = longest_p if prompt_length is None else prompt_length
    r_len = longest_r if response_length is None else response_length
    if p_len < longest_p or r_len < max(len(r) for r in responses):
        raise ValueError(
            f"prompt_length={prompt_length} / response_length={response_length} shorter than the data "
            f"(longest prompt {longest_p}, longest response {max(len(r) for r in responses)})"
        )
    total = p_len + r_len
    input_ids = np.full((n, total), pad_token_id, dtype=np.int64)
    attention = np.zeros((n, total), dtype=np.int64)
    response_mask = np.zeros((n, total), dtype=bool)
    for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        input_ids[i, p_len - len(p) : p_len] = np.asarray(p, dtype=np.int64)
        attention[i, p_len - len(p) : p_len] = 1
        if len(r):
            input_ids[i, p_len : p_len + len(r)] = np.asarray(r, dtype=np.int64)
            attention[i, p_len : p_len + len(r)] = 1
            response_mask[i, p_len : p_len + len(r)] = True
    loss_mask = response_mask.copy()
    if train_response is not None:
        loss_mask &= np.asarray(train_response, dtype=bool)[:, None]
    return {
        "input_ids": input_ids,
        "attention_mask": attention,
        "loss_mask": loss_mask,
        "response_mask": response_mask,
        "prompt_lengths": np.asarray([len(p) for p in prompts], dtype=np.int64),
        "response_lengths": np.asarray([len(r) for r in responses], dtype=np.int64),
    }
