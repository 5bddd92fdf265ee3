"""``LLMRolloutWorker``: a generation engine in a worker group, with weights synced from the actor."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import torch
from rlinf_core.checkpoint import atomic_write_bytes, capture_rng_state, restore_rng_state
from rlinf_core.protocols import receive_weights
from rlinf_scheduler import Worker, shard_bounds

from ._config import LLMRolloutConfig
from ._factory import build_engine

if TYPE_CHECKING:
    from rlinf_models.llm import LLMModelConfig

__all__ = ["CHECKPOINT_SUBDIR", "LLMRolloutWorker"]

CHECKPOINT_SUBDIR = "rollout"
"""Where :meth:`LLMRolloutWorker.save_checkpoint` writes inside a checkpoint directory."""


class LLMRolloutWorker(Worker):
    """Generates continuations of token-id prompts with the engine of ``cfg.engine``.

    Weights: the engine starts from ``model_cfg`` (the same checkpoint the actor loads); afterwards actor rank 0
    broadcasts ``{"version": int, "state_dict": full CPU state dict}`` to every rollout rank (groups
    ``[(actor, 0), (rollout, all ranks)]``), received by :meth:`sync_model_from_actor` and loaded into the
    running engine (the embodied ``EmbodiedRolloutWorker`` protocol).

    Data parallelism: a group call sends the same arguments to every rank, so :meth:`generate` takes this
    rank's contiguous share of ``prompts`` (:func:`rlinf_scheduler.shard_bounds`); concatenating the lists returned by the ranks
    in rank order gives one output per prompt, in prompt order. Pass ``shard=False`` when calling one rank
    with its own prompts (``group.execute_on(r).generate(...)``).

    Args:
        cfg: The ``rollout`` config.
        model_cfg: The model (the actor's ``actor.model``).
    """

    def __init__(self, cfg: LLMRolloutConfig, model_cfg: LLMModelConfig) -> None:
        torch.set_num_threads(cfg.torch_num_threads)
        torch.manual_seed(cfg.seed + self.rank)
        self.cfg = cfg
        self.model_cfg = model_cfg
        self.engine = build_engine(cfg, model_cfg)
        self.version = -1
        self._offloaded = False
        if cfg.enable_offload:
            self.offload()

    # --------------------------------------------------------------------------------------- public API
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        sampling: Mapping[str, Any] | None = None,
        *,
        shard: bool = True,
        images: Sequence[Sequence[npt.NDArray[np.uint8]]] | None = None,
    ) -> list[dict[str, Any]]:
        """Generate a continuation of each prompt (this rank's share of them when ``shard``).

        Args:
            prompts: Token ids of every prompt.
            sampling: Overrides of ``cfg.sampling`` fields (``temperature``, ``top_p``, ``top_k``,
                ``max_new_tokens``, ``stop``, ``include_stop_str_in_output``, ``seed``).
            shard: Take only this rank's contiguous share of ``prompts`` (see the class docstring).
            images: Each prompt's ``[H, W, 3]`` uint8 images (a vision-language model; sharded with the prompts).
                Only the ``hf`` engine generates from images.

        When the engine is offloaded (``cfg.enable_offload`` or an explicit :meth:`offload`), it is onloaded for
        this call and offloaded again afterwards.

        Returns:
            One dict per generated prompt with the :class:`GenerationOutput` fields: ``prompt_token_ids``,
            ``token_ids``, ``logprobs`` (under ``logits / temperature``), ``text``, ``finish_reason``.
        """
        params = self.cfg.sampling.updated(sampling)
        if shard:
            start, stop = shard_bounds(len(prompts), self.rank, self.world_size)
            prompts = prompts[start:stop]
            images = None if images is None else images[start:stop]
        if images is not None and not any(images):
            images = None
        if images is not None and not getattr(self.engine, "supports_images", False):
            raise NotImplementedError(
                f"rollout.engine {self.cfg.engine!r} with this model does not generate from images: prompts with "
                "images need rollout.engine: hf and a vision-language actor.model (Qwen2.5-VL)"
            )
        reload = self._offloaded  # generating while offloaded: onload for this call, then offload again
        if reload:
            self.onload()
        try:
            with self.timer("generate"):
                if images is None:
                    outputs = self.engine.generate(prompts, params)
                else:  # supports_images: the HF engine
                    outputs = self.engine.generate(prompts, params, images)  # type: ignore[call-arg]
        finally:
            if reload:
                self.offload()
        return [o.to_dict() for o in outputs]

    def sync_model_from_actor(self, actor_group: str) -> int:
        """Receive the weights actor rank 0 broadcasts (:func:`rlinf_core.protocols.receive_weights`), load them.

        Returns:
            The version received.
        """
        with self.timer("sync_weights"):
            msg = receive_weights(self, actor_group, timeout=self.cfg.recv_timeout_s)
            self.engine.update_weights(msg["state_dict"])
            self.version = msg["version"]
        return self.version

    def save_checkpoint(self, path: str) -> None:
        """Write this rank's RNG states to ``<path>/rollout/rng_rank<R>.pkl`` atomically (call it on every rank).

        The HF engine samples from torch's global generator unless a request carries a ``seed``; the weights
        are the actor's to save. (vLLM and SGLang keep their samplers' state inside the engine: not saved.)
        """
        atomic_write_bytes(self._rng_file(path), capture_rng_state())

    def load_checkpoint(self, path: str) -> None:
        """Restore the RNG states :meth:`save_checkpoint` wrote.

        A checkpoint without them (an older one, or one written with fewer rollout ranks) keeps the current
        state, with a warning.
        """
        file = self._rng_file(path)
        if file.is_file():
            restore_rng_state(file.read_bytes())
        else:
            self.log_warning(
                "no rollout RNG state at %s: sampled tokens differ from an uninterrupted run", file
            )

    def _rng_file(self, path: str) -> Path:
        return Path(path) / CHECKPOINT_SUBDIR / f"rng_rank{self.rank}.pkl"

    def get_model_version(self) -> int:
        """Version of the weights in use (-1: the checkpoint's, before the first sync)."""
        return self.version

    def offload(self) -> None:
        """Move the engine's weights off the accelerator (collocated runs, while the actor trains)."""
        self.engine.offload()
        self._offloaded = True

    def onload(self) -> None:
        """Bring the engine's weights back to the accelerator."""
        self.engine.onload()
        self._offloaded = False

    def shutdown_engine(self) -> None:
        """Release the engine (the worker cannot generate afterwards)."""
        self.engine.shutdown()
