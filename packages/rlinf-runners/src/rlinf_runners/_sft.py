"""``EmbodiedSFTRunner``: supervised fine-tuning (behaviour cloning) of an embodied policy on demonstrations.

The policy learns from action chunks of recorded episodes through its ``imitation_loss(obs, actions, mask)``
(``[B, C, action_dim]`` targets, ``[B, C]`` real-step mask). It trains in the driver process: the policies
are small and the data is in memory, so there are no worker groups. What every run does (seeding, resume,
``metrics.jsonl`` and the progress bar, evaluation and checkpoint cadence, atomic checkpoints) is the
:class:`~rlinf_runners.Runner` loop. A step is one optimizer step on ``batch_size`` samples drawn without
replacement (a fresh permutation each epoch); an evaluation is the loss on the held-out episodes.

A checkpoint is ``checkpoints/global_step_<N>/actor/model.pt`` (the policy's state dict, as the RL actors
write it, so ``actor.model.model_path`` starts RL from it) with ``optimizer.pt`` and ``trainer.pt``. A VLA
policy (one with ``save_pretrained``) is also exported in its adapter's published layout to
``global_step_<N>/pretrained/`` (config, weights with LoRA adapters merged, tokenizer, statistics): a VLA reads
its ``model_path`` as such a directory, and accepts ``global_step_<N>`` for it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

import attrs
import torch
from rlinf_core.protocols import obs_index
from rlinf_models import OptimConfig
from rlinf_models.actor import adamw, lr_scale
from rlinf_models.policies import PRETRAINED_SUBDIR

from ._base import Runner, StepCallback
from ._config import RunnerConfig

__all__ = ["EmbodiedSFTRunner", "ImitationPolicy", "PretrainedExport", "SFTSamples"]

_ACTOR = "actor"


class ImitationPolicy(Protocol):
    """What SFT needs of a policy: a module with ``imitation_loss``."""

    def imitation_loss(self, obs: Any, actions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor: ...

    def parameters(self) -> Any: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> Any: ...

    def train(self, mode: bool = True) -> Any: ...


@runtime_checkable
class PretrainedExport(Protocol):
    """A policy that exports itself in its model's published layout (the VLA adapters)."""

    def save_pretrained(self, directory: str | Path) -> Path: ...


@attrs.frozen
class SFTSamples:
    """Imitation samples as tensors: ``obs`` ``[N, ...]`` (or a dict), ``actions [N, C, D]``, ``mask [N, C]``."""

    obs: Any
    actions: torch.Tensor
    mask: torch.Tensor

    def __len__(self) -> int:
        return int(self.actions.shape[0])

    def take(self, index: torch.Tensor) -> SFTSamples:
        """The samples at ``index``."""
        return SFTSamples(obs_index(self.obs, index), self.actions[index], self.mask[index])


