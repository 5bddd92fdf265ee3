"""``rollout.sglang`` (``SGLangOptions``): validation, and what ``build_engine`` hands to ``sglang.Engine``.

SGLang is not installed here (it needs CUDA): the engine is built on a recording stand-in for the ``sglang``
module, so the test sees the exact keyword arguments ``sglang.Engine`` would receive.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from rlinf_core.config import ConfigError, structure_config
from rlinf_models.llm import LLMModelConfig
from rlinf_rollout.llm import LLMRolloutConfig, SGLangEngine, SGLangOptions, build_engine
from rlinf_rollout.llm import _sglang as sg


class _RecordingEngine:
    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs

    def shutdown(self) -> None:
        pass


class _RecordingSGLang:
    """Stands in for the ``sglang`` module: ``Engine(**server_args)`` is recorded, nothing runs."""

    def __init__(self) -> None:
        self.engines: list[_RecordingEngine] = []

    def Engine(self, **kwargs: Any) -> _RecordingEngine:  # sglang.Engine is a class
        engine = _RecordingEngine(**kwargs)
        self.engines.append(engine)
        return engine


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> _RecordingSGLang:
    stand_in = _RecordingSGLang()
    monkeypatch.setattr(sg, "sglang", stand_in)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.delenv("SGLANG_RETURN_ORIGINAL_LOGPROB", raising=False)
    return stand_in


@pytest.fixture
def model_cfg(tmp_path: Path) -> LLMModelConfig:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2", "tie_word_embeddings": True}))
    return LLMModelConfig(model_path=str(tmp_path), dtype="float32")


def test_defaults_keep_the_engine_defaults(recorder: _RecordingSGLang, model_cfg: LLMModelConfig) -> None:
    cfg = LLMRolloutConfig(engine="sglang", max_batch_size=5, seed=9)
    assert cfg.sglang == SGLangOptions() and cfg.sglang.server_args() == {}
    engine = build_engine(cfg, model_cfg)
    assert isinstance(engine, SGLangEngine) and engine.weight_bucket_bytes == 512 << 20
    assert recorder.engines[0].kwargs == {
        "model_path": model_cfg.model_path,
        "tokenizer_path": model_cfg.model_path,
        "dtype": "float32",
        "tp_size": 1,
        "random_seed": 9,
        "mem_fraction_static": 0.5,
        "max_running_requests": 5,
        "enable_memory_saver": True,
        "enable_weights_cpu_backup": True,
    }


def test_every_option_reaches_sglang_engine(recorder: _RecordingSGLang, model_cfg: LLMModelConfig) -> None:
    options = SGLangOptions(
        tp_size=2,
        mem_fraction_static=0.35,
        enable_memory_saver=False,
        dtype="bfloat16",
        attention_backend="fa3",
        sampling_backend="pytorch",
        context_length=4096,
        disable_cuda_graph=True,
        weight_bucket_mib=64,
        engine_kwargs={"chunked_prefill_size": 2048},
    )
    engine = build_engine(LLMRolloutConfig(engine="sglang", sglang=options), model_cfg)
    kw = recorder.engines[0].kwargs
    assert {k: kw[k] for k in ("tp_size", "mem_fraction_static", "enable_memory_saver")} == {
        "tp_size": 2,
        "mem_fraction_static": 0.35,
        "enable_memory_saver": False,
    }
    assert kw["enable_weights_cpu_backup"] is False
    assert kw["dtype"] == "bfloat16"  # the option overrides the model config's float32
    assert (kw["attention_backend"], kw["sampling_backend"], kw["context_length"]) == ("fa3", "pytorch", 4096)
    assert kw["disable_cuda_graph"] is True and kw["chunked_prefill_size"] == 2048
    assert engine.weight_bucket_bytes == 64 << 20
    # The engine sees the pytorch sampling backend: seeded top-p is allowed (no ValueError on this path).
    assert engine._sampling_backend == "pytorch"


def test_yaml_block_is_structured_and_bad_values_name_the_field() -> None:
    cfg = structure_config(
        LLMRolloutConfig,
        {"engine": "sglang", "sglang": {"tp_size": 4, "attention_backend": "triton", "context_length": 2048}},
    )
    assert cfg.sglang.tp_size == 4 and cfg.sglang.server_args() == {
        "attention_backend": "triton",
        "context_length": 2048,
    }
    bad = {
        "tp_size": 0,
        "mem_fraction_static": 1.0,
        "dtype": "float64",
        "sampling_backend": "cuda",
        "context_length": 0,
        "weight_bucket_mib": 0,
        "attention_backend": " ",
    }
    with pytest.raises(ConfigError) as err:
        structure_config(LLMRolloutConfig, {"engine": "sglang", "sglang": bad})
    text = str(err.value)
    for needle in (
        "sglang.tp_size",
        "sglang.mem_fraction_static must be in (0, 1), got 1.0",
        "sglang.dtype",
        "sglang.sampling_backend",
        "sglang.context_length",
        "sglang.weight_bucket_mib",
        "sglang.attention_backend must be null or an SGLang backend name",
    ):
        assert needle in text, text
    with pytest.raises(ConfigError, match=r"unknown|not a field|tp_szie"):
        structure_config(LLMRolloutConfig, {"sglang": {"tp_szie": 2}})


def test_engine_kwargs_may_not_repeat_derived_fields() -> None:
    with pytest.raises(ValueError, match=r"sglang.engine_kwargs must not set \['random_seed', 'tp_size'\]"):
        SGLangOptions(engine_kwargs={"tp_size": 2, "random_seed": 1, "chunked_prefill_size": 512})
    with pytest.raises(ValueError, match=r"keys must be strings"):
        SGLangOptions(engine_kwargs={1: 2})


def test_offload_needs_the_memory_saver() -> None:
    with pytest.raises(ValueError, match=r"rollout.enable_offload needs rollout.sglang.enable_memory_saver"):
        LLMRolloutConfig(
            engine="sglang", enable_offload=True, sglang=SGLangOptions(enable_memory_saver=False)
        )
    LLMRolloutConfig(engine="sglang", enable_offload=True)  # the default saver
    LLMRolloutConfig(engine="hf", enable_offload=True, sglang=SGLangOptions(enable_memory_saver=False))
