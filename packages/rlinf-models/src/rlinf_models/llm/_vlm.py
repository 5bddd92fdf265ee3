"""Vision-language models on the LLM path: Qwen2.5-VL prompts with images, their encoder and their policy.

A vision-language checkpoint (one whose ``config.json`` has a ``vision_config``, e.g. Qwen2.5-VL) loads with
``AutoModelForImageTextToText.from_pretrained(model_path)`` and its image processor with
``AutoImageProcessor.from_pretrained(model_path)``; nothing else is read, so a real checkpoint and the tiny one
of :func:`rlinf_models.llm.testing.make_tiny_vlm_dir` take the same path.

How an image reaches the model (the Qwen2-VL layout): the prompt text holds
``<|vision_start|><|image_pad|>...<|image_pad|><|vision_end|>`` with one ``<|image_pad|>`` per image embedding,
``grid_t x grid_h x grid_w / merge_size**2`` of them, where the grid is that of the image after the processor's
resize to a multiple of ``patch_size x merge_size`` (:meth:`VLMPromptEncoder.image_tokens`). The prompt ids
are built once on the driver with those placeholders already expanded, so every batch column is a real model
input and the rollout and the actor agree on the layout. The pixels travel with the batch as uint8 arrays
(``images [N, K, H, W, 3]``, ``image_sizes [N, K, 2]``, see :func:`rlinf_core.data.pack_images`) and are
turned into ``pixel_values`` / ``image_grid_thw`` by the same image processor wherever the model runs
(:func:`vision_inputs`). Positions are Qwen2-VL's 3-D rotary ids (``get_rope_index``) computed from the
attention mask, which is what ``generate`` uses for left-padded prompts.
"""

from __future__ import annotations

import base64
import inspect
import io
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from rlinf_core.data import ChatPromptEncoder, PromptExample, unpack_images

try:
    import torch
    from PIL import Image
    from transformers import AutoImageProcessor, PreTrainedModel
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        f'vision-language models need transformers and pillow ({e}): pip install "rlinf-models[hf]" pillow'
    ) from e

from ._config import SMOLLM2_ALIAS, LLMModelConfig
from ._policy import CausalLMPolicy

__all__ = [
    "IMAGE_PAD",
    "IMAGE_PLACEHOLDER",
    "VISION_END",
    "VISION_START",
    "VLMPolicy",
    "VLMPromptEncoder",
    "decode_image",
    "image_size",
    "images_of",
    "is_vision_language",
    "load_image_processor",
    "processor_inputs",
    "takes_token_types",
    "vision_inputs",
]

VISION_START = "<|vision_start|>"
"""Opens an image in a Qwen2-VL prompt."""
IMAGE_PAD = "<|image_pad|>"
"""One image embedding of a Qwen2-VL prompt (repeated once per merged patch)."""
VISION_END = "<|vision_end|>"
"""Closes an image in a Qwen2-VL prompt."""
IMAGE_PLACEHOLDER = "<image>"
"""Where a dataset row's message text puts an image (without any, the images come before the first user text)."""


def is_vision_language(model_path: str | Path) -> bool:
    """Whether the checkpoint at ``model_path`` is a vision-language model (its ``config.json`` has a ``vision_config``)."""
    text = str(model_path)
    if text.strip().lower() == SMOLLM2_ALIAS:
        return False
    config = Path(text).expanduser() / "config.json"
    if not config.is_file():
        return False
    return "vision_config" in json.loads(config.read_text(encoding="utf-8"))


def load_image_processor(cfg: LLMModelConfig) -> Any:
    """The image processor saved with ``cfg.model_path`` (``preprocessor_config.json``)."""
    path = Path(cfg.model_path).expanduser()
    if not (path / "preprocessor_config.json").is_file():
        raise FileNotFoundError(
            f"{cfg.model_path!r} is a vision-language model without preprocessor_config.json (its image processor)"
        )
    return AutoImageProcessor.from_pretrained(path)


