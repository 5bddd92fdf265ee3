"""``LLMActorWorker``: the training group of a causal-LM policy (reasoning and agent RL, SFT).

A thin host: the work is done by the :class:`~rlinf_models.llm.LLMActorBackend` that ``actor.training_backend``
picks (``fsdp``: :class:`~rlinf_models.llm.FSDPActorBackend`; ``megatron``:
:class:`~rlinf_models.llm.megatron.MegatronActorBackend`); the worker adds the weight sync and the timings.
The runner drives it by method name, with the SAME full batch on every rank:

```python
actor = LLMActorWorker.create_group(cfg.actor, cfg.algorithm, total_steps=...).launch(cluster, strategy, name="actor")
extra = actor.compute_logprobs(batch).wait()[0]   # {"logprobs", "ref_logprobs"?, "values"?}, full [N, T]
metrics = actor.run_training(batch).wait()[0]     # PPO/GRPO update (global metrics, identical on every rank)
metrics = actor.run_sft(sft_batch).wait()[0]      # one supervised optimizer step
actor.sync_model_to_rollout("rollout")           # ‖ rollout.sync_model_from_actor("actor")
```

The batch contract is in :mod:`rlinf_models.llm._fsdp_backend`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

import torch
from rlinf_core.config import AlgorithmConfig
from rlinf_core.protocols import send_weights
from rlinf_scheduler import Channel, Empty, Worker, timed

from ._backend import LLMActorBackend
from ._config import TRAINING_BACKENDS, LLMActorConfig
from ._fsdp_backend import CHECKPOINT_SUBDIR, FSDPActorBackend
from .megatron._config import MegatronConfig

__all__ = ["CHECKPOINT_SUBDIR", "LLMActorWorker"]


class LLMActorWorker(Worker):
    """Trains a causal-LM policy on the backend of ``actor.training_backend``; every method is collective.

    Every rank is called with the same arguments and returns the same global result. How a backend splits the
    batch over ranks: :class:`~rlinf_models.llm.FSDPActorBackend` (every rank a data-parallel replica) and
    :class:`~rlinf_models.llm.megatron.MegatronActorBackend` (replicas of ``TP × PP`` ranks).

    Args:
        cfg: the ``actor:`` config.
        algorithm: the ``algorithm:`` config (loss type, clip ratios, entropy bonus, KL, epochs).
        total_steps: training steps of the run (for ``actor.optim.lr_schedule: linear``).
        comm_timeout: default seconds to wait for the weight-sync broadcast.
        megatron: the Megatron parallel layout (``megatron`` backend only; default ``actor.megatron``, else
            TP = PP = 1).
    """

    backend_override: ClassVar[str | None] = None
    """A backend name used whatever ``actor.training_backend`` says (set by subclasses bound to one backend)."""

    def __init__(
        self,
        cfg: LLMActorConfig,
        algorithm: AlgorithmConfig,
        *,
        total_steps: int | None = None,
        comm_timeout: float = 600.0,
        megatron: MegatronConfig | None = None,
    ) -> None:
        if cfg.torch_num_threads is not None:
            torch.set_num_threads(cfg.torch_num_threads)
        self.cfg = cfg
        self.comm_timeout = comm_timeout
        self.backend = self._build_backend(cfg, algorithm, total_steps=total_steps, megatron=megatron)

    def _build_backend(
        self,
        cfg: LLMActorConfig,
        algorithm: AlgorithmConfig,
        *,
        total_steps: int | None,
        megatron: MegatronConfig | None,
    ) -> LLMActorBackend:
        """The one factory that picks (and imports) the training backend."""
        name = self.backend_override or cfg.training_backend
        if name == "fsdp":
            return FSDPActorBackend(
                cfg,
                algorithm,
                rank=self.rank,
                world_size=self.world_size,
                total_steps=total_steps,
                log_warning=self.log_warning,
            )
        if name == "megatron":
            # megatron-core is an extra (``rlinf-models[megatron]``): imported only when this backend is picked.
            from .megatron._backend import MegatronActorBackend

            layout = megatron or cfg.megatron or MegatronConfig()
            return MegatronActorBackend(cfg, layout, algorithm, total_steps=total_steps)
        raise ValueError(f"actor.training_backend must be one of {list(TRAINING_BACKENDS)}, got {name!r}")

    # ---------------------------------------------------------------------------------------- the API
    def get_model_version(self) -> int:
        """Number of completed :meth:`run_training` / :meth:`run_sft` calls (0 = initial weights)."""
        return self.backend.get_model_version()

    @timed(name="actor/compute_logprobs")
    def compute_logprobs(self, batch: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        """Score the batch with the current weights, no gradient (see the backend's ``compute_logprobs``).

        Returns:
            On every rank, CPU float32 ``[N, T]`` tensors: ``"logprobs"``, ``"ref_logprobs"`` (with a reference
            model) and ``"values"`` (with a value head).
        """
        return self.backend.compute_logprobs(batch)

    @timed(name="actor/run_training")
    def run_training(self, batch: Mapping[str, Any]) -> dict[str, float]:
        """PPO-style update over the batch (see the backend's ``run_training``); global ``actor/*`` metrics."""
        return self.backend.run_training(batch)

    @timed(name="actor/run_training_stream")
    def run_training_stream(
        self, channel: Channel, key: str, *, timeout: float | None = None
    ) -> dict[str, float]:
        """One optimizer step over the micro-batches a producer puts on ``channel`` (the pipelined mode).

        This rank reads key ``f"{key}/{rank}"`` until it gets ``None`` (the end of the step's stream) and trains
        on each micro-batch as it arrives (see :meth:`FSDPActorBackend.run_training_stream`).

        Args:
            channel: the rollout → actor channel.
            key: the step's key prefix (a fresh one per step, so that no item of another step is read).
            timeout: seconds to wait for each item (``None``: forever).

        Raises:
            TimeoutError: when no micro-batch (and no end of stream) arrived within ``timeout``.
            NotImplementedError: on a backend without streamed training (``megatron``).
        """
        backend = self.backend
        if not isinstance(backend, FSDPActorBackend):
            raise NotImplementedError(
                f"the pipelined mode needs actor.training_backend: fsdp; {type(backend).__name__} trains whole "
                "batches only (set runner.pipeline: false)"
            )
        queue_key = f"{key}/{self.rank}"

        def items() -> Iterator[Mapping[str, Any]]:
            while True:
                try:
                    item = channel.get(key=queue_key, timeout=timeout)
                except Empty:
                    raise TimeoutError(
                        f"actor rank {self.rank}: no micro-batch on channel {channel.name!r} (key {queue_key!r}) "
                        f"within {timeout} s: the pipelined rollout stopped producing"
                    ) from None
                if item is None:
                    return
                yield item

        return backend.run_training_stream(items())

    @timed(name="actor/run_sft")
    def run_sft(self, batch: Mapping[str, Any]) -> dict[str, float]:
        """One supervised optimizer step (see the backend's ``run_sft``); ``sft/*`` metrics."""
        return self.backend.run_sft(batch)

    def update_reference_model(self) -> None:
        """Copy the current policy weights into the frozen reference model (e.g. after an SFT warm-up)."""
        self.backend.update_reference_model()

    @timed(name="actor/sync_model_to_rollout")
    def sync_model_to_rollout(
        self, rollout_group_name: str, rollout_world_size: int | None = None, *, timeout: float | None = None
    ) -> int:
        """Send the full HF-keyed CPU state dict (no value head) to every rollout rank.

        The protocol of :func:`rlinf_core.protocols.send_weights`: all actor ranks call it (the state dict is
        gathered collectively); actor rank 0 broadcasts ``{"version", "state_dict"}`` to
        ``[(actor, 0), (rollout, all ranks)]``; each rollout rank calls ``sync_model_from_actor(actor_group)``.

        Returns:
            The version sent (:meth:`get_model_version`).
        """
        state = self.backend.export_hf_state_dict()
        version = self.backend.get_model_version()
        send_weights(
            self,
            rollout_group_name,
            state,
            version,
            rollout_world_size=rollout_world_size,
            timeout=self.comm_timeout if timeout is None else timeout,
        )
        return version

    def save_checkpoint(self, path: str) -> None:
        """Write what a bit-exact resume needs under ``<path>/actor/``; call it on every rank."""
        self.backend.save_checkpoint(path)

    def load_checkpoint(self, path: str) -> None:
        """Restore what :meth:`save_checkpoint` wrote (from ``<path>/actor/``); call it on every rank."""
        self.backend.load_checkpoint(path)

    def save_hf(self, path: str) -> str:
        """Write the policy as a Hugging Face checkpoint directory (collective); returns ``path``."""
        return self.backend.save_hf(path)

    def offload(self) -> None:
        """Free accelerator memory between phases (collocated runs)."""
        self.backend.offload()

    def onload(self) -> None:
        """Bring weights and optimizer state back after :meth:`offload`."""
        self.backend.onload()
