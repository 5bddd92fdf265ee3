"""``SACTrainer``: the off-policy update (SAC, CrossQ, RLPD, TD3-style smoothing) over a replay buffer, no Ray.

One gradient step (:meth:`SACTrainer.update` makes ``num_steps`` of them):

1. sample a batch (``actor.global_batch_size`` transitions; half from the demo buffer when there is one);
2. critic: the target ``y`` from ``rlinf_algos.offpolicy`` (``sac_critic_target``; ``td3_critic_target`` with
   smoothed target actions; ``crossq_critic_target`` from one joint batch-renormalised forward and no target
   network), MSE over every Q head, one critic optimizer step;
3. every ``algorithm.critic_actor_ratio`` critic steps: the actor (``sac_actor_loss`` on reparameterised actions,
   critics frozen) and the temperature (``sac_temperature_loss``) unless ``alpha_type: fixed_alpha``;
4. every ``algorithm.target_update_freq`` critic steps: ``soft_target_update`` of the target critics by ``tau``.

Randomness (reparameterised samples, target noise, head subsets) comes from torch's global generator, whose
state the actor worker checkpoints; the buffers sample with their own generators, saved with their contents.

Data parallel (``world_size > 1``, the networks sharded with FSDP2 by the worker): every rank holds the same
buffers (the env sends every transition to every actor rank) and the same generators, so every rank samples the
same global batch and draws the same global noise; rank ``r`` trains on rows ``[r·B/W, (r+1)·B/W)`` of both.
FSDP2 averages the network gradients over ranks and the trainer averages the temperature's, so ``W`` ranks
make the step one rank makes on the whole batch (up to the order of float additions).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
import torch.distributed as dist
from rlinf_algos.offpolicy import (
    crossq_critic_target,
    sac_actor_loss,
    sac_alpha,
    sac_alpha_param_init,
    sac_critic_loss,
    sac_critic_target,
    sac_temperature_loss,
    soft_target_update,
    split_crossq_q,
    td3_critic_target,
    td3_target_actions,
)
from rlinf_core.config import AlgorithmConfig
from rlinf_core.protocols import EnvSpec, obs_concat, obs_map
from torch import nn

from .._config import EmbodiedActorConfig
from .._fsdp import (
    full_model_state_dict,
    full_optimizer_state_dict,
    load_full_model_state_dict,
    load_full_optimizer_state_dict,
)
from ..actor import adamw
from ..policies import FlowSACPolicy, QEnsemble, SquashedGaussianPolicy
from ..policies._encoders import TensorObs, random_shift
from ._buffer import ReplayBuffer, SymmetricSampler

__all__ = ["TRANSITION_KEYS", "SACTrainer", "trajectory_transitions"]

TRANSITION_KEYS = ("obs", "actions", "rewards", "terminations", "next_obs")
"""The fields of a stored transition (see :func:`trajectory_transitions`)."""


def trajectory_transitions(traj: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A trajectory of the env workers (``collect_transitions``) → ``T·E`` transitions, time-major.

    Args:
        traj: ``obs [T, E, *obs]``, ``next_obs [T, E, *obs]``, ``actions [T, E, C, D]``, ``rewards [T, E, C]``,
            ``terminations [T, E, C]`` (other keys are ignored).

    Returns:
        ``obs [N, *obs]``, ``actions [N, C, D]``, ``rewards [N, C]`` float32, ``terminations [N, C]`` bool,
        ``next_obs [N, *obs]`` with ``N = T·E``: all envs of step 0 first, then step 1, ...

    Raises:
        ValueError: when a field is missing (the env workers were not asked to collect transitions).
    """
    missing = [k for k in TRANSITION_KEYS if k not in traj]
    if missing:
        raise ValueError(
            f"trajectory lacks {missing} (it has {sorted(traj)}): the env workers must run with "
            "collect_transitions=True for off-policy training"
        )
    out: dict[str, Any] = {k: obs_map(lambda x: x.flatten(0, 1), traj[k]) for k in TRANSITION_KEYS}
    out["rewards"] = out["rewards"].float()
    out["terminations"] = out["terminations"].bool()
    return out


def _augmented_keys(spec: EnvSpec, aug: str) -> tuple[str, ...] | None:
    """The image entries ``actor.model.image_aug`` shifts (``()`` for an image array observation), or ``None``."""
    if aug == "none":
        return None
    layout = spec.observation
    if isinstance(layout, Mapping):
        keys = tuple(k for k, s in layout.items() if s.is_image)
        if keys:
            return keys
    elif layout.is_image:
        return ()
    raise ValueError(f"actor.model.image_aug: {aug!r} needs image observations; the env has {layout}")


