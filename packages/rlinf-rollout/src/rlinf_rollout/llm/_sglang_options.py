"""``rollout.sglang``: options of the SGLang engine (importable without SGLang).

Each field is either an argument of :class:`~rlinf_rollout.llm.SGLangEngine` or a ``sglang.ServerArgs`` field
that :func:`~rlinf_rollout.llm.build_engine` forwards to ``sglang.Engine``; the names were checked against
SGLang's ``python/sglang/srt/server_args.py`` (0.5.x). SGLang itself validates what it receives once more on
the GPU machine.
"""

from __future__ import annotations

from typing import Any, Literal

import attrs
from attrs import validators as v

__all__ = ["SGLANG_SAMPLING_BACKENDS", "SGLangOptions"]

SGLANG_SAMPLING_BACKENDS: tuple[str, ...] = ("flashinfer", "pytorch")
"""Values of :attr:`SGLangOptions.sampling_backend` (SGLang's CUDA sampling kernels)."""

_DTYPES = ("float32", "bfloat16", "float16")

_RESERVED_ENGINE_KWARGS = frozenset(
    {
        # from the model config and the rollout config
        "model_path",
        "tokenizer_path",
        "random_seed",
        "max_running_requests",
        # from the other sglang.* options
        "tp_size",
        "mem_fraction_static",
        "enable_memory_saver",
        "enable_weights_cpu_backup",
        "dtype",
        "attention_backend",
        "sampling_backend",
        "context_length",
        "disable_cuda_graph",
    }
)


def _open_fraction(_: Any, attribute: attrs.Attribute[Any], value: float) -> None:
    if not 0.0 < value < 1.0:
        raise ValueError(f"sglang.{attribute.name} must be in (0, 1), got {value!r}")


def _optional_name(_: Any, attribute: attrs.Attribute[Any], value: str | None) -> None:
    if value is not None and (not isinstance(value, str) or not value.strip() or value != value.strip()):
        raise ValueError(
            f"sglang.{attribute.name} must be null or an SGLang backend name such as 'flashinfer', 'fa3' or "
            f"'triton', got {value!r}"
        )


def _check_engine_kwargs(_: Any, attribute: attrs.Attribute[Any], value: dict[str, Any]) -> None:
    for key in value:
        if not isinstance(key, str):
            raise ValueError(f"sglang.{attribute.name} keys must be strings (ServerArgs fields), got {key!r}")
    clash = sorted(set(value) & _RESERVED_ENGINE_KWARGS)
    if clash:
        raise ValueError(
            f"sglang.{attribute.name} must not set {clash}: they come from the model config, the rollout config "
            f"and the other sglang.* options (reserved: {sorted(_RESERVED_ENGINE_KWARGS)})"
        )


@attrs.frozen(kw_only=True)
class SGLangOptions:
    """How the SGLang engine is started (config ``rollout.sglang``, used with ``rollout.engine: sglang``).

    The rollout's ``max_batch_size`` becomes SGLang's ``max_running_requests`` and its ``seed`` the
    ``random_seed``; the model and tokenizer come from the actor's model config.
    """

    tp_size: int = attrs.field(default=1, validator=v.ge(1))
    """Tensor-parallel GPUs of one engine (ServerArgs ``tp_size``)."""
    mem_fraction_static: float = attrs.field(default=0.5, validator=_open_fraction)
    """Fraction of the GPU memory for weights + KV cache (ServerArgs ``mem_fraction_static``); below SGLang's
    automatic value because a collocated actor shares the device."""
    enable_memory_saver: bool = True
    """Let ``offload()`` / ``onload()`` release and restore the GPU memory (ServerArgs ``enable_memory_saver`` and
    ``enable_weights_cpu_backup``). Needed by ``rollout.enable_offload``."""
    dtype: Literal["float32", "bfloat16", "float16"] | None = attrs.field(
        default=None, validator=v.optional(v.in_(_DTYPES))
    )
    """Weight/activation dtype in SGLang (ServerArgs ``dtype``; null: the model config's ``dtype``)."""
    attention_backend: str | None = attrs.field(default=None, validator=_optional_name)
    """Attention kernels (ServerArgs ``attention_backend``, e.g. ``flashinfer``, ``fa3``, ``triton``; null:
    SGLang picks one for the GPU)."""
    sampling_backend: Literal["flashinfer", "pytorch"] | None = attrs.field(
        default=None, validator=v.optional(v.in_(SGLANG_SAMPLING_BACKENDS))
    )
    """Sampling kernels (ServerArgs ``sampling_backend``; null: SGLang's default, flashinfer). ``pytorch`` is
    required for seeded sampling (``sampling.seed``) with ``top_p < 1`` or ``top_k``."""
    context_length: int | None = attrs.field(default=None, validator=v.optional(v.ge(1)))
    """Longest prompt + generation in tokens (ServerArgs ``context_length``; null: the checkpoint's)."""
    disable_cuda_graph: bool = False
    """Run decoding without CUDA graphs (ServerArgs ``disable_cuda_graph``): faster start-up, slower decoding."""
    weight_bucket_mib: int = attrs.field(default=512, validator=v.ge(1))
    """Most MiB of weights per ``update_weights_from_tensor`` call of a weight sync."""
    engine_kwargs: dict[str, Any] = attrs.field(factory=dict, validator=_check_engine_kwargs)
    """Further ``sglang.ServerArgs`` fields (e.g. ``chunked_prefill_size``); the ones derived from other fields
    are refused."""

    def server_args(self) -> dict[str, Any]:
        """The ``sglang.ServerArgs`` fields of the options that are not :class:`SGLangEngine` arguments.

        Returns:
            ``engine_kwargs`` plus every set option among ``dtype``, ``attention_backend``,
            ``sampling_backend``, ``context_length`` and ``disable_cuda_graph`` (null options are left to
            SGLang's defaults).
        """
        out: dict[str, Any] = dict(self.engine_kwargs)
        for name in ("dtype", "attention_backend", "sampling_backend", "context_length"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if self.disable_cuda_graph:
            out["disable_cuda_graph"] = True
        return out
