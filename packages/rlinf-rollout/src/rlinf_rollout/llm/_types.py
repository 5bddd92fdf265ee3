"""Sampling parameters, generation results and the :class:`GenerationEngine` protocol shared by every engine."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

import attrs
from attrs import validators as v

if TYPE_CHECKING:
    import torch

__all__ = ["FinishReason", "GenerationEngine", "GenerationOutput", "SamplingConfig"]

FinishReason = Literal["stop", "length"]
"""``"stop"``: the model emitted an end-of-sequence token or a stop string; ``"length"``: ``max_new_tokens``."""


def _to_stop_tuple(value: str | Sequence[str]) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value)


def _check_top_k(_: Any, attribute: attrs.Attribute[int], value: int) -> None:
    if value != -1 and value < 1:
        raise ValueError(f"{attribute.name} must be -1 (disabled) or >= 1, got {value}")


def _check_stop(_: Any, attribute: attrs.Attribute[tuple[str, ...]], value: tuple[str, ...]) -> None:
    for s in value:
        if not isinstance(s, str) or not s:
            raise ValueError(f"{attribute.name} must hold non-empty strings, got {s!r}")


@attrs.frozen(kw_only=True)
class SamplingConfig:
    """How tokens are drawn (the ``rollout.sampling`` config; vLLM's ``SamplingParams`` names).

    The distribution sampled from is ``softmax(logits / temperature)`` restricted to the ``top_k`` most likely
    tokens and to the smallest set whose probability reaches ``top_p``; ``temperature == 0`` is greedy decoding.
    """

    temperature: float = attrs.field(default=1.0, validator=v.ge(0.0))
    """Softmax temperature; ``0`` selects greedy decoding (the logprobs are then those of ``temperature=1``)."""
    top_p: float = attrs.field(default=1.0, validator=[v.gt(0.0), v.le(1.0)])
    """Nucleus sampling mass in ``(0, 1]`` (``1`` disables it)."""
    top_k: int = attrs.field(default=-1, validator=_check_top_k)
    """Keep the ``top_k`` most likely tokens (``-1`` disables it)."""
    max_new_tokens: int = attrs.field(default=256, validator=v.ge(1))
    """Most tokens generated per prompt (the end-of-sequence token included)."""
    stop: tuple[str, ...] = attrs.field(default=(), converter=_to_stop_tuple, validator=_check_stop)
    """Strings that end a generation as soon as the generated text contains one of them."""
    include_stop_str_in_output: bool = True
    """Keep the stop string at the end of ``text`` (the tokens that produced it are always kept)."""
    seed: int | None = None
    """Reseed the sampler at the start of every ``generate`` call (``None``: continue the engine's stream)."""

    def updated(self, overrides: Mapping[str, Any] | None) -> SamplingConfig:
        """A copy with the fields in ``overrides`` replaced (unknown keys raise a ``ValueError`` naming them)."""
        if not overrides:
            return self
        names = set(attrs.fields_dict(SamplingConfig))
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise ValueError(f"unknown sampling field(s) {unknown}; allowed: {sorted(names)}")
        return attrs.evolve(self, **overrides)

    @property
    def greedy(self) -> bool:
        """Whether decoding is greedy (``temperature == 0``)."""
        return self.temperature == 0.0

    @property
    def logprob_temperature(self) -> float:
        """Temperature of the distribution the returned logprobs are taken under (``1`` when greedy)."""
        return 1.0 if self.greedy else self.temperature


@attrs.frozen(kw_only=True)
class GenerationOutput:
    """One generated continuation.

    ``token_ids`` end with the end-of-sequence token or the token that completed a stop string when
    ``finish_reason == "stop"`` (both are part of what the policy produced, so they are trained on);
    ``logprobs[i]`` is ``log softmax(logits / T)[token_ids[i]]`` given ``prompt_token_ids + token_ids[:i]``,
    with ``T`` the sampling temperature (``1`` when greedy): the quantity the actor recomputes.
    """

    prompt_token_ids: list[int]
    """The prompt, as given."""
    token_ids: list[int]
    """Generated token ids."""
    logprobs: list[float]
    """Log-probability of each generated token (same length as ``token_ids``)."""
    text: str
    """Decoded ``token_ids`` without special tokens, cut right after (or before) the stop string."""
    finish_reason: FinishReason
    """Why generation ended."""

    def to_dict(self) -> dict[str, Any]:
        """The fields as a plain dict (what :class:`LLMRolloutWorker.generate` returns)."""
        return attrs.asdict(self)


@runtime_checkable
class GenerationEngine(Protocol):
    """A text-generation backend that can receive new weights (HF ``generate``, vLLM, SGLang)."""

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig) -> list[GenerationOutput]:
        """Generate one continuation per prompt (token ids), in the order of ``prompts``."""
        ...

    def update_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Load a full (CPU) state dict of the policy into the running engine."""
        ...

    def offload(self) -> None:
        """Release accelerator memory (weights and caches to the host) until :meth:`onload`."""
        ...

    def onload(self) -> None:
        """Bring the weights back to the accelerator."""
        ...

    def shutdown(self) -> None:
        """Free every resource; the engine is unusable afterwards."""
        ...
