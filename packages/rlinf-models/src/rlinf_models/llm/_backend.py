"""The LLM actor-backend protocol: what ``LLMActorWorker`` asks of a training backend (FSDP2 or Megatron)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import torch

__all__ = ["LLMActorBackend"]


@runtime_checkable
class LLMActorBackend(Protocol):
    """A causal-LM training backend, one instance per actor rank; every method is collective.

    Every rank calls each method with the same arguments (the runner's group calls do that); the backend splits
    the batch over its data-parallel ranks and returns the same global result on every rank. The batch contract
    is the actor's (see :mod:`rlinf_models.llm._fsdp_backend`). Implementations:
    :class:`~rlinf_models.llm.FSDPActorBackend` and :class:`~rlinf_models.llm.megatron.MegatronActorBackend`.
    """

    def get_model_version(self) -> int:
        """Completed :meth:`run_training` / :meth:`run_sft` calls (0 = the initial weights)."""
        ...

    def compute_logprobs(self, batch: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        """``[N, T]`` CPU ``logprobs`` (and ``ref_logprobs`` / ``values`` when the backend has them), no gradient."""
        ...

    def run_training(self, batch: Mapping[str, Any]) -> dict[str, float]:
        """One PPO-style update (``algorithm.update_epoch`` epochs of mini-batch steps); global metrics."""
        ...

    def run_sft(self, batch: Mapping[str, Any]) -> dict[str, float]:
        """One supervised optimizer step on the ``loss_mask`` tokens; ``sft/*`` metrics."""
        ...

    def update_reference_model(self) -> None:
        """Copy the current weights into the frozen reference model."""
        ...

    def export_hf_state_dict(self) -> dict[str, torch.Tensor]:
        """The full HF-named CPU state dict on rank 0 (``{}`` elsewhere): what the weight sync sends."""
        ...

    def save_checkpoint(self, path: str) -> None:
        """Write everything a bit-exact resume needs under ``<path>/actor/``."""
        ...

    def load_checkpoint(self, path: str) -> None:
        """Restore what :meth:`save_checkpoint` wrote."""
        ...

    def save_hf(self, path: str) -> str:
        """Write the policy as a Hugging Face checkpoint directory; returns ``path``."""
        ...

    def offload(self) -> None:
        """Free accelerator memory between phases (collocated runs)."""
        ...

    def onload(self) -> None:
        """Undo :meth:`offload`."""
        ...