class EmbodiedSFTRunner(Runner):
    """Behaviour cloning of ``policy`` on ``train``; held-out loss on ``val``.

    Args:
        cfg: the ``runner`` config (``max_steps`` / ``max_epochs``: optimizer steps; ``val_check_interval``,
            ``save_interval``, ``resume_dir``, ``logger``).
        policy: the policy to train (its ``imitation_loss``), on the CPU or a GPU.
        optim: ``actor.optim`` (AdamW; ``clip_grad``; ``lr_schedule: linear`` decays to 0 over the run).
        train: the training samples.
        val: the held-out samples (``None``: no evaluation).
        batch_size: samples per optimizer step.
        seed: seed of the batch order.
        run_config: the resolved configuration (stored with the checkpoints).
        on_step: called after each logged record.

    Raises:
        ValueError: when there are no training samples.
    """

    progress_keys: ClassVar[tuple[tuple[str, str], ...]] = (
        ("train/loss", "loss"),
        ("eval/val_loss", "val"),
    )

    def __init__(
        self,
        cfg: RunnerConfig,
        *,
        policy: ImitationPolicy,
        optim: OptimConfig,
        train: SFTSamples,
        val: SFTSamples | None,
        batch_size: int,
        seed: int = 0,
        run_config: Mapping[str, Any] | None = None,
        on_step: StepCallback | None = None,
    ) -> None:
        super().__init__(cfg, run_config=run_config, on_step=on_step)
        if not len(train):
            raise ValueError("SFT: no training samples (data.train_data_paths holds no frame)")
        self.policy = policy
        self.train_data = train
        self.val_data = val if val is not None and len(val) else None
        self.batch_size = min(batch_size, len(train))
        self.clip_grad = optim.clip_grad
        self.device = train.actions.device
        self.optimizer = adamw(policy.parameters(), optim)
        schedule, total = optim.lr_schedule, cfg.total_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: lr_scale(schedule, step, total)
        )
        self.generator = torch.Generator().manual_seed(seed)
        self._order = torch.empty(0, dtype=torch.long)
        self._cursor = 0
        self.epoch = 0

    # ---------------------------------------------------------------------------------------- the step
    def _next_batch(self) -> SFTSamples:
        if self._cursor + self.batch_size > len(self._order):
            self._order = torch.randperm(len(self.train_data), generator=self.generator)
            self._cursor = 0
            self.epoch += 1
        index = self._order[self._cursor : self._cursor + self.batch_size].to(self.device)
        self._cursor += self.batch_size
        return self.train_data.take(index)

    def train_step(self) -> dict[str, float]:
        """One optimizer step on the next batch; ``train/loss``, ``train/grad_norm``, ``train/lr``, ``train/epoch``."""
        start = time.perf_counter()
        batch = self._next_batch()
        self.policy.train()
        loss = self.policy.imitation_loss(batch.obs, batch.actions, batch.mask)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        norm = torch.nn.utils.clip_grad_norm_(
            params, self.clip_grad if self.clip_grad is not None else math.inf
        )
        lr = float(self.optimizer.param_groups[0]["lr"])
        self.optimizer.step()
        self.scheduler.step()
        return {
            "train/loss": float(loss.detach()),
            "train/grad_norm": float(norm),
            "train/lr": lr,
            "train/epoch": float(self.epoch),
            "time/train_s": time.perf_counter() - start,
        }

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """``eval/val_loss``: the imitation loss over the held-out samples (empty without them)."""
        if self.val_data is None:
            return {}
        start = time.perf_counter()
        self.policy.train(False)
        total, weight = 0.0, 0.0
        n = len(self.val_data)
        for lo in range(0, n, self.batch_size):
            part = self.val_data.take(torch.arange(lo, min(lo + self.batch_size, n), device=self.device))
            real = float(part.mask.sum())
            total += float(self.policy.imitation_loss(part.obs, part.actions, part.mask)) * real
            weight += real
        return self.record_eval({"eval/val_loss": total / max(weight, 1.0)}, start)

    def has_evaluation(self) -> bool:
        """Whether there are held-out samples."""
        return self.val_data is not None

    def sync_weights(self) -> None:
        """Nothing to sync: there is no rollout."""

    # ------------------------------------------------------------------------------------- checkpoints
    def save_worker_state(self, staging: Path) -> None:
        """``actor/model.pt`` (the policy), ``actor/optimizer.pt`` and ``actor/trainer.pt`` (batch order).

        A VLA policy (:class:`PretrainedExport`) is also exported to ``pretrained/`` in its published layout.
        """
        if isinstance(self.policy, PretrainedExport):
            self.policy.save_pretrained(staging / PRETRAINED_SUBDIR)
        root = staging / _ACTOR
        root.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().cpu() for k, v in self.policy.state_dict().items()}
        torch.save(state, root / "model.pt")
        torch.save(
            {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()},
            root / "optimizer.pt",
        )
        trainer = {
            "generator": self.generator.get_state(),
            "order": self._order,
            "cursor": self._cursor,
            "epoch": self.epoch,
        }
        torch.save(trainer, root / "trainer.pt")

    def load_worker_state(self, path: Path) -> None:
        """Restore what :meth:`save_worker_state` wrote."""
        root = path / _ACTOR
        if not (root / "trainer.pt").is_file():
            raise FileNotFoundError(f"{root} holds no SFT checkpoint (no trainer.pt)")
        self.policy.load_state_dict(
            torch.load(root / "model.pt", map_location=self.device, weights_only=True)
        )
        optim = torch.load(root / "optimizer.pt", map_location=self.device, weights_only=True)
        self.optimizer.load_state_dict(optim["optimizer"])
        self.scheduler.load_state_dict(optim["scheduler"])
        trainer = torch.load(root / "trainer.pt", map_location="cpu", weights_only=True)
        self.generator.set_state(trainer["generator"])
        self._order, self._cursor, self.epoch = (
            trainer["order"],
            int(trainer["cursor"]),
            int(trainer["epoch"]),
        )
