"""``HFGenerateEngine``: batched generation with Hugging Face ``generate`` (KV cache) on any torch device."""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

try:
    from rlinf_models.llm import LLMModelConfig, load_causal_lm, load_tokenizer
    from rlinf_models.llm._vlm import (
        is_vision_language,
        load_image_processor,
        processor_inputs,
        takes_token_types,
    )
    from transformers import (
        GenerationConfig,
        LogitsProcessor,
        LogitsProcessorList,
        StoppingCriteria,
        StoppingCriteriaList,
    )
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        f'the HF generation engine needs transformers ({e}): pip install "rlinf-rollout[hf]"'
    ) from e

from ._types import FinishReason, GenerationOutput, SamplingConfig

__all__ = ["HFGenerateEngine"]

Images = Sequence[Sequence[npt.NDArray[np.uint8]]]
"""Each prompt's images, ``[H, W, 3]`` uint8 (vision-language models)."""


class _LogprobRecorder(LogitsProcessor):
    """First logits processor: scales the raw logits by ``1 / temperature`` and records sampled-token logprobs.

    ``generate`` calls it once per step with the sequences so far and the next-token logits, before top-k/top-p
    and sampling, so the token drawn at step ``t`` is only known at call ``t + 1`` (or after ``generate`` for
    the last one): each call gathers the previous step's logprob. Only the previous step's ``[B, V]`` scores are
    kept (memory ``O(B·V)``, not ``O(B·T·V)`` like ``output_logits``).
    """

    def __init__(self, temperature: float) -> None:
        self.temperature = temperature
        self.prev: torch.Tensor | None = None  # [B, V] scaled logits of the last step
        self.steps: list[torch.Tensor] = []  # [B] logprob of each generated token

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.prev is not None:
            self.steps.append(self._gather(input_ids[:, -1]))
        if self.temperature != 1.0:
            # Divided exactly as transformers' TemperatureLogitsWarper does: same samples as raw generate().
            scores = scores / self.temperature  # type: ignore[assignment]  # transformers' FloatTensor alias vs the Tensor a division returns
        self.prev = scores
        return scores

    def _gather(self, tokens: torch.Tensor) -> torch.Tensor:
        assert self.prev is not None
        picked = self.prev.gather(1, tokens[:, None]).squeeze(1)
        return picked - torch.logsumexp(self.prev, dim=-1)

    def finish(self, generated: torch.Tensor) -> torch.Tensor:
        """Logprobs ``[B, L]`` of the generated tokens ``generated [B, L]``."""
        num = generated.shape[1]
        if len(self.steps) < num and self.prev is not None:
            self.steps.append(self._gather(generated[:, len(self.steps)]))
        self.prev = None
        if num == 0:
            return torch.zeros(generated.shape, dtype=torch.float32, device=generated.device)
        return torch.stack(self.steps[:num], dim=1)


class _StopOnStrings(StoppingCriteria):
    """Ends a row as soon as the text of its generated tokens contains one of ``stops``.

    Only the last ``window`` generated tokens of the rows still running are decoded each step (one
    ``batch_decode`` call). A token holds at least one byte of text (byte-level BPE, byte-fallback
    SentencePiece), so a window of the longest stop string's UTF-8 length plus a margin covers it.
    """

    def __init__(self, tokenizer: Any, stops: Sequence[str], prompt_len: int, batch: int) -> None:
        self.tokenizer = tokenizer
        self.stops = tuple(stops)
        self.prompt_len = prompt_len
        self.window = max(len(s.encode("utf-8")) for s in self.stops) + 8
        self.stop_step = [-1] * batch  # index of the generated token that completed a stop string

    def __call__(self, input_ids: torch.LongTensor, scores: Any, **kwargs: Any) -> torch.BoolTensor:
        generated = input_ids.shape[1] - self.prompt_len
        start = self.prompt_len + max(0, generated - self.window)
        rows = [r for r, s in enumerate(self.stop_step) if s < 0]
        done = torch.tensor([s >= 0 for s in self.stop_step], dtype=torch.bool)
        if rows:
            texts = self.tokenizer.batch_decode(input_ids[rows, start:].tolist(), skip_special_tokens=True)
            for r, text in zip(rows, texts, strict=True):
                if any(s in text for s in self.stops):
                    self.stop_step[r] = generated - 1
                    done[r] = True
        return done.to(input_ids.device)  # type: ignore[return-value]  # transformers' BoolTensor alias vs the Tensor .to() returns


