"""``EmbodiedRolloutWorker``: batched policy inference for the env ranks, with weights synced from the actor."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from rlinf_core.checkpoint import atomic_write_bytes, capture_rng_state, restore_rng_state
from rlinf_core.protocols import (
    EnvSpec,
    WeightMessage,
    obs_concat,
    obs_len,
    obs_map,
    receive_weights,
    take_newest_weights,
)
from rlinf_models import ExpertConfig
from rlinf_models.offpolicy import DiscrepancyGate, action_discrepancy, build_expert
from rlinf_models.policies import (
    FlowSACPolicy,
    PolicyConfig,
    PolicyOutput,
    SquashedGaussianPolicy,
    build_inference_policy,
    load_rollout_weights,
)
from rlinf_scheduler import Channel, Worker, peer_slices

from ._config import EmbodiedRolloutConfig

__all__ = ["CHECKPOINT_SUBDIR", "EmbodiedRolloutWorker"]

CHECKPOINT_SUBDIR = "rollout"
"""Where :meth:`EmbodiedRolloutWorker.save_checkpoint` writes inside a checkpoint directory."""


class EmbodiedRolloutWorker(Worker):
    """Serves observation requests of the env ranks with ``policy.act`` on a copy of the actor's policy.

    Weights arrive from actor rank 0 by ``broadcast`` as ``{"version": int, "state_dict": ...}`` (see
    :meth:`sync_model_from_actor`). Per stage, the rollout rank gathers the observation slices of its env peers
    (``peer_slices``), runs one batched forward and sends each peer its rows of ``actions``, ``logprobs``
    ``[n, C*D]``, ``values`` ``[n, 1]``, ``versions`` ``[n]`` (the weights' version), ``forward_inputs`` (a dict
    of ``[n, ...]`` arrays that the policy's training forward needs besides observation and actions, e.g. the flow
    policy's denoising chain; ``None`` for the other policies) and, when asked, ``final_values`` ``[n, 1]``. In
    asynchronous runs the weights come from a channel instead, taken between two inference calls (see
    :meth:`generate`).

    The weights are the whole model, or with ``actor.model.lora_sync: adapters`` only its trainable tensors, over
    the adapted policy that ``model_path``'s base weights gave at start-up
    (``rlinf_models.policies.load_rollout_weights``).

    Args:
        cfg: the ``rollout`` config.
        model: the policy architecture (``actor.model``).
        spec: the env's observation/action description.
        env_world_size: ranks of the env group.
        train_num_envs: ``env.train.total_num_envs``.
        eval_num_envs: ``env.eval.total_num_envs``.
        expert: DAgger (``actor.expert``): training rollouts run the policy deterministically. With ``gating:
            mixture`` they execute the expert's action instead at each step with probability
            ``beta * beta_decay**version``; with ``discrepancy`` (HG-DAgger's simulated human) the expert takes
            over an env while its action and the policy's differ by more than ``gate_threshold`` and hands back
            below ``release_threshold``, and each training reply also carries ``interventions`` ``[n]`` (bool:
            the expert's action was sent) and ``discrepancy`` ``[n]``; with ``intervention`` (a real human,
            reported by the env) no expert runs here.
    """

    def __init__(
        self,
        cfg: EmbodiedRolloutConfig,
        model: PolicyConfig,
        spec: EnvSpec,
        *,
        env_world_size: int = 1,
        train_num_envs: int = 1,
        eval_num_envs: int = 1,
        expert: ExpertConfig | None = None,
    ) -> None:
        torch.set_num_threads(cfg.torch_num_threads)
        torch.manual_seed(cfg.seed + self.rank)
        self.cfg = cfg
        self.model_cfg = model
        # With actor.model.lora_sync: adapters, this reads model_path's frozen base weights once, here.
        self.policy = build_inference_policy(spec, model)
        self.policy.eval()
        self.expert_cfg = expert
        human = expert is None or expert.gating == "intervention"
        self.expert = None if human or expert is None else build_expert(spec, expert)
        self.gate = (
            DiscrepancyGate(expert.gate_threshold, expert.release_threshold)
            if expert is not None and expert.gating == "discrepancy"
            else None
        )
        self.version = -1
        stages = cfg.pipeline_stage_num
        self._peers: dict[str, list[int]] = {}
        for mode, total in (("train", train_num_envs), ("eval", eval_num_envs)):
            per_stage = total // stages
            if total % stages or per_stage % self.world_size or per_stage % env_world_size:
                raise ValueError(
                    f"env.{mode}.total_num_envs ({total}) / pipeline stages ({stages}) must be a multiple of the "
                    f"rollout ranks ({self.world_size}) and of the env ranks ({env_world_size})"
                )
            self._peers[mode] = [
                p for p, _, _ in peer_slices(per_stage, self.rank, self.world_size, env_world_size)
            ]

    # --------------------------------------------------------------------------------------- public API
    def sync_model_from_actor(self, actor_group: str) -> int:
        """Receive the weights actor rank 0 broadcasts (:func:`rlinf_core.protocols.receive_weights`), load them.

        Returns:
            The version received.
        """
        with self.timer("sync_weights"):
            self._load(receive_weights(self, actor_group, timeout=self.cfg.recv_timeout_s))
        return self.version

    def _load(self, msg: WeightMessage) -> None:
        load_rollout_weights(self.policy, self.model_cfg, msg["state_dict"])
        self.version = msg["version"]

    def _take_weights(self, channel: Channel, min_version: int) -> None:
        """Load the newest weights published on ``channel`` for this rank (waiting for ``min_version``)."""
        with self.timer("take_weights"):
            msg = take_newest_weights(
                channel,
                self.rank,
                min_version=min_version,
                held=self.version,
                timeout=self.cfg.recv_timeout_s,
            )
            if msg is not None:
                self._load(msg)

    def get_model_version(self) -> int:
        """Version of the weights in use (-1 before the first sync)."""
        return self.version

    def offload(self) -> None:
        """Move the policy to the CPU (collocated GPU runs free the device for the actor)."""
        self.policy.to("cpu")

    def onload(self) -> None:
        """Move the policy back to this rank's accelerator (the CPU when there is none)."""
        self.policy.to(_device())

    def save_checkpoint(self, path: str) -> None:
        """Write this rank's state under ``<path>/rollout/`` atomically (call it on every rank).

        ``rng_rank<R>.pkl``: the RNG states (training actions are sampled from torch's global generator; the
        weights are the actor's to save). With HG-DAgger's ``gating: discrepancy`` also ``gate_rank<R>.pkl``: who
        controls each env's episode in progress (:meth:`DiscrepancyGate.state_dict`).
        """
        atomic_write_bytes(self._rng_file(path), capture_rng_state())
        if self.gate is not None:
            atomic_write_bytes(self._gate_file(path), pickle.dumps(self.gate.state_dict()))

    def load_checkpoint(self, path: str) -> None:
        """Restore the states :meth:`save_checkpoint` wrote.

        A checkpoint without them (an older one, or one written with fewer rollout ranks) keeps the current
        state, with a warning.
        """
        file = self._rng_file(path)
        if file.is_file():
            restore_rng_state(file.read_bytes())
        else:
            self.log_warning(
                "no rollout RNG state at %s: sampled actions differ from an uninterrupted run", file
            )
        if self.gate is None:
            return
        gate = self._gate_file(path)
        if gate.is_file():
            self.gate.load_state_dict(pickle.loads(gate.read_bytes()))
        else:
            self.log_warning(
                "no HG-DAgger gate state at %s: the episodes in progress continue under the learner's control",
                gate,
            )

    def _rng_file(self, path: str) -> Path:
        return Path(path) / CHECKPOINT_SUBDIR / f"rng_rank{self.rank}.pkl"

    def _gate_file(self, path: str) -> Path:
        return Path(path) / CHECKPOINT_SUBDIR / f"gate_rank{self.rank}.pkl"

    def generate(
        self,
        env_group: str,
        mode: Literal["train", "eval", "random"] = "train",
        *,
        weights: Channel | None = None,
        min_version: int = -1,
    ) -> int:
        """Serve the env ranks until each sent its end marker for every stage; returns the requests served.

        Args:
            env_group: the env group whose observations to answer.
            mode: ``train`` (sampled actions), ``eval`` (deterministic) or ``random`` (a training rollout with
                actions uniform over the action bounds: the off-policy warm-up; the policy needs
                ``random_actions``, as the off-policy ``SquashedGaussianPolicy`` has).
            weights: asynchronous runs: the channel the actor publishes weights on. Before every inference call
                (a chunk boundary) the newest weights waiting there are loaded, and each reply carries the
                version that computed it.
            min_version: with ``weights``: before the first inference call, wait (at most
                ``rollout.recv_timeout_s``) until the weights held are at least this version. This is what
                holds a producer back that would otherwise exceed the staleness bound.
        """
        if mode not in (*self._peers, "random"):
            raise ValueError(f"mode must be 'train', 'eval' or 'random', got {mode!r}")
        if mode == "random" and not isinstance(self.policy, SquashedGaussianPolicy | FlowSACPolicy):
            raise ValueError("mode 'random' needs the off-policy policy (actor.model.add_q_head: true)")
        if weights is not None:
            self._take_weights(weights, min_version)
        if self.version < 0:
            raise RuntimeError("rollout has no weights yet: call sync_model_from_actor first")
        if self.cfg.enable_offload:
            self.onload()
        peers = self._peers["train" if mode == "random" else mode]
        active = {s: list(peers) for s in range(self.cfg.pipeline_stage_num)}
        served = 0
        while active:
            for stage in list(active):
                msgs = []
                with self.timer("wait_env", wait=True):
                    for peer in active[stage]:
                        msgs.append((peer, self.recv(env_group, peer, timeout=self.cfg.recv_timeout_s)))
                live = [(p, m) for p, m in msgs if not m.get("end")]
                active[stage] = [p for p, _ in live]
                if not live:
                    del active[stage]
                    continue
                if weights is not None:
                    self._take_weights(weights, -1)
                with self.timer("inference"):
                    replies = self._infer([m for _, m in live], mode, stage)
                with self.timer("send_actions"):
                    for (peer, _), reply in zip(live, replies, strict=True):
                        reply["stage"] = stage
                        self.send(reply, env_group, peer)
                served += 1
        if self.cfg.enable_offload:
            self.offload()
        return served

    # ------------------------------------------------------------------------------------------ internals
    def _mix_expert(self, obs: Any, out: PolicyOutput, n: int) -> PolicyOutput:
        """DAgger's mixture: each row's action is the expert's with probability ``β`` of this weights version."""
        assert self.expert is not None and self.expert_cfg is not None
        beta = self.expert_cfg.beta * self.expert_cfg.beta_decay ** max(self.version, 0)
        take = torch.rand(n) < beta
        if not take.any():
            return out
        key = self.expert_cfg.obs_key
        expert = self.expert.act(obs if key is None else obs[key], deterministic=True).actions[take]
        actions = out.actions.clone()
        if expert.shape[1] != actions.shape[1]:  # a one-step expert: its action for the whole chunk
            expert = expert[:, :1].expand(-1, actions.shape[1], -1)
        actions[take] = expert.to(actions.dtype)
        return PolicyOutput(actions, out.logprobs, out.values)

    def _gate_expert(
        self, obs: Any, out: PolicyOutput, stage: int, msgs: list[dict[str, Any]]
    ) -> tuple[PolicyOutput, dict[str, np.ndarray]]:
        """HG-DAgger's simulated human: the expert's action where :class:`DiscrepancyGate` gives it control."""
        assert self.expert is not None and self.expert_cfg is not None and self.gate is not None
        assert isinstance(self.policy, SquashedGaussianPolicy)  # the app checks DAgger's learner
        key = self.expert_cfg.obs_key
        expert = self.expert.act(obs if key is None else obs[key], deterministic=True).actions
        actions = out.actions
        if expert.shape[1] != actions.shape[1]:  # a one-step expert: its action for the whole chunk
            expert = expert[:, :1].expand(-1, actions.shape[1], -1)
        bias, scale = self.policy.action_bias.cpu(), self.policy.action_scale.cpu()  # actions are on the CPU

        def normalised(a: torch.Tensor) -> torch.Tensor:
            return ((a.float() - bias) / scale).clamp(-1.0, 1.0)

        d = action_discrepancy(normalised(actions), normalised(expert))
        starts = [m.get("new_episode") for m in msgs]
        new_episode = None
        if all(x is not None for x in starts):
            new_episode = torch.as_tensor(np.concatenate([np.asarray(x, dtype=bool) for x in starts]))
        step = self.gate.step(d, key=stage, new_episode=new_episode)
        mixed = torch.where(step.control[:, None, None], expert.to(actions.dtype), actions)
        extras = {"interventions": step.control.numpy(), "discrepancy": d.float().numpy()}
        return PolicyOutput(mixed, out.logprobs, out.values), extras

    @torch.no_grad()
    def _infer(self, msgs: list[dict[str, Any]], mode: str, stage: int = 0) -> list[dict[str, Any]]:
        sizes = [obs_len(m["obs"]) for m in msgs]
        obs = obs_map(torch.as_tensor, obs_concat([m["obs"] for m in msgs]))
        deterministic = mode == "eval" or self.cfg.deterministic or bool(msgs[0].get("deterministic"))
        if self.expert_cfg is not None and mode == "train":
            deterministic = True  # (HG-)DAgger: the learner's own action; the expert (or human) explores
        out = self.policy.act(obs, deterministic=deterministic)
        n = sum(sizes)
        gated: dict[str, np.ndarray] = {}
        if self.gate is not None and mode == "train":
            out, gated = self._gate_expert(obs, out, stage, msgs)
        elif self.expert is not None and mode == "train":
            out = self._mix_expert(obs, out, n)
        if mode == "random" and isinstance(self.policy, SquashedGaussianPolicy | FlowSACPolicy):
            out = PolicyOutput(self.policy.random_actions(n), torch.zeros_like(out.logprobs), out.values)
        logprobs = out.logprobs.reshape(n, -1)
        final_values = None
        if any(m.get("final_obs") is not None for m in msgs):
            rows = [m["final_obs"] if m.get("final_obs") is not None else m["obs"] for m in msgs]
            final_values = self.policy.value(obs_map(torch.as_tensor, obs_concat(rows)))
        replies = []
        start = 0
        for size in sizes:
            sl = slice(start, start + size)
            replies.append(
                {
                    "actions": out.actions[sl].numpy(),
                    "logprobs": logprobs[sl].numpy(),
                    "values": out.values[sl].numpy(),
                    "versions": np.full(size, self.version, dtype=np.int64),
                    "final_values": None if final_values is None else final_values[sl].numpy(),
                    "forward_inputs": None
                    if out.forward_inputs is None
                    else {k: v[sl].numpy() for k, v in out.forward_inputs.items()},
                }
                | {k: v[sl] for k, v in gated.items()}
            )
            start += size
        return replies


def _device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
