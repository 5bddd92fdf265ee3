"""``build_engine``: the one place that picks (and imports) a generation backend."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._config import ENGINES, LLMRolloutConfig
from ._types import GenerationEngine

if TYPE_CHECKING:
    from rlinf_models.llm import LLMModelConfig

__all__ = ["build_engine"]


def build_engine(cfg: LLMRolloutConfig, model_cfg: LLMModelConfig) -> GenerationEngine:
    """Build the generation engine named by ``cfg.engine`` for the model ``model_cfg``.

    Backends are imported here, on demand, so a missing extra only matters when it is selected
    (``"hf"``: ``rlinf-rollout[hf]``, ``"vllm"``: ``rlinf-rollout[vllm]``, ``"sglang"``: SGLang on a GPU).

    Args:
        cfg: The rollout config (engine name, batch size, device, backend options: ``cfg.vllm`` for vLLM,
            ``cfg.sglang`` for SGLang).
        model_cfg: The model to serve (the actor's ``actor.model`` block).

    Returns:
        A ready :class:`GenerationEngine`.

    Raises:
        ValueError: On an unknown engine name.
        ImportError: When the selected backend is not installed (names the extra).
    """
    if cfg.engine == "hf":
        from ._hf import HFGenerateEngine

        return HFGenerateEngine(model_cfg, max_batch_size=cfg.max_batch_size, device=cfg.device)
    if cfg.engine == "vllm":
        from ._vllm import VLLMEngine

        return VLLMEngine(model_cfg, max_batch_size=cfg.max_batch_size, seed=cfg.seed, options=cfg.vllm)
    if cfg.engine == "sglang":
        from ._sglang import SGLangEngine

        options = cfg.sglang
        return SGLangEngine(
            model_cfg,
            max_batch_size=cfg.max_batch_size,
            seed=cfg.seed,
            tp_size=options.tp_size,
            mem_fraction_static=options.mem_fraction_static,
            enable_memory_saver=options.enable_memory_saver,
            weight_bucket_bytes=options.weight_bucket_mib << 20,
            engine_kwargs=options.server_args(),
        )
    raise ValueError(f"rollout.engine must be one of {list(ENGINES)}, got {cfg.engine!r}")