def _open(ref: str) -> Image.Image:
    if ref.startswith("data:"):
        _, _, payload = ref.partition(",")
        return Image.open(io.BytesIO(base64.b64decode(payload)))
    return Image.open(ref)


def decode_image(ref: str) -> npt.NDArray[np.uint8]:
    """An image reference (a file path or a ``data:image/...;base64,`` URI) as an ``[H, W, 3]`` uint8 RGB array."""
    with _open(ref) as img:
        return np.asarray(img.convert("RGB"), dtype=np.uint8)


def image_size(ref: str) -> tuple[int, int]:
    """``(height, width)`` of an image reference, read from its header."""
    with _open(ref) as img:
        width, height = img.size
    return int(height), int(width)


def _merge_size(image_processor: Any) -> int:
    return int(getattr(image_processor, "merge_size", 2))


def vision_inputs(
    images: torch.Tensor | npt.NDArray[np.uint8],
    image_sizes: torch.Tensor | npt.NDArray[Any],
    image_processor: Any,
) -> dict[str, torch.Tensor] | None:
    """``pixel_values [P, C*T*p*p]`` and ``image_grid_thw [M, 3]`` of the images of a packed batch, row by row.

    Args:
        images: ``[N, K, H, W, 3]`` uint8, from :func:`rlinf_core.data.pack_images`.
        image_sizes: ``[N, K, 2]`` (``(0, 0)``: no image).
        image_processor: the checkpoint's image processor.

    Returns:
        The processor's outputs for the images in row-major order (the order of their placeholders in the
        batch), or ``None`` when the batch shows no image.
    """
    pixels = images.cpu().numpy() if isinstance(images, torch.Tensor) else np.asarray(images)
    sizes = image_sizes.cpu().numpy() if isinstance(image_sizes, torch.Tensor) else np.asarray(image_sizes)
    return processor_inputs(unpack_images(pixels, sizes), image_processor)


def processor_inputs(
    rows: Sequence[Sequence[npt.NDArray[np.uint8]]], image_processor: Any
) -> dict[str, torch.Tensor] | None:
    """``pixel_values`` and ``image_grid_thw`` of each row's ``[H, W, 3]`` images, row-major (``None``: no image)."""
    crops = [img for row in rows for img in row]
    if not crops:
        return None
    out = image_processor(images=crops, return_tensors="pt")
    return {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}


