"""Which actor worker ``actor.training_backend`` selects, and the checks an app runs on it before Ray starts.

The one factory that picks (and imports) an LLM training backend: ``fsdp`` → :class:`LLMActorWorker`,
``megatron`` → :class:`~rlinf_models.llm.megatron.MegatronLLMActorWorker` (megatron-core, GPUs only).
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

from ._config import TRAINING_BACKENDS, LLMActorConfig
from .megatron._config import MegatronConfig

if TYPE_CHECKING:
    from rlinf_scheduler import Worker

__all__ = [
    "actor_data_parallel_size",
    "actor_worker_class",
    "actor_worker_kwargs",
    "check_training_backend",
    "training_backend_problems",
]

_MEGATRON_INSTALL = (
    'pip install "rlinf-models[megatron,hf]" (uv: uv sync --extra megatron --package rlinf-models)'
)
"""How to get the Megatron backend's dependencies (named by :func:`check_training_backend`)."""

_CRITIC_LOSSES = ("actor_critic", "decoupled_actor_critic")
"""Loss types that train a value head: the Megatron backend refuses them (it trains policies only)."""


def _megatron_core_importable() -> bool:
    """Whether ``megatron.core`` can be imported here (without importing it)."""
    try:
        return importlib.util.find_spec("megatron.core") is not None
    except ImportError:  # no ``megatron`` parent package
        return False


def check_training_backend(cfg: LLMActorConfig) -> None:
    """Check that the backend named by ``cfg.training_backend`` can be imported (megatron-core for ``megatron``).

    Args:
        cfg: the ``actor:`` config.

    Raises:
        ImportError: ``training_backend: megatron`` without megatron-core; the message names the
            ``rlinf-models[megatron]`` extra.
        ValueError: an unknown ``training_backend`` (only reachable by bypassing the config's validator).
    """
    if cfg.training_backend not in TRAINING_BACKENDS:
        raise ValueError(
            f"actor.training_backend must be one of {list(TRAINING_BACKENDS)}, got {cfg.training_backend!r}"
        )
    if cfg.training_backend == "megatron" and not _megatron_core_importable():
        raise ImportError(
            "actor.training_backend is 'megatron' but megatron-core is not installed (the Megatron backend needs "
            f"CUDA GPUs): {_MEGATRON_INSTALL}; or set actor.training_backend: fsdp"
        )


def _megatron(cfg: LLMActorConfig) -> MegatronConfig:
    return cfg.megatron if cfg.megatron is not None else MegatronConfig()


def actor_data_parallel_size(cfg: LLMActorConfig, world_size: int) -> int:
    """Data-parallel replicas of an actor group of ``world_size`` ranks: each splits the batch rows.

    ``fsdp``: every rank (``world_size``); ``megatron``: ``world_size / (TP × PP)``.

    Raises:
        ValueError: when ``TP × PP`` does not divide ``world_size``.
    """
    if cfg.training_backend != "megatron":
        return world_size
    mp = _megatron(cfg).model_parallel_size
    if world_size % mp:
        raise ValueError(
            f"the actor's {world_size} ranks must be a multiple of actor.megatron.tensor_parallel_size × "
            f"pipeline_parallel_size ({mp})"
        )
    return world_size // mp


def training_backend_problems(
    cfg: LLMActorConfig, *, loss_type: str, world_size: int | None = None
) -> list[str]:
    """What the selected backend cannot run, each problem with its dotted config path (empty for ``fsdp``).

    Args:
        cfg: the ``actor:`` config.
        loss_type: ``algorithm.loss_type``.
        world_size: ranks of the actor group, when the placement is known.

    Returns:
        The problems, for an app's ``ConfigError`` (megatron: no critic loss or value head, and ``TP × PP``
        must divide the actor ranks). Batch sizes are the app's to check against
        :func:`actor_data_parallel_size`.
    """
    if cfg.training_backend != "megatron":
        return []
    problems = []
    if loss_type in _CRITIC_LOSSES or cfg.model.add_value_head:
        problems.append(
            "actor.training_backend 'megatron' trains the policy only: algorithm.loss_type must not be a critic "
            f"loss {list(_CRITIC_LOSSES)} (got {loss_type!r}) and actor.model.add_value_head must be false"
        )
    if world_size is not None:
        try:
            actor_data_parallel_size(cfg, world_size)
        except ValueError as e:
            problems.append(str(e))
    return problems


def actor_worker_class(cfg: LLMActorConfig) -> type[Worker]:
    """The actor worker class of ``cfg.training_backend`` (imported here, on demand).

    Raises:
        ImportError: when the backend's dependencies are missing (see :func:`check_training_backend`).
    """
    check_training_backend(cfg)
    if cfg.training_backend == "megatron":
        module = importlib.import_module(".megatron._worker", __package__)
        cls: type[Worker] = module.MegatronLLMActorWorker
        return cls
    module = importlib.import_module("._actor_worker", __package__)
    cls = module.LLMActorWorker
    return cls


def actor_worker_kwargs(cfg: LLMActorConfig) -> dict[str, Any]:
    """Backend-specific keyword arguments of the worker's constructor, beyond ``(cfg, algorithm, total_steps=)``.

    ``megatron``: ``{"megatron": cfg.megatron}`` (TP = PP = 1 when the block is absent); ``fsdp``: ``{}``.
    """
    if cfg.training_backend == "megatron":
        return {"megatron": _megatron(cfg)}
    return {}