class HFGenerateEngine:
    """Generation with transformers ``generate`` (KV cache), micro-batched and left-padded.

    Prompts are sorted by length and decoded ``max_batch_size`` at a time; each micro-batch is one
    ``model.generate`` call, whose per-step work is extended only by one ``logsumexp`` over the vocabulary
    (for the logprobs) and, when ``sampling.stop`` is set, one ``batch_decode`` of the last few tokens.

    A vision-language checkpoint (Qwen2.5-VL) also loads its image processor and generates from prompts with
    images: ``generate(prompts, sampling, images=...)``, the prompts holding the expanded image placeholders
    (:class:`rlinf_models.llm.VLMPromptEncoder`).

    Args:
        model_cfg: Model and tokenizer to load (``rlinf_models.llm.LLMModelConfig``).
        max_batch_size: Most sequences per ``generate`` call.
        device: Torch device (``None``: ``cuda`` when available, else ``cpu``).

    Example:
        >>> engine = HFGenerateEngine(LLMModelConfig(model_path="ckpt"), max_batch_size=8)  # doctest: +SKIP
        >>> out = engine.generate([[1, 2, 3]], SamplingConfig(max_new_tokens=16))  # doctest: +SKIP
        >>> out[0].token_ids, out[0].logprobs, out[0].finish_reason  # doctest: +SKIP
    """

    def __init__(
        self, model_cfg: LLMModelConfig, *, max_batch_size: int = 64, device: str | torch.device | None = None
    ) -> None:
        tokenizer = load_tokenizer(model_cfg)
        model = load_causal_lm(model_cfg)
        processor = load_image_processor(model_cfg) if is_vision_language(model_cfg.model_path) else None
        self._setup(model, tokenizer, max_batch_size=max_batch_size, device=device, image_processor=processor)

    @classmethod
    def from_model(
        cls,
        model: Any,
        tokenizer: Any,
        *,
        max_batch_size: int = 64,
        device: str | torch.device | None = None,
        image_processor: Any = None,
    ) -> HFGenerateEngine:
        """An engine around an already loaded HF causal LM and its tokenizer (shared, not copied).

        The model is moved to ``device``, put in eval mode, and its ``generation_config`` is replaced by one
        holding only the eos/pad/bos ids (the engine's sampling comes from :class:`SamplingConfig` alone).

        Args:
            model: A ``transformers`` causal LM (``PreTrainedModel`` with ``generate``).
            tokenizer: Its tokenizer (``decode`` / ``batch_decode``; ``eos_token_id``, ``pad_token_id``).
            max_batch_size: Most sequences per ``generate`` call.
            device: Torch device (``None``: ``cuda`` when available, else ``cpu``).
            image_processor: A vision-language model's image processor (``None``: text prompts only).
        """
        engine = cls.__new__(cls)
        engine._setup(
            model, tokenizer, max_batch_size=max_batch_size, device=device, image_processor=image_processor
        )
        return engine

    def _setup(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_batch_size: int,
        device: str | torch.device | None,
        image_processor: Any = None,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.device = torch.device(device) if device is not None else _default_device()
        self.max_batch_size = max_batch_size
        self.tokenizer = tokenizer
        self.image_processor = image_processor
        self.model = model.to(self.device).eval()
        self.eos_token_ids = _eos_ids(model, tokenizer)
        pad = tokenizer.pad_token_id
        if pad is None:
            pad = getattr(model.generation_config, "pad_token_id", None)
        self.pad_token_id = int(pad) if pad is not None else self.eos_token_ids[0]
        # Sampling is fully described by SamplingConfig: drop checkpoint defaults (repetition penalty, top_k=50, …)
        # that generate() would otherwise merge into every call.
        self.model.generation_config = GenerationConfig(
            eos_token_id=list(self.eos_token_ids),
            pad_token_id=self.pad_token_id,
            bos_token_id=getattr(model.generation_config, "bos_token_id", None),
        )
        self._offloaded = False
        self._closed = False

    @property
    def supports_images(self) -> bool:
        """Whether :meth:`generate` takes images (a vision-language model with its image processor)."""
        return self.image_processor is not None

    # ------------------------------------------------------------------------------------------ public
    def generate(
        self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig, images: Images | None = None
    ) -> list[GenerationOutput]:
        """Generate one continuation per prompt.

        Args:
            prompts: Token ids of each prompt (non-empty; any lengths).
            sampling: Sampling parameters (``seed`` reseeds torch's generator first when set).
            images: Each prompt's images (vision-language models), matching its expanded placeholders.

        Returns:
            One :class:`GenerationOutput` per prompt, in the order of ``prompts``.

        Raises:
            ValueError: On an empty prompt or a non-integer token.
            RuntimeError: When the engine is offloaded or shut down.
        """
        self._check_usable()
        batch = [_as_token_list(p, i) for i, p in enumerate(prompts)]
        if not batch:
            return []
        if images is not None and len(images) != len(batch):
            raise ValueError(f"{len(images)} image lists for {len(batch)} prompts")
        if images is not None and any(images) and self.image_processor is None:
            raise ValueError("images given to a text-only model (its checkpoint has no vision_config)")
        if sampling.seed is not None:
            torch.manual_seed(sampling.seed)
        # Longest first: rows of a micro-batch have similar lengths, so little padding is decoded.
        order = sorted(range(len(batch)), key=lambda i: -len(batch[i]))
        results: list[GenerationOutput | None] = [None] * len(batch)
        for start in range(0, len(order), self.max_batch_size):
            idx = order[start : start + self.max_batch_size]
            rows = None if images is None else [images[i] for i in idx]
            for i, out in zip(
                idx, self._generate_batch([batch[i] for i in idx], sampling, rows), strict=True
            ):
                results[i] = out
        return [r for r in results if r is not None]

    def update_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Copy a full state dict (keys of the HF model, e.g. from the actor) into the running model.

        Keys of a wrapper (``model.``-prefixed, or with extra heads such as a value head) are mapped onto the
        HF model: the longest common prefix that makes every model key present is stripped, and entries that
        do not belong to the HF model are ignored.

        Raises:
            KeyError: When some weight of the model is missing from ``state_dict`` (names a few).
        """
        self._check_open()
        own = self.model.state_dict()
        mapped = _map_state_dict(state_dict, own.keys())
        missing = [k for k in own if k not in mapped]
        if missing:
            raise KeyError(
                f"update_weights: state_dict lacks {len(missing)} weight(s) of the model, e.g. {missing[:3]}; "
                f"got keys like {list(state_dict)[:3]}"
            )
        with torch.no_grad():
            for name, tensor in own.items():
                tensor.copy_(mapped[name])

    def offload(self) -> None:
        """Move the weights to the CPU; :meth:`generate` refuses to run until :meth:`onload`."""
        self._check_open()
        self.model.to("cpu")
        self._offloaded = True
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def onload(self) -> None:
        """Move the weights back to the engine's device."""
        self._check_open()
        self.model.to(self.device)
        self._offloaded = False

    def shutdown(self) -> None:
        """Drop the model and tokenizer (idempotent)."""
        if self._closed:
            return
        self._closed = True
        del self.model
        self.tokenizer = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    # --------------------------------------------------------------------------------------- internals
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("HFGenerateEngine was shut down")

    def _check_usable(self) -> None:
        self._check_open()
        if self._offloaded:
            raise RuntimeError("HFGenerateEngine is offloaded: call onload() before generate()")

    def _vision_kwargs(self, input_ids: torch.Tensor, images: Images | None) -> dict[str, torch.Tensor]:
        """``pixel_values``, ``image_grid_thw`` and ``mm_token_type_ids`` of a micro-batch with images."""
        inputs = None if images is None else processor_inputs(images, self.image_processor)
        if inputs is None:
            return {}
        out = {
            "pixel_values": inputs["pixel_values"].to(self.device),
            "image_grid_thw": inputs["image_grid_thw"].to(self.device),
        }
        if takes_token_types(self.model.forward):  # transformers >= 5 finds the image tokens by type
            out["mm_token_type_ids"] = (
                (input_ids == int(self.model.config.image_token_id)).int().to(self.device)
            )
        return out

    @torch.inference_mode()
    def _generate_batch(
        self, prompts: list[list[int]], sampling: SamplingConfig, images: Images | None = None
    ) -> list[GenerationOutput]:
        rows, width = len(prompts), max(len(p) for p in prompts)
        input_ids = torch.full((rows, width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((rows, width), dtype=torch.long)
        for r, p in enumerate(prompts):  # left padding: every prompt ends at column `width`
            input_ids[r, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            attention_mask[r, width - len(p) :] = 1
        recorder = _LogprobRecorder(sampling.logprob_temperature)
        stopper = _StopOnStrings(self.tokenizer, sampling.stop, width, rows) if sampling.stop else None
        sequences = self.model.generate(
            input_ids=input_ids.to(self.device),
            attention_mask=attention_mask.to(self.device),
            generation_config=_generation_config(sampling, self.eos_token_ids, self.pad_token_id),
            logits_processor=LogitsProcessorList([recorder]),
            stopping_criteria=StoppingCriteriaList([stopper]) if stopper is not None else None,
            **self._vision_kwargs(input_ids, images),
        )
        generated = sequences[:, width:]
        logprobs = recorder.finish(generated)
        return self._outputs(prompts, generated, logprobs, stopper, sampling)

    def _outputs(
        self,
        prompts: list[list[int]],
        generated: torch.Tensor,
        logprobs: torch.Tensor,
        stopper: _StopOnStrings | None,
        sampling: SamplingConfig,
    ) -> list[GenerationOutput]:
        rows, steps = generated.shape
        is_eos = torch.isin(generated, torch.tensor(self.eos_token_ids, device=generated.device))
        first_eos = torch.where(is_eos.any(dim=1), is_eos.int().argmax(dim=1), steps).tolist()
        token_rows = generated.tolist()
        logprob_rows = logprobs.float().cpu().tolist()
        ends: list[int] = []
        reasons: list[FinishReason] = []
        by_string: list[bool] = []
        for r in range(rows):
            eos_end = first_eos[r] + 1 if first_eos[r] < steps else steps + 1
            stop_at = stopper.stop_step[r] if stopper is not None else -1
            str_end = stop_at + 1 if stop_at >= 0 else steps + 1
            end = min(eos_end, str_end)
            if end <= steps:
                ends.append(end)
                reasons.append("stop")
                by_string.append(str_end < eos_end)
            else:  # neither an eos token nor a stop string: the row ran to max_new_tokens
                ends.append(steps)
                reasons.append("length")
                by_string.append(False)
        token_ids = [token_rows[r][: ends[r]] for r in range(rows)]
        texts = self.tokenizer.batch_decode(token_ids, skip_special_tokens=True)
        outputs = []
        for r in range(rows):
            text = texts[r]
            if by_string[r]:
                text = _cut_at_stop(text, sampling.stop, include=sampling.include_stop_str_in_output)
            outputs.append(
                GenerationOutput(
                    prompt_token_ids=prompts[r],
                    token_ids=token_ids[r],
                    logprobs=logprob_rows[r][: ends[r]],
                    text=text,
                    finish_reason=reasons[r],
                )
            )
        return outputs


def _generation_config(sampling: SamplingConfig, eos: list[int], pad: int) -> GenerationConfig:
    common: dict[str, Any] = {
        "max_new_tokens": sampling.max_new_tokens,
        "eos_token_id": list(eos),
        "pad_token_id": pad,
        "use_cache": True,
        "return_dict_in_generate": False,
    }
    if sampling.greedy:
        return GenerationConfig(do_sample=False, **common)
    # The temperature is applied by _LogprobRecorder (once, before top-k/top-p), so generate() sees 1.0;
    # top_k=0 disables transformers' default of 50.
    return GenerationConfig(
        do_sample=True,
        temperature=1.0,
        top_k=max(sampling.top_k, 0),
        top_p=sampling.top_p,
        **common,
    )


def _cut_at_stop(text: str, stops: Sequence[str], *, include: bool) -> str:
    hits = [(text.find(s), s) for s in stops if s in text]
    if not hits:
        return text
    pos, stop = min(hits, key=lambda h: (h[0], -len(h[1])))
    return text[: pos + len(stop)] if include else text[:pos]


def _map_state_dict(state_dict: Mapping[str, torch.Tensor], keys: Any) -> dict[str, torch.Tensor]:
    wanted = set(keys)
    if wanted <= state_dict.keys():
        return {k: state_dict[k] for k in wanted}
    # Strip the shortest prefix (ending with ".") under which every model key is present.
    for src in state_dict:
        for cut in (i + 1 for i, ch in enumerate(src) if ch == "."):
            prefix = src[:cut]
            if src[cut:] in wanted and all(prefix + k in state_dict for k in wanted):
                return {k: state_dict[prefix + k] for k in wanted}
    return {k: state_dict[k] for k in wanted if k in state_dict}


def _as_token_list(prompt: Sequence[int], index: int) -> list[int]:
    try:
        tokens = [operator.index(t) for t in prompt]
    except TypeError as e:
        raise ValueError(f"prompts[{index}] must hold integer token ids ({e})") from e
    if not tokens:
        raise ValueError(f"prompts[{index}] is empty: every prompt needs at least one token")
    if any(t < 0 for t in tokens):
        raise ValueError(f"prompts[{index}] holds a negative token id")
    return tokens


def _eos_ids(model: Any, tokenizer: Any) -> list[int]:
    ids: list[int] = []
    configured = getattr(model.generation_config, "eos_token_id", None)
    for value in (configured, tokenizer.eos_token_id):
        if value is None:
            continue
        for token in value if isinstance(value, (list, tuple)) else [value]:
            if int(token) not in ids:
                ids.append(int(token))
    if not ids:
        raise ValueError(
            "the model has no eos_token_id (generation_config or tokenizer): cannot end generations"
        )
    return ids


def _default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
