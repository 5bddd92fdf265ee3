"""``MegatronLLMActorWorker``: the LLM actor group on the Megatron-core backend (GPU only).

Same method names, batch contract and weight-sync protocol as :class:`~rlinf_models.llm.LLMActorWorker`, so a
runner drives either one unchanged; the work is done by :class:`MegatronActorBackend`. Not run in this
repository (no GPU); see ``docs/gpu_backends.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from rlinf_core.config import AlgorithmConfig
from rlinf_core.protocols import send_weights
from rlinf_scheduler import Worker

from .._config import LLMActorConfig
from ._backend import MegatronActorBackend
from ._config import MegatronConfig

__all__ = ["MegatronLLMActorWorker"]


class MegatronLLMActorWorker(Worker):
    """Trains a causal LM with megatron-core (TP / PP / DP); the drop-in peer of ``LLMActorWorker``.

    Every method is called on every rank with the same arguments (the runner's group calls do that); see
    :class:`MegatronActorBackend` for how the batch is split.

    Args:
        cfg: the ``actor:`` config.
        algorithm: the ``algorithm:`` config (policy losses only: no critic on this backend).
        total_steps: training steps of the run (``actor.optim.lr_schedule: linear``).
        comm_timeout: default seconds to wait for the weight-sync broadcast.
        megatron: the parallel layout (default: TP = PP = 1, distributed optimizer).
    """

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
        self.comm_timeout = comm_timeout
        self.backend = MegatronActorBackend(
            cfg, megatron or MegatronConfig(), algorithm, total_steps=total_steps
        )

    def get_model_version(self) -> int:
        """Completed :meth:`run_training` / :meth:`run_sft` calls (0 = initial weights)."""
        return self.backend.get_model_version()

    def compute_logprobs(self, batch: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        """See :meth:`MegatronActorBackend.compute_logprobs`."""
        return self.backend.compute_logprobs(batch)

    def run_training(self, batch: Mapping[str, Any]) -> dict[str, float]:
        """See :meth:`MegatronActorBackend.run_training`."""
        return self.backend.run_training(batch)

    def run_sft(self, batch: Mapping[str, Any]) -> dict[str, float]:
        """See :meth:`MegatronActorBackend.run_sft`."""
        return self.backend.run_sft(batch)

    def update_reference_model(self) -> None:
        """See :meth:`MegatronActorBackend.update_reference_model`."""
        self.backend.update_reference_model()

    def offload(self) -> None:
        """See :meth:`MegatronActorBackend.offload`."""
        self.backend.offload()

    def onload(self) -> None:
        """See :meth:`MegatronActorBackend.onload`."""
        self.backend.onload()

    def save_checkpoint(self, path: str) -> None:
        """See :meth:`MegatronActorBackend.save_checkpoint`."""
        self.backend.save_checkpoint(path)

    def load_checkpoint(self, path: str) -> None:
        """See :meth:`MegatronActorBackend.load_checkpoint`."""
        self.backend.load_checkpoint(path)

    def save_hf(self, path: str) -> str:
        """See :meth:`MegatronActorBackend.save_hf`."""
        return self.backend.save_hf(path)

    def sync_model_to_rollout(
        self, rollout_group_name: str, rollout_world_size: int | None = None, *, timeout: float | None = None
    ) -> int:
        """Send ``{"version": int, "state_dict": full HF-named CPU state dict}`` to every rollout rank.

        The protocol of ``LLMActorWorker.sync_model_to_rollout``: all actor ranks call it (the Megatron shards
        are gathered collectively, see :meth:`MegatronActorBackend.export_hf_state_dict`), actor rank 0 sends
        one scheduler ``broadcast`` to ``[(actor, 0), (rollout, all ranks)]``.

        Returns:
            The version sent.
        """
        state = self.backend.export_hf_state_dict()
        version = self.get_model_version()
        send_weights(
            self,
            rollout_group_name,
            state,
            version,
            rollout_world_size=rollout_world_size,
            timeout=self.comm_timeout if timeout is None else timeout,
        )
        return version