class VLMPromptEncoder(ChatPromptEncoder):
    """Prompts with images for a Qwen2-VL-style model (an :class:`rlinf_core.data.ImagePromptEncoder`).

    A message's text may mark where images go with ``<image>`` (one per image of the row, in order); a row
    without any marker shows its images before the text of its first user message. The chat template renders
    each image as ``<|vision_start|><|image_pad|><|vision_end|>``, and :meth:`encode_prompt` repeats the pad
    once per image embedding.

    Args:
        tokenizer: the checkpoint's tokenizer (``<|image_pad|>`` must be one token).
        image_processor: the checkpoint's image processor (``patch_size``, ``merge_size``).
        system_prompt: a system message put first when the example has none.
        use_chat_template: apply the tokenizer's chat template (``False``: the user text with the images
            before it, no template).

    Raises:
        ValueError: if the tokenizer has no single ``<|image_pad|>`` token.
    """

    def __init__(
        self,
        tokenizer: Any,
        image_processor: Any,
        *,
        system_prompt: str | None = None,
        use_chat_template: bool = True,
    ) -> None:
        super().__init__(tokenizer, system_prompt=system_prompt, use_chat_template=use_chat_template)
        pad = tokenizer.convert_tokens_to_ids(IMAGE_PAD)
        if pad is None or pad == getattr(tokenizer, "unk_token_id", None):
            raise ValueError(f"the tokenizer has no {IMAGE_PAD} token: not a Qwen2-VL-style tokenizer")
        self.image_processor = image_processor
        self.image_pad_id = int(pad)

    def image_tokens(self, height: int, width: int) -> int:
        """Placeholders of an image of ``height x width`` pixels (patches after the resize / ``merge_size**2``)."""
        patches = int(self.image_processor.get_number_of_image_patches(height, width, {}))
        return patches // _merge_size(self.image_processor) ** 2

    def chat(self, example: PromptExample) -> list[dict[str, Any]]:
        """The chat with image parts (``{"type": "image"}``) where the images go, as chat templates take it."""
        messages: list[dict[str, Any]] = [dict(m) for m in self.messages(example)]
        if not example.images:
            return messages
        markers = sum(str(m["content"]).count(IMAGE_PLACEHOLDER) for m in messages)
        if markers not in (0, len(example.images)):
            raise ValueError(
                f"the prompt has {markers} {IMAGE_PLACEHOLDER} markers for {len(example.images)} images "
                f"({example.prompt_text[:60]!r})"
            )
        first_user = next((i for i, m in enumerate(messages) if m["role"] == "user"), None)
        if first_user is None:
            raise ValueError("a prompt with images needs a user message to show them in")
        for i, message in enumerate(messages):
            text = str(message["content"])
            if markers == 0 and i != first_user:
                continue
            pieces = text.split(IMAGE_PLACEHOLDER) if markers else ["", text]
            parts: list[dict[str, str]] = []
            for k, piece in enumerate(pieces):
                if k > 0:
                    parts.append({"type": "image"})
                if piece:
                    parts.append({"type": "text", "text": piece})
            message["content"] = parts if markers or i == first_user else text
        return messages

    def prompt_text(self, example: PromptExample) -> str:
        """The prompt as text with one ``<|image_pad|>`` per image (the chat template's rendering)."""
        if not example.images:
            return super().prompt_text(example)
        image = f"{VISION_START}{IMAGE_PAD}{VISION_END}"
        if not self.use_chat_template:
            text = example.prompt_text
            if IMAGE_PLACEHOLDER in text:
                return text.replace(IMAGE_PLACEHOLDER, image)
            return image * len(example.images) + text
        text = str(
            self.tokenizer.apply_chat_template(self.chat(example), add_generation_prompt=True, tokenize=False)
        )
        if text.count(IMAGE_PAD) != len(example.images):
            raise ValueError(
                f"the chat template rendered {text.count(IMAGE_PAD)} {IMAGE_PAD} for {len(example.images)} images: "
                "it does not render image parts the Qwen2-VL way"
            )
        return text

    def encode_prompt(self, example: PromptExample) -> list[int]:
        """Token ids of :meth:`prompt_text` with each image's pad repeated :meth:`image_tokens` times."""
        text = self.prompt_text(example)
        if not example.images:
            return self._ids(text)
        pieces = text.split(IMAGE_PAD)
        ids: list[int] = []
        for k, piece in enumerate(pieces):
            if k > 0:
                ids += [self.image_pad_id] * self.image_tokens(*image_size(example.images[k - 1]))
            if piece:
                ids += self._ids(piece)
        return ids

    def prompt_images(self, example: PromptExample) -> list[npt.NDArray[np.uint8]]:
        """The example's images as ``[H, W, 3]`` uint8 arrays."""
        return [decode_image(ref) for ref in example.images]


