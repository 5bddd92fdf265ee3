"""``rollout:`` of the LLM apps: which generation engine, its batch size and the default sampling."""

from __future__ import annotations

from typing import Literal

import attrs
from attrs import validators as v

from ._sglang_options import SGLangOptions
from ._types import SamplingConfig
from ._vllm_options import VLLMOptions

__all__ = ["ENGINES", "LLMRolloutConfig"]

ENGINES: tuple[str, ...] = ("hf", "vllm", "sglang")
"""Engine names accepted by ``LLMRolloutConfig.engine``."""


@attrs.frozen(kw_only=True)
class LLMRolloutConfig:
    """The LLM rollout component (config ``rollout``)."""

    engine: Literal["hf", "vllm", "sglang"] = attrs.field(default="hf", validator=v.in_(ENGINES))
    """``"hf"`` (transformers ``generate``, any device), ``"vllm"`` (``rlinf-rollout[vllm]``) or ``"sglang"``
    (GPU only)."""
    sampling: SamplingConfig = attrs.field(factory=SamplingConfig)
    """Default sampling of :meth:`LLMRolloutWorker.generate` (a call may override fields)."""
    max_batch_size: int = attrs.field(default=64, validator=v.ge(1))
    """Most sequences decoded together (the HF engine splits larger requests into micro-batches)."""
    enable_offload: bool = False
    """Move the weights off the accelerator between generations (collocated runs); a no-op on CPU."""
    device: str | None = None
    """Device of the HF engine (``None``: ``cuda`` when available, else ``cpu``)."""
    seed: int = 0
    """Seed of the sampler of rank ``r`` (``seed + r``) unless ``sampling.seed`` reseeds each call."""
    torch_num_threads: int = attrs.field(default=1, validator=v.ge(1))
    """torch threads in each rollout process."""
    recv_timeout_s: float = attrs.field(default=600.0, validator=v.gt(0.0))
    """Longest wait for the actor's weights before the rollout fails with a message naming the sender."""
    vllm: VLLMOptions = attrs.field(factory=VLLMOptions)
    """Options of the vLLM engine (``engine: vllm``): its Python environment, KV cache, sleep mode, …"""
    sglang: SGLangOptions = attrs.field(factory=SGLangOptions)
    """Options of the SGLang engine (``engine: sglang``): tensor parallelism, memory fraction, kernels, …"""

    def __attrs_post_init__(self) -> None:
        if self.engine == "sglang" and self.enable_offload and not self.sglang.enable_memory_saver:
            raise ValueError(
                "rollout.enable_offload needs rollout.sglang.enable_memory_saver: true with engine sglang "
                "(without SGLang's memory saver the engine cannot release its GPU memory)"
            )