def shift_images(
    obs: TensorObs, keys: tuple[str, ...], pad: int, draw: Callable[[int], torch.Tensor]
) -> TensorObs:
    """DrQ random shifts of the image entries ``keys`` of ``obs`` (all of an image array observation).

    ``draw(span)`` gives this rank's ``[rows, 2]`` integer offsets in ``[0, span)``, one call per image entry.
    """

    def shift(images: torch.Tensor) -> torch.Tensor:
        return random_shift(images, draw(2 * pad + 1), pad)

    if not isinstance(obs, Mapping):
        return shift(obs)
    return {k: shift(v) if k in keys else v for k, v in obs.items()}


def _clip(params: Iterable[nn.Parameter], max_norm: float | None) -> torch.Tensor | None:
    if max_norm is None:
        return None
    return torch.nn.utils.clip_grad_norm_(list(params), max_norm)


class SACTrainer:
    """The off-policy learner: policy, critics, target critics, temperature, optimizers and replay buffers.

    Args:
        policy: the tanh-Gaussian policy or SAC-Flow's flow policy (on ``device``); its weights are what the
            rollout runs.
        spec: the env.
        actor: the ``actor`` config (``model`` for the critics, ``optim``, ``global_batch_size`` = batch size).
        algorithm: the ``algorithm`` config (the off-policy fields, ``gamma``, ``bootstrap_type``).
        device: where the networks live (batches are moved there).
        rank: this rank of the actor group (data parallel).
        world_size: ranks of the actor group; more than one needs the default process group and ``shard``.
        shard: applies FSDP2 to a module in place (the worker's mesh); the critics are sharded with it.

    Raises:
        ValueError: with several ranks, when ``actor.global_batch_size`` does not split evenly over them or the
            critics are CrossQ's (batch renormalisation needs the whole batch's statistics).
    """

    def __init__(
        self,
        policy: SquashedGaussianPolicy | FlowSACPolicy,
        spec: EnvSpec,
        actor: EmbodiedActorConfig,
        algorithm: AlgorithmConfig,
        *,
        device: torch.device | None = None,
        rank: int = 0,
        world_size: int = 1,
        shard: Callable[[nn.Module], nn.Module] | None = None,
    ) -> None:
        self.device = device or torch.device("cpu")
        self.algorithm = algorithm
        self.batch_size = actor.global_batch_size
        self.rank, self.world_size = rank, world_size
        if world_size > 1:
            if actor.global_batch_size % world_size:
                raise ValueError(
                    f"actor.global_batch_size ({actor.global_batch_size}) must split evenly over the "
                    f"{world_size} off-policy actor ranks"
                )
            if algorithm.q_head_type == "crossq":
                raise ValueError(
                    "algorithm.q_head_type: crossq runs on one actor rank (batch renormalisation needs the "
                    "statistics of the whole batch); place the actor on one slot"
                )
            if shard is None:
                raise ValueError("several off-policy actor ranks need shard (FSDP2 over the actor group)")
        self.rows = actor.global_batch_size // world_size
        """Rows of each sampled batch this rank trains on."""
        self.clip_grad = actor.optim.clip_grad
        self.crossq = algorithm.q_head_type == "crossq"
        self.td3 = algorithm.target_policy_noise is not None
        self.policy = policy
        self.critic = QEnsemble(spec, actor.model, batch_renorm=self.crossq).to(self.device)
        self.target_critic: QEnsemble | None = None
        if not self.crossq:
            self.target_critic = copy.deepcopy(self.critic).requires_grad_(False)
        if shard is not None:
            shard(self.critic)
            if self.target_critic is not None:
                shard(self.target_critic)
        self._noise_shape = (
            policy.noise_shape if isinstance(policy, FlowSACPolicy) else (policy.chunks, spec.action_dim)
        )
        self._aug_keys = _augmented_keys(spec, actor.model.image_aug)
        self.aug_pad = actor.model.image_aug_pad
        optim = actor.optim
        # torch's fused AdamW on one rank (the sharded parameters of several keep torch's default kernels)
        self._fused_adamw = True if world_size == 1 and self.device.type in ("cpu", "cuda") else None
        self.actor_optimizer = adamw(policy.parameters(), optim, fused=self._fused_adamw)
        self.critic_optimizer = adamw(
            self.critic.parameters(), optim, lr=optim.value_lr or optim.lr, fused=self._fused_adamw
        )
        tuning = algorithm.entropy_tuning
        self.alpha_type = tuning.alpha_type
        init = sac_alpha_param_init(tuning.initial_alpha, alpha_type=tuning.alpha_type)
        self.alpha_param = nn.Parameter(
            torch.tensor([init], dtype=torch.float32, device=self.device),
            requires_grad=tuning.alpha_type != "fixed_alpha",
        )
        self.alpha_optimizer: torch.optim.Optimizer | None = None
        if tuning.alpha_type != "fixed_alpha":
            self.alpha_optimizer = torch.optim.Adam([self.alpha_param], lr=tuning.optim.lr)
        self.alpha_clip_grad = tuning.optim.clip_grad
        dims = policy.chunks * spec.action_dim
        self.target_entropy = -float(dims) if tuning.target_entropy is None else tuning.target_entropy
        rb = algorithm.replay_buffer
        self.buffer = ReplayBuffer(
            rb.cache_size, sample_window_size=rb.sample_window_size, min_size=rb.min_buffer_size, seed=rb.seed
        )
        self.demo_buffer: ReplayBuffer | None = None
        self.sampler: ReplayBuffer | SymmetricSampler = self.buffer
        demo = algorithm.demo_buffer
        if demo is not None:
            self.demo_buffer = ReplayBuffer.load(
                demo.load_path, min_size=demo.min_buffer_size, seed=demo.seed
            )
            self.sampler = SymmetricSampler(self.buffer, self.demo_buffer)
        self.update_steps = 0
        """Critic gradient steps so far."""
        self.train_steps = 0
        """:meth:`update` calls so far (the model version the rollout gets)."""

    # ------------------------------------------------------------------------------------------ queries
    def alpha(self) -> torch.Tensor:
        """The temperature ``α`` ``[1]`` (with autograd into its parameter)."""
        alpha: torch.Tensor = sac_alpha(self.alpha_param, alpha_type=self.alpha_type)
        return alpha

    def updates_for(self, transitions: int) -> int:
        """Gradient steps of one training step that collected ``transitions`` (``utd_ratio`` or ``update_epoch``)."""
        utd = self.algorithm.utd_ratio
        return self.algorithm.update_epoch if utd is None else max(1, round(utd * transitions))

    # ------------------------------------------------------------------------------------------- updates
    def add_trajectory(self, traj: Mapping[str, torch.Tensor]) -> int:
        """Store a trajectory's transitions in the online buffer; returns how many."""
        transitions = trajectory_transitions(traj)
        self.buffer.add(transitions)
        return int(transitions["rewards"].shape[0])

    def update(self, num_steps: int) -> dict[str, float]:
        """``num_steps`` gradient steps (none while a buffer is below its ``min_buffer_size``); mean metrics.

        Returns:
            ``sac/critic_loss``, ``critic/q_data``, ``sac/actor_loss``, ``actor/entropy``, ``sac/alpha``,
            ``sac/alpha_loss`` (means over the steps that made them), ``sac/num_updates`` and ``replay_buffer/*``.
        """
        sums: dict[str, torch.Tensor] = {}
        counts: dict[str, int] = {}
        done = 0
        if self.sampler.ready():
            for _ in range(num_steps):
                for k, v in self._step().items():
                    sums[k] = sums[k] + v if k in sums else v
                    counts[k] = counts.get(k, 0) + 1
                done += 1
        self.train_steps += 1
        means = {k: v / counts[k] for k, v in sums.items()}
        if self.world_size > 1 and means:  # each rank's means over its rows: their average is the batch's
            keys = sorted(means)
            stacked = torch.stack([means[k].detach().float() for k in keys])
            dist.all_reduce(stacked, op=dist.ReduceOp.SUM)
            means = dict(zip(keys, stacked / self.world_size, strict=True))
        metrics = {k: float(v) for k, v in means.items()}
        metrics["sac/num_updates"] = float(done)
        metrics["sac/alpha"] = float(self.alpha().detach())
        metrics["replay_buffer/size"] = float(len(self.buffer))
        metrics["replay_buffer/total_added"] = float(self.buffer.total_added)
        return metrics

    def _noise(self) -> torch.Tensor:
        """A standard-normal draw for the whole batch (the same on every rank), this rank's rows."""
        eps = torch.randn(self.batch_size, *self._noise_shape, device=self.device)
        return eps[self.rank * self.rows : (self.rank + 1) * self.rows]

    def _augment(self, obs: TensorObs) -> TensorObs:
        """DrQ random shifts of the image entries, drawn for the whole batch (the same on every rank)."""

        def draw(span: int) -> torch.Tensor:
            shifts = torch.randint(0, span, (self.batch_size, 2), device=self.device)
            return shifts[self.rank * self.rows : (self.rank + 1) * self.rows]

        return shift_images(obs, self._aug_keys or (), self.aug_pad, draw)

    def _step(self) -> dict[str, torch.Tensor]:
        batch = self._sample()
        metrics = self._critic_step(batch)
        self.update_steps += 1
        if self.update_steps % self.algorithm.critic_actor_ratio == 0:
            actor_metrics, logp = self._actor_step(batch["obs"])
            metrics.update(actor_metrics)
            metrics.update(self._alpha_step(logp))
        if self.target_critic is not None and self.update_steps % self.algorithm.target_update_freq == 0:
            self._target_update()
        return metrics

    def _sample(self) -> dict[str, Any]:
        """This rank's rows of a sampled batch, on :attr:`device`, images shifted when ``image_aug`` is on."""
        lo, hi = self.rank * self.rows, (self.rank + 1) * self.rows
        batch: dict[str, Any] = obs_map(
            lambda v: v[lo:hi].to(self.device, non_blocking=True), self.sampler.sample(self.batch_size)
        )
        if self._aug_keys is not None:
            batch["obs"] = self._augment(batch["obs"])
            batch["next_obs"] = self._augment(batch["next_obs"])
        return batch

    def _target_update(self) -> None:
        """Polyak update of the target critics by ``algorithm.tau`` (:func:`soft_target_update`)."""
        assert self.target_critic is not None  # built unless crossq
        # FSDP2 leaves a root unit's parameters gathered after a forward without backward: shard both sides
        # again so the update pairs shard with shard
        for module in (self.critic, self.target_critic):
            reshard = getattr(module, "reshard", None)
            if callable(reshard):
                reshard()
        soft_target_update(self.target_critic.parameters(), self.critic.parameters(), tau=self.algorithm.tau)

    def _next_actions(self, next_obs: TensorObs) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``a'`` (normalised) and ``log π(a'|s')`` ``[B, C*D]`` (``None`` under TD3 smoothing)."""
        with torch.no_grad():
            if self.td3:
                mean, _ = self.policy(next_obs, deterministic=True)
                noise = self._noise()
                smoothed = td3_target_actions(
                    mean,
                    noise,
                    noise_std=float(self.algorithm.target_policy_noise or 0.0),
                    noise_clip=self.algorithm.target_noise_clip,
                )
                return smoothed, None
            action, logp = self.policy(next_obs, noise=self._noise())
            return action, logp.reshape(logp.shape[0], -1)

    def _critic_step(self, batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        alg = self.algorithm
        obs, next_obs = batch["obs"], batch["next_obs"]
        rewards, terms = batch["rewards"], batch["terminations"]
        actions = self.policy.from_env(batch["actions"])
        next_actions, next_logp = self._next_actions(next_obs)
        alpha = self.alpha().detach()
        backup = alg.backup_entropy and not self.td3
        common: dict[str, Any] = {
            "gamma": alg.gamma,
            "agg_q": alg.agg_q,
            "bootstrap_type": alg.bootstrap_type,
        }
        if self.crossq:
            joint = self.critic(obs_concat([obs, next_obs]), torch.cat([actions, next_actions]))
            q, next_q = split_crossq_q(joint)
            target = crossq_critic_target(
                rewards, next_q, next_logp, terms, alpha=alpha, backup_entropy=backup, **common
            )
        else:
            assert self.target_critic is not None  # built unless crossq
            with torch.no_grad():
                next_q = self.target_critic(next_obs, next_actions)
            if self.td3:
                target = td3_critic_target(rewards, next_q, terms, **common)
            else:
                k = alg.critic_subsample_size
                heads = None if k is None else torch.randint(0, next_q.shape[1], (k,), device=self.device)
                target = sac_critic_target(
                    rewards,
                    next_q,
                    next_logp,
                    terms,
                    alpha=alpha,
                    backup_entropy=backup,
                    head_index=heads,
                    **common,
                )
            q = self.critic(obs, actions)
        loss = sac_critic_loss(q, target)
        self.critic_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        _clip(self.critic.parameters(), self.clip_grad)
        self.critic_optimizer.step()
        return {"sac/critic_loss": loss.detach(), "critic/q_data": q.detach().mean()}

    def _actor_step(self, obs: TensorObs) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """One policy step (critics frozen); its metrics and the detached log-probs ``[B, C*D]`` it drew."""
        action, logp = self.policy(obs, noise=self._noise())
        logp = logp.reshape(logp.shape[0], -1)
        self.critic.requires_grad_(False)
        if self.crossq:
            self.critic.eval()  # batch renorm with its running statistics
        try:
            q = self.critic(obs, action)
        finally:
            self.critic.requires_grad_(True)
            self.critic.train()
        alpha = self.alpha().detach()
        agg = self.algorithm.actor_agg_q or self.algorithm.agg_q
        loss, entropy = sac_actor_loss(logp, q, alpha=alpha, agg_q=agg)
        self.actor_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        _clip(self.policy.parameters(), self.clip_grad)
        self.actor_optimizer.step()
        return {"sac/actor_loss": loss.detach(), "actor/entropy": entropy.detach()}, logp.detach()

    def _alpha_step(self, logp: torch.Tensor) -> dict[str, torch.Tensor]:
        """One temperature step on the actor step's log-probs (none for ``alpha_type: fixed_alpha``)."""
        if self.alpha_optimizer is None:
            return {}
        alpha_loss = sac_temperature_loss(self.alpha(), logp, target_entropy=self.target_entropy).mean()
        self.alpha_optimizer.zero_grad(set_to_none=True)
        alpha_loss.backward()
        if self.world_size > 1 and self.alpha_param.grad is not None:  # a replicated parameter
            dist.all_reduce(self.alpha_param.grad, op=dist.ReduceOp.SUM)
            self.alpha_param.grad.div_(self.world_size)
        _clip([self.alpha_param], self.alpha_clip_grad)
        self.alpha_optimizer.step()
        return {"sac/alpha_loss": alpha_loss.detach()}

    # --------------------------------------------------------------------------------------- checkpoints
    def optimizer_state_dict(self) -> dict[str, Any]:
        """The three optimizers' full states, keyed by parameter name (collective under FSDP2; rank 0's)."""
        return {
            "actor": full_optimizer_state_dict(self.policy, self.actor_optimizer),
            "critic": full_optimizer_state_dict(self.critic, self.critic_optimizer),
            "alpha": None if self.alpha_optimizer is None else self.alpha_optimizer.state_dict(),
        }

    def load_optimizer_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`optimizer_state_dict` (at any world size, from a fused AdamW's state or another's)."""
        load_full_optimizer_state_dict(self.policy, self.actor_optimizer, state["actor"])
        load_full_optimizer_state_dict(self.critic, self.critic_optimizer, state["critic"])
        for optimizer in (self.actor_optimizer, self.critic_optimizer):
            for group in optimizer.param_groups:  # loading takes the saved groups' kernel choice: keep ours
                group["fused"], group["foreach"] = self._fused_adamw, None
        if self.alpha_optimizer is not None and state.get("alpha") is not None:
            self.alpha_optimizer.load_state_dict(state["alpha"])

    def critic_state_dict(self) -> dict[str, Any]:
        """Critics, target critics (full, collective under FSDP2) and the temperature parameter."""
        return {
            "critic": full_model_state_dict(self.critic),
            "target_critic": None
            if self.target_critic is None
            else full_model_state_dict(self.target_critic),
            "alpha_param": self.alpha_param.detach().cpu().clone(),
        }

    def load_critic_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`critic_state_dict` (at any world size)."""
        load_full_model_state_dict(self.critic, state["critic"])
        if self.target_critic is not None and state.get("target_critic") is not None:
            load_full_model_state_dict(self.target_critic, state["target_critic"])
        with torch.no_grad():
            self.alpha_param.copy_(state["alpha_param"].to(self.alpha_param.device))

    def checkpoint_files(self) -> list[tuple[str, Any]]:
        """What a checkpoint holds besides the policy: ``critic.pt``, ``optimizer.pt``, ``trainer.pt``."""
        return [
            ("critic.pt", self.critic_state_dict()),
            ("optimizer.pt", self.optimizer_state_dict()),
            ("trainer.pt", self.counters()),
        ]

    def load_checkpoint_files(self, load: Callable[[str], Any]) -> None:
        """Restore :meth:`checkpoint_files` (``load(name)`` reads one file)."""
        self.load_critic_state_dict(load("critic.pt"))
        self.load_optimizer_state_dict(load("optimizer.pt"))
        self.load_counters(load("trainer.pt"))

    def counters(self) -> dict[str, Any]:
        """Step counters and the buffers (contents and sampling generators)."""
        return {
            "update_steps": self.update_steps,
            "train_steps": self.train_steps,
            "buffer": self.buffer.state_dict(),
            "demo_generator": None if self.demo_buffer is None else self.demo_buffer.generator.get_state(),
        }

    def load_counters(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`counters`."""
        self.update_steps = int(state["update_steps"])
        self.train_steps = int(state["train_steps"])
        self.buffer.load_state_dict(state["buffer"])
        if self.demo_buffer is not None and state.get("demo_generator") is not None:
            self.demo_buffer.generator.set_state(state["demo_generator"])
