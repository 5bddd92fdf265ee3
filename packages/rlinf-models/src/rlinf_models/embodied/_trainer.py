"""PPO-family training of an embodied actor-critic on one rank's share of a rollout (RLinf's embodied actor).

The rollout batch is time-major, as the env workers produce it:

- ``obs [T, E, *obs_shape]``, ``actions [T, E, C]`` (discrete) or ``[T, E, C, D]`` (continuous)
- ``rewards [T, E, C]`` float32, ``dones [T+1, E, C]`` bool (row 0: state before the first step)
- ``prev_logprobs [T, E, C*D]`` from the rollout policy, ``prev_values [T+1, E, 1]`` (row T: bootstrap value)

Advantages come from ``rlinf_algos.calculate_adv_and_returns`` and the loss from ``rlinf_algos.policy_loss``
with RLinf's keyword names, so any registered advantage or loss works here unchanged.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import torch
from rlinf_algos import calculate_adv_and_returns, masked_mean, policy_loss, reshape_entropy
from rlinf_core.config import AlgorithmConfig
from torch import nn

from .._config import ActorConfig
from ..policies import ActorCritic

__all__ = ["REQUIRED_BATCH_KEYS", "EmbodiedPPOTrainer"]

REQUIRED_BATCH_KEYS = ("obs", "actions", "rewards", "dones", "prev_logprobs", "prev_values")


def _check_batch(batch: Mapping[str, torch.Tensor]) -> tuple[int, int, int]:
    missing = [k for k in REQUIRED_BATCH_KEYS if k not in batch]
    if missing:
        raise ValueError(f"rollout batch is missing {missing}; it has {sorted(batch)}")
    rewards = batch["rewards"]
    if rewards.ndim != 3:
        raise ValueError(f"rewards must be [T, E, C], got shape {tuple(rewards.shape)}")
    t, e, c = rewards.shape
    expected = {"dones": (t + 1, e, c), "prev_values": (t + 1, e, 1)}
    for key, shape in expected.items():
        if tuple(batch[key].shape) != shape:
            raise ValueError(
                f"{key} must be {list(shape)} for rewards {list(rewards.shape)}, got {list(batch[key].shape)}"
            )
    for key in ("obs", "actions", "prev_logprobs"):
        if tuple(batch[key].shape[:2]) != (t, e):
            raise ValueError(f"{key} must start with [T={t}, E={e}], got {list(batch[key].shape)}")
    return t, e, c


class EmbodiedPPOTrainer:
    """Computes advantages and runs the policy update for one actor rank.

    Args:
        policy: the actor-critic (possibly FSDP-wrapped by the caller; gradients are then reduced by FSDP).
        algorithm: the ``algorithm:`` config.
        actor: the ``actor:`` config (optimizer, batch sizes, seed).
        world_size: number of data-parallel actor ranks (the global batch is split evenly).
        rank: this rank (seeds the shuffling generator as RLinf does: ``seed + rank``).
        total_steps: training steps of the run, for the linear learning-rate schedule.
    """

    def __init__(
        self,
        policy: ActorCritic | nn.Module,
        algorithm: AlgorithmConfig,
        actor: ActorConfig,
        *,
        world_size: int = 1,
        rank: int = 0,
        total_steps: int | None = None,
    ) -> None:
        if actor.global_batch_size % (actor.micro_batch_size * world_size):
            raise ValueError(
                f"actor.global_batch_size ({actor.global_batch_size}) must be a multiple of "
                f"actor.micro_batch_size ({actor.micro_batch_size}) x actor world size ({world_size})"
            )
        self.policy = policy
        self.algorithm = algorithm
        self.actor = actor
        self.world_size = world_size
        self.rank = rank
        self.total_steps = total_steps
        module: Any = getattr(policy, "module", policy)
        critic = [p for n, p in module.named_parameters() if n.startswith(("critic_body", "value_head"))]
        critic_ids = {id(p) for p in critic}
        actor_params = [p for p in policy.parameters() if id(p) not in critic_ids]
        optim = actor.optim
        groups = [{"params": actor_params, "lr": optim.lr, "initial_lr": optim.lr}]
        if critic:
            value_lr = optim.value_lr or optim.lr
            groups.append({"params": critic, "lr": value_lr, "initial_lr": value_lr})
        self.optimizer = torch.optim.AdamW(
            groups,
            betas=(optim.adam_beta1, optim.adam_beta2),
            eps=optim.adam_eps,
            weight_decay=optim.weight_decay,
        )
        self.generator = torch.Generator().manual_seed(actor.seed + rank)
        self.optimizer_steps = 0
        self.train_steps = 0
        spec = getattr(module, "spec", None)
        self.action_dim = spec.action_dim if spec is not None else 1

    # ------------------------------------------------------------------ advantages
    def compute_advantages_and_returns(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Add ``advantages`` (and ``returns`` for GAE) to ``batch`` in RLinf's embodied layout; returns ``batch``."""
        _check_batch(batch)
        alg = self.algorithm
        kwargs: dict[str, Any] = {
            "task_type": "embodied",
            "adv_type": alg.adv_type,
            "rewards": batch["rewards"].float(),
            "dones": batch["dones"].bool(),
            "gamma": alg.gamma,
            "gae_lambda": alg.gae_lambda,
            "group_size": alg.group_size,
            "reward_type": alg.reward_type,
            "loss_mask": batch.get("loss_mask"),
            "loss_mask_sum": batch.get("loss_mask_sum"),
        }
        if alg.adv_type == "gae":
            kwargs["values"] = batch["prev_values"].float()
            kwargs["normalize_advantages"] = alg.normalize_advantages
        result = calculate_adv_and_returns(**kwargs)
        batch["advantages"] = result["advantages"]
        if "returns" in result:
            batch["returns"] = result["returns"]
        return batch

    # ------------------------------------------------------------------ update
    def _flatten(self, batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        t, e, _ = _check_batch(batch)
        n = t * e
        flat = {
            "obs": batch["obs"].reshape(n, *batch["obs"].shape[2:]),
            "actions": batch["actions"].reshape(n, *batch["actions"].shape[2:]),
            "prev_logprobs": batch["prev_logprobs"].reshape(n, -1).float(),
            "prev_values": batch["prev_values"][:-1].reshape(n, 1).float(),
            "advantages": batch["advantages"].reshape(n, -1).float(),
        }
        if "returns" in batch:
            flat["returns"] = batch["returns"].reshape(n, -1).float()
        for key in ("loss_mask", "loss_mask_sum"):
            if batch.get(key) is not None:
                flat[key] = batch[key].reshape(n, -1)
        if self.algorithm.reward_type == "chunk_level":
            for key in ("advantages", "returns", "loss_mask", "loss_mask_sum"):
                if key in flat:
                    flat[key] = flat[key][:, -1:]
        return flat

    def _set_lr(self) -> None:
        if self.actor.optim.lr_schedule != "linear" or not self.total_steps:
            return
        frac = max(0.0, 1.0 - self.train_steps / self.total_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = group["initial_lr"] * frac

    def _micro_batch_loss(self, mb: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        alg = self.algorithm
        n = mb["obs"].shape[0]
        logprobs, entropy, values = self.policy(mb["obs"], mb["actions"])
        loss_kwargs: dict[str, Any] = {
            "task_type": "embodied",
            "loss_type": alg.loss_type,
            "logprob_type": alg.logprob_type,
            "reward_type": alg.reward_type,
            "single_action_dim": self.action_dim,
            "logprobs": logprobs.reshape(n, -1).float(),
            "old_logprobs": mb["prev_logprobs"],
            "advantages": mb["advantages"],
            "clip_ratio_low": alg.clip_ratio_low,
            "clip_ratio_high": alg.clip_ratio_high,
            "loss_mask": mb.get("loss_mask"),
            "loss_mask_sum": mb.get("loss_mask_sum"),
            "critic_warmup": self.optimizer_steps < alg.critic_warmup_steps,
        }
        if alg.clip_ratio_c is not None:
            loss_kwargs["clip_ratio_c"] = alg.clip_ratio_c
        if alg.loss_type in ("actor_critic", "decoupled_actor_critic"):
            loss_kwargs.update(
                values=values.float(),
                returns=mb["returns"],
                prev_values=mb["prev_values"],
                value_clip=alg.value_clip,
                huber_delta=alg.huber_delta,
            )
        loss, metrics = policy_loss(**loss_kwargs)
        if not loss_kwargs["critic_warmup"]:
            ent = reshape_entropy(entropy.reshape(n, -1), alg.entropy_type, self.action_dim, n)
            mask = mb.get("loss_mask")
            if mask is not None and ent is not None and ent.ndim == 1:
                mask = mask.reshape(n)
            entropy_loss = masked_mean(ent, mask)
            if alg.entropy_bonus > 0:
                loss = loss - alg.entropy_bonus * entropy_loss
            metrics["actor/entropy_loss"] = float(entropy_loss.detach())
        return loss, {k: float(v) for k, v in metrics.items()}

    def train(self, batch: Mapping[str, torch.Tensor]) -> dict[str, float]:
        """Run ``algorithm.update_epoch`` passes of mini-batch updates over ``batch``; returns averaged metrics.

        ``batch`` must already hold ``advantages`` (see :meth:`compute_advantages_and_returns`).
        """
        if "advantages" not in batch:
            raise ValueError("batch has no 'advantages': call compute_advantages_and_returns first")
        flat = self._flatten(batch)
        n = flat["obs"].shape[0]
        local_batch = self.actor.global_batch_size // self.world_size
        mbs = self.actor.micro_batch_size
        accum = local_batch // mbs
        if n < local_batch:
            raise ValueError(
                f"rollout has {n} samples on this rank but actor.global_batch_size / world_size = {local_batch}; "
                f"collect more (env.train.total_num_envs x steps) or lower the batch size"
            )
        self._set_lr()
        sums: dict[str, float] = defaultdict(float)
        counts: dict[str, int] = defaultdict(int)
        self.policy.train()
        for _epoch in range(self.algorithm.update_epoch):
            perm = torch.randperm(n, generator=self.generator)
            for start in range(0, n - local_batch + 1, local_batch):
                idx = perm[start : start + local_batch]
                self.optimizer.zero_grad(set_to_none=True)
                for k in range(accum):
                    sel = idx[k * mbs : (k + 1) * mbs]
                    mb = {key: val[sel] for key, val in flat.items()}
                    loss, metrics = self._micro_batch_loss(mb)
                    (loss / accum).backward()
                    for key, val in metrics.items():
                        sums[key] += val
                        counts[key] += 1
                    sums["actor/total_loss"] += float(loss.detach()) / accum
                    counts["actor/total_loss"] += 1
                clip = self.actor.optim.clip_grad
                grad_norm = nn.utils.clip_grad_norm_(
                    self.policy.parameters(), clip if clip is not None else math.inf
                )
                self.optimizer.step()
                self.optimizer_steps += 1
                sums["actor/grad_norm"] += float(grad_norm)
                counts["actor/grad_norm"] += 1
        self.train_steps += 1
        out = {k: sums[k] / counts[k] for k in sums}
        out["actor/lr"] = self.optimizer.param_groups[0]["lr"]
        if "returns" in flat:
            out["critic/explained_variance"] = _explained_variance(flat["prev_values"], flat["returns"])
        return out

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Model, optimizer, counters and the shuffling RNG (everything resume needs)."""
        return {
            "model": self.policy.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "optimizer_steps": self.optimizer_steps,
            "train_steps": self.train_steps,
            "generator": self.generator.get_state(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved."""
        self.policy.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.optimizer_steps = int(state["optimizer_steps"])
        self.train_steps = int(state["train_steps"])
        self.generator.set_state(state["generator"])


def _explained_variance(values: torch.Tensor, returns: torch.Tensor) -> float:
    returns = returns[:, -1:] if returns.shape[1] != values.shape[1] else returns
    var = float(torch.var(returns, unbiased=False))
    if var == 0 or returns.numel() < 2:
        return float("nan")
    return 1.0 - float(torch.var(returns - values, unbiased=False)) / var
