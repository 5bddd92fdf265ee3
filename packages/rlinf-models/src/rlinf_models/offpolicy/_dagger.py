"""DAgger (Ross et al. 2011, https://arxiv.org/abs/1011.0686): imitate an expert on the states the learner visits.

Each rollout runs the learner, with the expert's action executed instead at a per-step probability ``β_i`` that
decays over training steps (the rollout worker mixes; see :class:`~rlinf_models.ExpertConfig`). Every visited
observation is labelled with the expert's deterministic action and aggregated in a buffer; the learner is
trained by regression on the whole aggregate. The expert sees an observation entry the learner does not
(``privileged_state`` beside ManiSkill's camera images), which is how a vision policy is distilled from a state
policy trained by RL.

The learner is the off-policy tanh-Gaussian policy: its deterministic action ``tanh(μ(s))`` (normalised to
``[-1, 1]``) regresses the expert's action clipped to the bounds and normalised the same way, by mean squared
error over the chunk's actions.

With ``actor.expert.gating`` ``discrepancy`` or ``intervention`` the same trainer runs HG-DAgger (see
:mod:`rlinf_models.offpolicy._hgdagger`): the rollout's learner drives, and only the chunks the expert (a
simulated or a real human) controlled enter the aggregate, labelled with the actions it executed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch
from rlinf_core.config import AlgorithmConfig
from rlinf_core.protocols import EnvSpec, ObsSpec, obs_index, obs_len, obs_map

from .._config import EmbodiedActorConfig, ExpertConfig
from .._fsdp import full_optimizer_state_dict, load_full_optimizer_state_dict
from ..actor import adamw
from ..policies import ActorCritic, FlowPolicy, FlowSACPolicy, SquashedGaussianPolicy, build_inference_policy
from ..policies._encoders import TensorObs
from ..policies._weights import load_policy_weights
from ._buffer import ReplayBuffer
from ._hgdagger import action_discrepancy, count_takeovers, intervention_metrics

if TYPE_CHECKING:
    from ..gr00t import GR00TPolicy
    from ..openvla import OpenVLAOFTPolicy, OpenVLAPolicy
    from ..pi0 import Pi0Policy
    from ..smolvla import SmolVLAPolicy
from ._trainer import _augmented_keys, shift_images

__all__ = ["DAggerTrainer", "build_expert", "expert_spec"]


def expert_spec(spec: EnvSpec, expert: ExpertConfig) -> EnvSpec:
    """The env spec the expert was trained on: ``spec`` with the observation reduced to ``expert.obs_key``.

    Raises:
        ValueError: naming ``actor.expert.obs_key`` when the observation has no such entry.
    """
    if expert.obs_key is None:
        if spec.obs_dict is not None:
            raise ValueError(
                f"actor.expert.obs_key: null needs an array observation; the env observes {sorted(spec.obs_dict)}"
            )
        return spec
    if spec.obs_dict is None or expert.obs_key not in spec.obs_dict:
        have = "an array" if spec.obs_dict is None else ", ".join(spec.obs_dict)
        raise ValueError(f"actor.expert.obs_key: {expert.obs_key!r} is not in the observation ({have})")
    entry: ObsSpec = spec.obs_dict[expert.obs_key]
    return EnvSpec(
        entry.shape,
        spec.action_type,
        spec.action_dim,
        num_actions=spec.num_actions,
        action_low=spec.action_low,
        action_high=spec.action_high,
        obs_dtype=entry.dtype,
    )


def build_expert(
    spec: EnvSpec, expert: ExpertConfig, device: torch.device | None = None
) -> (
    ActorCritic
    | FlowPolicy
    | Pi0Policy
    | SmolVLAPolicy
    | GR00TPolicy
    | OpenVLAPolicy
    | OpenVLAOFTPolicy
    | SquashedGaussianPolicy
    | FlowSACPolicy
):
    """The expert policy with its checkpoint's weights, in eval mode (``act(obs, deterministic=True)``).

    Raises:
        FileNotFoundError: naming ``actor.expert.checkpoint`` when the weights are not there.
        ValueError: naming the entries when they do not fit ``actor.expert.model`` (the architecture of the
            expert's run).
    """
    policy = build_inference_policy(expert_spec(spec, expert), expert.model)
    load_policy_weights(policy, expert.weights_file(), field="actor.expert.checkpoint", strict=True)
    policy.to(device or torch.device("cpu")).eval()
    return policy


class DAggerTrainer:
    """The learner's side of DAgger: expert labels, the aggregated data set, regression steps.

    Args:
        policy: the learner (a :class:`SquashedGaussianPolicy` on ``device``); what the rollout runs.
        spec: the env.
        actor: the ``actor`` config (``expert``, ``optim``, ``global_batch_size`` = regression batch size,
            ``model.image_aug``).
        algorithm: ``loss_type: embodied_dagger`` with ``replay_buffer`` (the aggregate: its ``cache_size``
            bounds it), ``utd_ratio`` / ``update_epoch`` (gradient steps per training step).
        device: where the networks live.

    Raises:
        ValueError: without ``actor.expert``.

    With ``actor.expert.gating`` other than ``mixture`` (HG-DAgger) no expert policy is built here: the labels are
    the actions the expert executed, which the trajectory carries.
    """

    def __init__(
        self,
        policy: SquashedGaussianPolicy,
        spec: EnvSpec,
        actor: EmbodiedActorConfig,
        algorithm: AlgorithmConfig,
        *,
        device: torch.device | None = None,
    ) -> None:
        if actor.expert is None:
            raise ValueError(
                "algorithm.loss_type 'embodied_dagger' needs actor.expert (the policy to imitate)"
            )
        self.device = device or torch.device("cpu")
        self.algorithm = algorithm
        self.expert_cfg = actor.expert
        self.gated = actor.expert.gating != "mixture"
        self.expert = None if self.gated else build_expert(spec, actor.expert, self.device)
        self.policy = policy
        self.batch_size = actor.global_batch_size
        self.clip_grad = actor.optim.clip_grad
        self._aug_keys = _augmented_keys(spec, actor.model.image_aug)
        self.aug_pad = actor.model.image_aug_pad
        # Only what the learner reads is stored (not the expert's privileged entry, unless the learner sees it).
        keys = actor.model.obs_keys
        self._keep: Callable[[Any], Any] = (
            (lambda obs: {k: obs[k] for k in keys}) if keys is not None else (lambda obs: obs)
        )
        optim = actor.optim
        self.optimizer = adamw(policy.parameters(), optim)
        rb = algorithm.replay_buffer
        self.buffer = ReplayBuffer(
            rb.cache_size, sample_window_size=rb.sample_window_size, min_size=rb.min_buffer_size, seed=rb.seed
        )
        self.update_steps = 0
        """Gradient steps so far."""
        self.train_steps = 0
        """:meth:`update` calls so far (the model version the rollout gets)."""
        self._last_flags: torch.Tensor | None = None
        # HG-DAgger: each env's control flag at the end of the last rollout (a takeover can span two rollouts).
        self._rollout_metrics: dict[str, float] = {}

    # ------------------------------------------------------------------------------------------ queries
    def beta(self) -> float:
        """``β`` of the next rollout: the probability the expert's action is executed."""
        return float(self.expert_cfg.beta * self.expert_cfg.beta_decay**self.train_steps)

    def updates_for(self, transitions: int) -> int:
        """Gradient steps of one training step that collected ``transitions`` (``utd_ratio`` or ``update_epoch``)."""
        utd = self.algorithm.utd_ratio
        return self.algorithm.update_epoch if utd is None else max(1, round(utd * transitions))

    @torch.no_grad()
    def label(self, obs: TensorObs) -> torch.Tensor:
        """The expert's normalised actions ``[N, C, D]`` in ``[-1, 1]`` for ``N`` observations."""
        if self.expert is None:
            raise RuntimeError(
                f"actor.expert.gating {self.expert_cfg.gating!r} builds no expert to label with"
            )
        key = self.expert_cfg.obs_key
        seen = obs[key] if isinstance(obs, Mapping) and key is not None else obs
        out = self.expert.act(obs_map(lambda x: x.to(self.device), seen), deterministic=True)
        actions = out.actions.float()
        chunks = self.policy.chunks
        if actions.shape[1] != chunks:
            # An expert with other chunks: its first action, repeated (state policies act every step).
            actions = actions[:, :1].expand(-1, chunks, -1)
        low = self.policy.action_bias - self.policy.action_scale
        high = self.policy.action_bias + self.policy.action_scale
        return self.policy.from_env(torch.clamp(actions, low, high))

    # ------------------------------------------------------------------------------------------- updates
    def add_trajectory(self, traj: Mapping[str, Any]) -> int:
        """Label a trajectory's observations with the expert and add them to the aggregate.

        HG-DAgger (``gating`` ``discrepancy`` / ``intervention``): only the chunks the expert controlled in
        every step (``traj["interventions"]`` ``[T, E, C]``) are added, labelled with their executed actions.

        Returns:
            The chunked steps received (``T x E``; for ``mixture`` all of them are added).
        """
        if "obs" not in traj:
            raise ValueError(f"trajectory lacks 'obs' (it has {sorted(traj)})")
        if self.gated:
            return self._add_gated(traj)
        obs = obs_map(lambda x: x.flatten(0, 1), traj["obs"])
        n = obs_len(obs)
        labels = [self.label(obs_index(obs, slice(lo, lo + 1024))) for lo in range(0, n, 1024)]
        batch = {"obs": self._keep(obs), "expert_actions": torch.cat(labels).cpu()}
        self.buffer.add(batch)
        return n

    def _add_gated(self, traj: Mapping[str, Any]) -> int:
        if "interventions" not in traj:
            raise ValueError(
                f"actor.expert.gating {self.expert_cfg.gating!r}: the trajectory carries no 'interventions' (it has "
                f"{sorted(traj)}); 'discrepancy' needs the rollout's gate, 'intervention' an env that reports "
                "is_intervention and teleop_action in its step info"
            )
        flags: torch.Tensor = traj["interventions"].to(torch.bool)  # [T, E, C]
        t, e, c = flags.shape
        obs = obs_map(lambda x: x.flatten(0, 1), traj["obs"])
        actions: torch.Tensor = traj["actions"].flatten(0, 1)  # [T*E, C, D] env units, the executed actions
        take = flags.all(dim=-1).flatten()  # a chunk is a sample when the expert executed all of it
        idx = take.nonzero().flatten()
        kept = obs_index(obs, idx)
        low = self.policy.action_bias - self.policy.action_scale
        high = self.policy.action_bias + self.policy.action_scale
        labels = self.policy.from_env(torch.clamp(actions[idx].to(low.device).float(), low, high)).cpu()
        discrepancy = traj.get("discrepancy")  # [T, E] from the rollout's gate
        if discrepancy is None and len(idx):
            # A real human: how far the learner is from the human where the human acted.
            discrepancy = torch.full((t * e,), float("nan"))
            discrepancy[idx] = self._learner_discrepancy(kept, labels)
            discrepancy = discrepancy.reshape(t, e)
        if len(idx):
            self.buffer.add({"obs": self._keep(kept), "expert_actions": labels})
        # Per env step, in time order: step (t, k) is row t * C + k; a step starts an episode after a done.
        steps = flags.permute(0, 2, 1).reshape(t * c, e)
        ended = traj["dones"].to(torch.bool)  # [T+1, E, C]; row 0: before the rollout
        starts = torch.cat([ended[:1, :, -1], ended[1:].permute(0, 2, 1).reshape(t * c, e)[:-1]])
        prev = self._last_flags if self._last_flags is not None and self._last_flags.shape == (e,) else None
        takeovers, self._last_flags = count_takeovers(steps, starts, prev)
        per_step = None
        if discrepancy is not None:
            per_step = discrepancy.float()[:, None, :].expand(t, c, e).reshape(t * c, e)
        metrics = intervention_metrics(steps, takeovers, per_step)
        metrics["hgdagger/aggregated"] = float(len(idx))
        self._rollout_metrics = metrics
        return t * e

    @torch.no_grad()
    def _learner_discrepancy(self, obs: TensorObs, labels: torch.Tensor) -> torch.Tensor:
        self.policy.eval()
        out = []
        for lo in range(0, len(labels), 1024):
            rows = obs_index(obs, slice(lo, lo + 1024))
            action, _ = self.policy.sample(obs_map(lambda x: x.to(self.device), rows), deterministic=True)
            out.append(action_discrepancy(action.cpu(), labels[lo : lo + 1024]))
        return torch.cat(out)

    def update(self, num_steps: int) -> dict[str, float]:
        """``num_steps`` regression steps on the aggregate (none while it holds fewer than ``min_buffer_size``).

        Returns:
            ``dagger/loss`` (mean over the steps), ``dagger/num_updates``, ``dagger/beta`` (of the next rollout;
            ``mixture`` only), ``replay_buffer/size`` and, for HG-DAgger, the last rollout's
            :func:`~rlinf_models.offpolicy._hgdagger.intervention_metrics` and ``hgdagger/aggregated`` (chunks
            added).
        """
        losses = []
        if self.buffer.ready():
            self.policy.train()
            for _ in range(num_steps):
                losses.append(self._step())
        self.train_steps += 1
        metrics = {"dagger/num_updates": float(len(losses)), "replay_buffer/size": float(len(self.buffer))}
        if not self.gated:
            metrics["dagger/beta"] = self.beta()
        metrics |= self._rollout_metrics
        self._rollout_metrics = {}
        if losses:
            metrics["dagger/loss"] = float(torch.stack(losses).mean())
        return metrics

    def _step(self) -> torch.Tensor:
        batch = obs_map(lambda v: v.to(self.device, non_blocking=True), self.buffer.sample(self.batch_size))
        obs = batch["obs"]
        if self._aug_keys is not None:
            obs = self._augment(obs)
        action, _ = self.policy.sample(obs, deterministic=True)
        target: torch.Tensor = batch["expert_actions"]
        loss = (action - target).pow(2).mean()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated
        if self.clip_grad is not None:
            torch.nn.utils.clip_grad_norm_(self.policy.parameters(), self.clip_grad)
        self.optimizer.step()
        self.update_steps += 1
        return loss.detach()

    def _augment(self, obs: TensorObs) -> TensorObs:
        rows = obs_len(obs)
        return shift_images(
            obs,
            self._aug_keys or (),
            self.aug_pad,
            lambda span: torch.randint(0, span, (rows, 2), device=self.device),
        )

    # ------------------------------------------------------------------------------------- checkpoints
    def checkpoint_files(self) -> list[tuple[str, Any]]:
        """What a checkpoint holds besides the policy: ``optimizer.pt``, ``trainer.pt`` (counters, aggregate)."""
        return [
            ("optimizer.pt", {"actor": full_optimizer_state_dict(self.policy, self.optimizer)}),
            (
                "trainer.pt",
                {
                    "update_steps": self.update_steps,
                    "train_steps": self.train_steps,
                    "buffer": self.buffer.state_dict(),
                    "last_flags": self._last_flags,
                },
            ),
        ]

    def load_checkpoint_files(self, load: Callable[[str], Any]) -> None:
        """Restore :meth:`checkpoint_files` (``load(name)`` reads one file)."""
        load_full_optimizer_state_dict(self.policy, self.optimizer, load("optimizer.pt")["actor"])
        state = load("trainer.pt")
        self.update_steps = int(state["update_steps"])
        self.train_steps = int(state["train_steps"])
        self.buffer.load_state_dict(state["buffer"])
        self._last_flags = state.get("last_flags")
