"""PPO-family training of an embodied actor-critic on one rank's share of a rollout (RLinf's embodied actor).

The rollout batch is time-major, as the env workers produce it:

- ``obs [T, E, *obs_shape]``, ``actions [T, E, C]`` (discrete) or ``[T, E, C, D]`` (continuous)
- ``rewards [T, E, C]`` float32, ``dones [T+1, E, C]`` bool (row 0: state before the first step)
- ``prev_logprobs [T, E, C*D]`` from the rollout policy, ``prev_values [T+1, E, 1]`` (row T: bootstrap value)
- optionally ``forward_inputs``: a dict of ``[T, E, ...]`` tensors the policy's training forward takes as a third
  argument (the flow policy's denoising chains, ``PolicyOutput.forward_inputs``)

Advantages come from ``rlinf_algos.calculate_adv_and_returns`` and the loss from ``rlinf_algos.policy_loss``
with RLinf's keyword names, so any registered advantage or loss works here unchanged.

Data parallelism (``world_size`` ranks, each holding a contiguous share of the envs) is designed so that W ranks
make exactly the update one rank makes on the whole batch:

- mini-batches are *stratified by env unit*: the global envs are cut into ``U = gcd(E, global_batch_size)``
  contiguous units, and every mini-batch takes ``global_batch_size / U`` samples of every unit, chosen by a
  per-unit permutation whose seed depends only on a key drawn from a generator seeded with ``actor.seed``
  (identical on every rank) and on the unit's *global* index. Each rank's local mini-batch is therefore exactly
  its block of the one-rank mini-batch, in the same order, so the micro-batches are the same sets of samples;
- advantage normalisation and the explained variance use statistics summed over ranks (``reduce_sum``);
- gradients are averaged over ranks by FSDP (the mean over micro-batches of the micro-batch losses either way);
- the returned metrics are averaged over ranks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
from rlinf_algos import (
    calculate_adv_and_returns,
    compute_critic_explained_variance_from_stats,
    compute_critic_explained_variance_stats,
    masked_mean,
    policy_loss,
    reshape_entropy,
)
from rlinf_core.config import AlgorithmConfig
from rlinf_core.protocols import obs_index, obs_map
from torch import nn

from .._config import EmbodiedActorConfig
from ..actor import (
    MetricMeans,
    accumulate_gradients,
    adamw,
    check_layout,
    clip_gradients,
    lr_scale,
    mean_over_ranks,
    micro_batches,
    run_update,
)
from ..policies import ActorCritic
from ._types import EMBODIED_ADV_TYPES, MASKED_ADV_TYPES, REQUIRED_BATCH_KEYS

__all__ = [
    "EMBODIED_ADV_TYPES",
    "MASKED_ADV_TYPES",
    "REQUIRED_BATCH_KEYS",
    "STALENESS_BINS",
    "EmbodiedPPOTrainer",
    "staleness_counts",
]


STALENESS_BINS = 8
"""Bins of the staleness counts :meth:`EmbodiedActorWorker.compute_proximal_logprobs` returns."""


def staleness_counts(versions: torch.Tensor, current: int) -> dict[str, float]:
    """Counts of samples by staleness (``current - version``) for ``versions`` of any shape.

    Returns:
        ``staleness/samples``, ``staleness/sum``, ``staleness/max``, ``staleness/min`` and
        ``staleness/count_0 .. count_{STALENESS_BINS - 1}`` (the last bin holds that many versions or more).
    """
    lag = (current - versions.reshape(-1).long()).cpu()
    if lag.numel() == 0:
        return {"staleness/samples": 0.0}
    bins = torch.bincount(lag.clamp(0, STALENESS_BINS - 1), minlength=STALENESS_BINS)
    out = {
        "staleness/samples": float(lag.numel()),
        "staleness/sum": float(lag.sum()),
        "staleness/max": float(lag.max()),
        "staleness/min": float(lag.min()),
    }
    out.update({f"staleness/count_{d}": float(c) for d, c in enumerate(bins.tolist())})
    return out


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
    for key in ("actions", "prev_logprobs"):
        if tuple(batch[key].shape[:2]) != (t, e):
            raise ValueError(f"{key} must start with [T={t}, E={e}], got {list(batch[key].shape)}")
    obs: Any = batch["obs"]
    for name, value in obs.items() if isinstance(obs, Mapping) else [("obs", obs)]:
        if tuple(value.shape[:2]) != (t, e):
            where = name if name == "obs" else f"obs[{name!r}]"
            raise ValueError(f"{where} must start with [T={t}, E={e}], got {list(value.shape)}")
    return t, e, c


def _rows(obs: Any, n: int) -> Any:
    """``[T, E, ...]`` observations (an array or a dict of them) as ``[T*E, ...]``."""
    return obs_map(lambda x: x.reshape(n, *x.shape[2:]), obs)


class EmbodiedPPOTrainer:
    """Computes advantages and runs the policy update for one actor rank.

    Args:
        policy: the actor-critic (possibly FSDP-wrapped by the caller; gradients are then reduced by FSDP).
        algorithm: the ``algorithm:`` config.
        actor: the ``actor:`` config (optimizer, batch sizes, seed).
        world_size: number of data-parallel actor ranks (the global batch is split evenly).
        rank: this rank; it holds envs ``[rank * E_local, (rank + 1) * E_local)`` of the global batch.
        total_steps: training steps of the run, for the linear learning-rate schedule.
        reduce_sum: sums a tensor over the data-parallel ranks (e.g. a gloo/NCCL all-reduce); ``None`` for one
            rank. Used for advantage normalisation, the explained variance and the metrics.
    """

    def __init__(
        self,
        policy: ActorCritic | nn.Module,
        algorithm: AlgorithmConfig,
        actor: EmbodiedActorConfig,
        *,
        world_size: int = 1,
        rank: int = 0,
        total_steps: int | None = None,
        reduce_sum: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        check_layout(rank, world_size, actor.global_batch_size, actor.micro_batch_size)
        if world_size > 1 and reduce_sum is None:
            raise ValueError(f"world_size={world_size} needs reduce_sum (a sum over the data-parallel ranks)")
        self.policy = policy
        self.algorithm = algorithm
        self.actor = actor
        self.world_size = world_size
        self.rank = rank
        self.total_steps = total_steps
        self._reduce_sum = reduce_sum
        module: Any = getattr(policy, "module", policy)
        # The critic: the MLP policies' critic_body / value_head, and a VLA's value head wherever it sits
        # (``model.value_head.*`` in π0, SmolVLA and OpenVLA): all of it learns at ``optim.value_lr``.
        critic = [
            p
            for n, p in module.named_parameters()
            if n.startswith("critic_body") or "value_head" in n.split(".")
        ]
        critic_ids = {id(p) for p in critic}
        actor_params = [p for p in policy.parameters() if id(p) not in critic_ids]
        optim = actor.optim
        groups = [{"params": actor_params, "lr": optim.lr, "initial_lr": optim.lr}]
        if critic:
            value_lr = optim.value_lr or optim.lr
            groups.append({"params": critic, "lr": value_lr, "initial_lr": value_lr})
        self.optimizer = adamw(groups, optim)
        # Same seed on every rank: it only draws the per-epoch key of the stratified shuffle (see module doc).
        self.generator = torch.Generator().manual_seed(actor.seed)
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
            # Normalised below with statistics over all ranks, not this rank's share.
            kwargs["normalize_advantages"] = False
        result = calculate_adv_and_returns(**kwargs)
        if not isinstance(result, dict):  # the embodied layout always answers a dict
            raise TypeError(f"calculate_adv_and_returns returned {type(result).__name__}, expected a dict")
        advantages = result["advantages"]
        if alg.adv_type == "gae" and alg.normalize_advantages:
            advantages = self._standardize(advantages, batch.get("loss_mask"))
        batch["advantages"] = advantages
        if "returns" in result:
            batch["returns"] = result["returns"]
        return batch

    def _sum(self, x: torch.Tensor) -> torch.Tensor:
        return x if self._reduce_sum is None else self._reduce_sum(x)

    def _standardize(self, values: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """``(x - mean) / (std + 1e-5)`` with the masked mean and unbiased std over all ranks (float64)."""
        x = values.double()
        if mask is None:
            m = torch.ones_like(x)
        else:
            m = mask.bool()
            if m.shape[-1] != x.shape[-1]:  # chunk_level: one advantage per chunk
                m = m.any(dim=-1, keepdim=True)
            m = m.expand_as(x).double()
        count = self._sum(m.sum())
        if float(count) == 0:
            return values
        mean = self._sum((x * m).sum()) / count
        var = self._sum((((x - mean) ** 2) * m).sum()) / (count - 1)
        return ((x - mean) / (var.sqrt() + 1e-5)).to(values.dtype)

    # ------------------------------------------------------------------ decoupled PPO
    @torch.no_grad()
    def compute_proximal_logprobs(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Add ``proximal_logprobs [T, E, C*D]``: the log-probs of the batch's actions under the current weights.

        The proximal policy of decoupled PPO is the policy before this update (AReaL). Samples generated by the
        current weights (``versions == train_steps``) keep their behaviour log-probs: it is the same policy, and
        recomputing them would only add the rounding of another batch layout. The forward runs over every
        local sample, in ``actor.micro_batch_size`` chunks, only when some sample of any rank is older (with
        several ranks the count is summed first, so that the FSDP forwards stay collective).

        Returns:
            ``batch`` with ``proximal_logprobs`` added.

        Raises:
            ValueError: when the batch has no ``versions [T, E]``.
        """
        t, e, _ = _check_batch(batch)
        versions = batch.get("versions")
        if versions is None or tuple(versions.shape) != (t, e):
            shape = None if versions is None else list(versions.shape)
            raise ValueError(f"decoupled PPO needs versions [T={t}, E={e}] in the rollout batch, got {shape}")
        prev = batch["prev_logprobs"].float()
        stale = (versions < self.train_steps).reshape(t, e, 1)
        proximal = prev.clone()
        if float(self._sum(stale.sum().double())) > 0:
            n = t * e
            obs = _rows(batch["obs"], n)
            actions = batch["actions"].reshape(n, *batch["actions"].shape[2:])
            was_training = self.policy.training
            self.policy.eval()
            parts = []
            extra = batch.get("forward_inputs")
            extra = None if extra is None else _rows(extra, n)
            for lo in range(0, n, self.actor.micro_batch_size):
                hi = min(n, lo + self.actor.micro_batch_size)
                rows = slice(lo, hi)
                logprobs, _, _ = self._forward(
                    obs_index(obs, rows), actions[rows], None if extra is None else obs_index(extra, rows)
                )
                parts.append(logprobs.reshape(hi - lo, -1).float())
            self.policy.train(was_training)
            recomputed = torch.cat(parts).reshape(prev.shape)
            proximal = torch.where(stale, recomputed, prev)
        batch["proximal_logprobs"] = proximal
        return batch

    # ------------------------------------------------------------------ update
    def _flatten(self, batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        t, e, _ = _check_batch(batch)
        n = t * e
        flat = {
            "obs": _rows(batch["obs"], n),
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
        if batch.get("forward_inputs") is not None:
            flat["forward_inputs"] = _rows(batch["forward_inputs"], n)
        if "proximal_logprobs" in batch:
            flat["proximal_logprobs"] = batch["proximal_logprobs"].reshape(n, -1).float()
            flat["versions"] = batch["versions"].reshape(n)
        if self.algorithm.reward_type == "chunk_level":
            for key in ("advantages", "returns", "loss_mask", "loss_mask_sum"):
                if key in flat:
                    flat[key] = flat[key][:, -1:]
        return flat

    def epoch_minibatches(self, num_steps: int, num_envs: int) -> list[torch.Tensor]:
        """Draw one epoch's mini-batches: local flat sample indices (``t * E_local + e``), ``G / world_size`` each.

        Stratified by env unit (see the module docstring): with ``E = num_envs * world_size`` global envs and
        ``G = actor.global_batch_size``, the envs form ``U = gcd(E, G)`` contiguous units of ``E / U`` envs, and
        every mini-batch holds ``G / U`` samples of each unit. Rank ``r``'s part of a mini-batch is the block
        ``r`` of the one-rank mini-batch, so the split across ranks never changes which samples meet.
        Advances :attr:`generator` by one draw (the same on every rank).

        Args:
            num_steps: ``T`` rows of the local batch.
            num_envs: ``E_local`` envs of the local batch.

        Returns:
            ``N // G`` int64 tensors of ``G / world_size`` indices into the local ``[T * E_local]`` samples.
        """
        world = self.world_size
        gbs = self.actor.global_batch_size
        units = math.gcd(num_envs * world, gbs)
        envs_per_unit = num_envs * world // units
        per_unit = gbs // units
        local_units = units // world  # world divides both E and G, hence their gcd
        n_batches = envs_per_unit * num_steps // per_unit
        key = int(torch.randint(0, 2**62, (1,), generator=self.generator))
        columns = []
        for j in range(local_units):
            unit = self.rank * local_units + j
            gen = torch.Generator().manual_seed((key + unit * 0x9E3779B97F4A7C15) % 2**63)
            perm = torch.randperm(envs_per_unit * num_steps, generator=gen)[: n_batches * per_unit]
            idx = (perm // envs_per_unit) * num_envs + j * envs_per_unit + perm % envs_per_unit
            columns.append(idx.view(n_batches, per_unit))
        return list(torch.cat(columns, dim=1).unbind(0))

    def _set_lr(self) -> None:
        scale = lr_scale(self.actor.optim.lr_schedule, self.train_steps, self.total_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = group["initial_lr"] * scale

    def _forward(
        self, obs: Any, actions: torch.Tensor, forward_inputs: Any
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The policy's training forward; ``forward_inputs`` (the rollout's extra per-sample tensors) when any."""
        if forward_inputs is None:
            out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] = self.policy(obs, actions)
        else:
            out = self.policy(obs, actions, forward_inputs)
        return out

    def _micro_batch_loss(
        self, mb: Mapping[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, float | torch.Tensor]]:
        alg = self.algorithm
        n = mb["actions"].shape[0]
        logprobs, entropy, values = self._forward(mb["obs"], mb["actions"], mb.get("forward_inputs"))
        loss_kwargs: dict[str, Any] = {
            "task_type": "embodied",
            "loss_type": alg.loss_type,
            "loss_agg_func": alg.loss_agg_func,
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
        if alg.loss_type == "decoupled_actor_critic" and "proximal_logprobs" in mb:
            width = loss_kwargs["logprobs"].shape[1]
            loss_kwargs.update(
                proximal_logprobs=mb["proximal_logprobs"],
                versions=mb["versions"].reshape(n, 1).expand(n, width),
                # The version this update produces (RLinf's convention); only the version metrics use it here.
                current_version=self.train_steps + 1,
            )
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
            metrics["actor/entropy_loss"] = entropy_loss.detach()
        # 0-d tensors, not floats: MetricMeans reads them back once per update, so no micro-batch waits on the GPU.
        return loss, {k: v.detach() if isinstance(v, torch.Tensor) else float(v) for k, v in metrics.items()}

    def train(self, batch: Mapping[str, torch.Tensor]) -> dict[str, float]:
        """Run ``algorithm.update_epoch`` passes of mini-batch updates over ``batch``; returns averaged metrics.

        ``batch`` must already hold ``advantages`` (see :meth:`compute_advantages_and_returns`).
        """
        if "advantages" not in batch:
            raise ValueError("batch has no 'advantages': call compute_advantages_and_returns first")
        t, e, _ = _check_batch(batch)
        flat = self._flatten(batch)
        n = flat["actions"].shape[0]
        local_batch = self.actor.global_batch_size // self.world_size
        mbs = self.actor.micro_batch_size
        if n < local_batch:
            raise ValueError(
                f"rollout has {n} samples on this rank but actor.global_batch_size / world_size = {local_batch}; "
                f"collect more (env.train.total_num_envs x steps) or lower the batch size"
            )
        self._set_lr()
        metrics = MetricMeans()
        self.policy.train()

        def loss_fn(sel: torch.Tensor) -> tuple[torch.Tensor, dict[str, float | torch.Tensor]]:
            loss, values = self._micro_batch_loss(obs_index(flat, sel))
            # ``__sum__/`` statistics (explained variance) land in ``metrics.totals``: computed below instead.
            return loss, values | {"actor/total_loss": loss.detach()}

        def step(rows: torch.Tensor) -> None:
            accumulate_gradients(micro_batches(rows, mbs), loss_fn, self.optimizer, metrics)
            grad_norm = clip_gradients(self.policy.parameters(), self.actor.optim.clip_grad)
            self.optimizer.step()
            self.optimizer_steps += 1
            metrics.add({"actor/grad_norm": grad_norm})

        run_update(
            epochs=self.algorithm.update_epoch, minibatches=lambda: self.epoch_minibatches(t, e), step=step
        )
        self.train_steps += 1
        out = mean_over_ranks(metrics.means(), self.world_size, self._reduce_sum)
        out["actor/lr"] = self.optimizer.param_groups[0]["lr"]
        if "returns" in flat:
            out["critic/explained_variance"] = self._explained_variance(flat["prev_values"], flat["returns"])
        return out

    def _explained_variance(self, values: torch.Tensor, returns: torch.Tensor) -> float:
        returns = returns[:, -1:] if returns.shape[1] != values.shape[1] else returns
        stats = compute_critic_explained_variance_stats(returns, values)
        keys = list(stats)
        summed = self._sum(torch.stack([stats[k].double() for k in keys]))
        return float(
            compute_critic_explained_variance_from_stats(dict(zip(keys, summed.tolist(), strict=True)))
        )

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