class VLMPolicy(CausalLMPolicy):
    """A Qwen2-VL-style model (``*ForConditionalGeneration``) scored token by token like :class:`CausalLMPolicy`.

    The vision tower, the merger and the language model are all trained. Batches pass their packed images as
    ``vision={"images": [N, K, H, W, 3], "image_sizes": [N, K, 2]}``.

    Args:
        model: the HF model (``model.model`` has ``visual``, ``language_model`` and ``get_rope_index``).
        image_processor: the checkpoint's image processor.
        add_value_head: add a scalar value head (PPO critics).
        logprob_chunk_size: rows per chunk of the vocabulary log-softmax.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        image_processor: Any,
        *,
        add_value_head: bool = False,
        logprob_chunk_size: int | None = None,
    ) -> None:
        super().__init__(model, add_value_head=add_value_head, logprob_chunk_size=logprob_chunk_size)
        self.image_processor = image_processor
        self.image_token_id = int(model.config.image_token_id)

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        *,
        remove_padding: bool = False,
        vision: Mapping[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """``[B, T, H]`` last hidden states, the images' embeddings in place of their placeholders."""
        if remove_padding:
            raise ValueError("actor.use_remove_padding is not supported for vision-language models")
        inner: Any = self.model.model
        inputs = (
            None
            if vision is None
            else vision_inputs(vision["images"], vision["image_sizes"], self.image_processor)
        )
        if inputs is None:
            positions = _text_positions(attention_mask)
            out = inner(
                input_ids=input_ids, attention_mask=attention_mask, position_ids=positions, use_cache=False
            )
            return out.last_hidden_state  # type: ignore[no-any-return]
        device = input_ids.device
        pixel_values, grid = inputs["pixel_values"].to(device), inputs["image_grid_thw"].to(device)
        features = torch.cat(inner.get_image_features(pixel_values, grid, return_dict=True).pooler_output)
        image_mask = self._image_positions(input_ids, vision["image_sizes"], grid)  # type: ignore[index]
        embeds = inner.get_input_embeddings()(input_ids)
        embeds = embeds.masked_scatter(image_mask[..., None], features.to(embeds.dtype))
        if takes_token_types(inner.get_rope_index):
            positions, _ = inner.get_rope_index(
                input_ids,
                mm_token_type_ids=image_mask.int(),
                image_grid_thw=grid,
                attention_mask=attention_mask,
            )
        else:  # transformers < 5: image placeholders are found by id (a sampled one would be counted too)
            positions, _ = inner.get_rope_index(input_ids, image_grid_thw=grid, attention_mask=attention_mask)
        out = inner.language_model(
            input_ids=None,
            inputs_embeds=embeds,
            attention_mask=attention_mask,
            position_ids=positions,
            use_cache=False,
        )
        return out.last_hidden_state  # type: ignore[no-any-return]

    def _image_positions(
        self, input_ids: torch.Tensor, image_sizes: torch.Tensor, grid: torch.Tensor
    ) -> torch.Tensor:
        """``[B, T]`` bool: the placeholders that hold the rows' image embeddings.

        Each row's first ``sum(grid_t * grid_h * grid_w) / merge**2`` placeholders (its images', in order) are
        the images; a placeholder id the policy itself sampled later in the response is an ordinary token, as
        it was for ``generate``, which embedded it as text.
        """
        per_image = (grid.prod(-1) // _merge_size(self.image_processor) ** 2).tolist()
        counts = (image_sizes[..., 0] > 0).sum(-1).tolist()
        expected, k = [], 0
        for c in counts:
            expected.append(sum(per_image[k : k + int(c)]))
            k += int(c)
        is_pad = input_ids == self.image_token_id
        rank = is_pad.long().cumsum(-1)
        limit = torch.tensor(expected, device=input_ids.device)[:, None]
        found = is_pad.sum(-1)
        short = (found < limit.squeeze(-1)).nonzero().flatten().tolist()
        if short:
            raise ValueError(
                f"rows {short} have fewer image placeholders ({found[short].tolist()}) than their images need "
                f"({[expected[i] for i in short]}): the prompt ids and the images do not belong together"
            )
        return is_pad & (rank <= limit)


def takes_token_types(fn: Any) -> bool:
    """Whether a Qwen2-VL method takes ``mm_token_type_ids`` (transformers >= 5 marks images by token type)."""
    return "mm_token_type_ids" in inspect.signature(fn).parameters


def _text_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    return (attention_mask.long().cumsum(-1) - 1).clamp_min(0)


def images_of(
    batch: Mapping[str, Any], rows: Sequence[int] | torch.Tensor | slice | None = None
) -> dict[str, torch.Tensor] | None:
    """The ``images`` / ``image_sizes`` of ``batch`` (its ``rows``), or ``None`` when it has none."""
    if batch.get("images") is None:
        return None
    images, sizes = batch["images"], batch["image_sizes"]
    if rows is not None:
        images, sizes = images[rows], sizes[rows]
    return {"images": images, "image_sizes": sizes}
