"""The agent training loop: SFT on tool-use demonstrations, then multi-turn RL with per-turn group advantages.

:class:`AgentRunner` is the reasoning runner's sibling whose rollout runs whole tool-using episodes instead
of single responses. Both extend :class:`~rlinf_runners.LLMRunner` (warm-up, evaluation cadence, weight sync,
checkpoints, resume, metrics); this one implements the collection, the advantages and the evaluation.
The groups are driven through their role protocols (``rlinf_core.protocols``):

- ``rollout`` (:class:`~rlinf_core.protocols.AgentRollout`): ``run_episodes(requests, sampling) -> list[dict]`` (one episode per request: ``prompt_ids``,
  ``token_ids``, ``loss_mask``, ``rollout_logprobs``, ``turns``, ``response_text``, ``finish_reason``,
  ``num_tool_calls``, ``num_tool_errors``; ``rlinf_rollout.agent.AgentRolloutWorker`` fits),
  ``build_demonstrations(requests) -> list[dict]`` (``prompt_ids``, ``token_ids``, ``loss_mask``),
  ``sync_model_from_actor(actor_group)``;
- ``reward``: ``compute(responses, references)``: each episode's model text (tool outputs excluded) against
  its answers (``searchr1``: exact match or token F1 of the last ``<answer>``);
- ``actor``: ``run_sft(batch)``, ``run_training(batch)``, ``sync_model_to_rollout``, checkpoints.

Advantages (``algorithm.adv_type: grpo_dynamic``, RLinf's multi-turn GRPO): every model turn gets a reward,
the episode's outcome reward minus ``turn_reward.tool_error_penalty`` when the turn's tool call failed
(malformed, unknown tool, bad arguments); turns are normalised per question (``"turn"``: over every turn of
the question's ``group_size`` episodes; ``"trajectory"``: over the episodes' mean turn rewards) by
:func:`rlinf_algos.grpo_dynamic`, and each turn's advantage is put on that turn's tokens. An episode is one
training row (prompt + every turn + every tool response); tool responses have ``loss_mask`` 0.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import attrs
import numpy as np
from attrs import validators as v
from rlinf_algos import grpo_dynamic
from rlinf_core.config import AlgorithmConfig
from rlinf_core.data import DataConfig, PromptDataset, PromptEncoder, pack_sequences
from rlinf_core.protocols import AgentRollout, LLMActor, OffloadRole, RewardRole
from rlinf_scheduler import RoleGroup

from ._base import StepCallback
from ._config import RunnerConfig
from ._llm import Batch, LLMRunner, SFTConfig
from ._metrics import mean, mean_over_ranks, prefixed

__all__ = ["AGENT_ADV_TYPES", "AgentRunner", "TurnRewardConfig", "turn_advantages"]

AGENT_ADV_TYPES = ("grpo_dynamic", "grpo")
"""``grpo_dynamic``: per-turn rewards and advantages; ``grpo``: one outcome advantage per episode."""


@attrs.frozen(kw_only=True)
class TurnRewardConfig:
    """Per-turn rewards of the agent runner (config ``turn_reward``)."""

    advantage_mode: Literal["turn", "trajectory"] = attrs.field(
        default="turn", validator=v.in_(("turn", "trajectory"))
    )
    """``grpo_dynamic`` normalisation: over all turns of a question, or over its episodes' mean turn reward."""
    tool_error_penalty: float = attrs.field(default=0.1, validator=v.ge(0.0))
    """Subtracted from the reward of a turn whose tool calls got an error response."""


def turn_advantages(
    episodes: Sequence[Mapping[str, Any]],
    outcome: Sequence[float],
    *,
    group_size: int,
    adv_type: str = "grpo_dynamic",
    advantage_mode: Literal["turn", "trajectory"] = "turn",
    tool_error_penalty: float = 0.0,
) -> tuple[list[list[float]], list[float]]:
    """Per-turn advantages of a batch of episodes (``group_size`` consecutive episodes per question).

    Args:
        episodes: ``[N]`` episode dicts with ``turns`` (each with ``num_errors``).
        outcome: ``[N]`` outcome reward of each episode.
        group_size: episodes per question.
        adv_type: ``grpo_dynamic`` (per-turn rewards) or ``grpo`` (every turn gets its episode's
            group-normalised outcome).
        advantage_mode: ``grpo_dynamic`` mode.
        tool_error_penalty: subtracted from a turn's reward when it had a tool error.

    Returns:
        ``(advantages, turn_rewards)``: ``[N][turns_i]`` advantage per turn, and the flat ``[sum turns]``
        turn rewards.
    """
    if len(episodes) != len(outcome):
        raise ValueError(f"{len(episodes)} episodes but {len(outcome)} outcome rewards")
    turn_rewards: list[float] = []
    idx_to_traj: list[int] = []
    for i, (ep, r) in enumerate(zip(episodes, outcome, strict=True)):
        turns = ep["turns"]
        if not turns:
            raise ValueError(f"episode {i} has no turns")
        for t in turns:
            turn_rewards.append(float(r) - (tool_error_penalty if int(t.get("num_errors", 0)) > 0 else 0.0))
            idx_to_traj.append(i)
    if adv_type == "grpo_dynamic":
        flat = np.asarray(
            grpo_dynamic(
                np.asarray(turn_rewards, dtype=np.float64),
                np.ones((1, len(turn_rewards)), dtype=bool),
                group_size=group_size,
                idx_to_traj=idx_to_traj,
                advantage_mode=advantage_mode,
            )
        )[0]
    elif adv_type == "grpo":
        grouped = np.asarray(outcome, dtype=np.float64).reshape(-1, group_size)
        std = grouped.std(axis=1, ddof=1, keepdims=True) if group_size > 1 else np.zeros_like(grouped[:, :1])
        per_ep = ((grouped - grouped.mean(axis=1, keepdims=True)) / (std + 1e-6)).reshape(-1)
        flat = per_ep[np.asarray(idx_to_traj)]
    else:
        raise ValueError(
            f"adv_type {adv_type!r} is not supported by the agent runner; allowed: {AGENT_ADV_TYPES}"
        )
    out: list[list[float]] = []
    k = 0
    for ep in episodes:
        n = len(ep["turns"])
        out.append([float(a) for a in flat[k : k + n]])
        k += n
    return out, turn_rewards


class AgentRunner(LLMRunner[AgentRollout]):
    """SFT warm-up on tool-use demonstrations, then multi-turn RL (see the module docstring).

    Args:
        cfg: the ``runner`` config.
        actor: the actor group.
        rollout: the agent rollout group.
        reward: the reward group (``searchr1`` exact match).
        algorithm: ``adv_type`` in :data:`AGENT_ADV_TYPES`, ``group_size``, ``dynamic_sampling`` (drop the
            questions whose turn rewards are all equal: their advantages are zero).
        data: the ``data`` config.
        encoder: first prompts (its system prompt should describe the tools).
        train_data: the RL tasks (``answer``s).
        sampling: the rollout's sampling parameters (``max_new_tokens`` and ``stop`` are set per turn).
        eval_data: held-out tasks for the greedy success rate.
        eval_sampling: sampling of the evaluation (default: greedy).
        sft: the warm-up config.
        sft_data: demonstrations: rows with ``demo`` (the assistant turns as text) in their extra fields.
        turn_reward: per-turn reward settings.
        batch_multiple: training batches are cut to a multiple of this many episodes (the actor's
            ``micro_batch_size`` x world size); the episodes cut are the last ones.
        to_batch: converts numpy batches into what the actor takes.
        offload: offload/onload between phases.
        elastic_actor_ranks: the actor ranks on the rollout's devices (``runner.dynamic_scaling``): grown onto
            them for each update, shrunk back before the next generation.
        run_config: the resolved configuration (W&B / SwanLab).
        on_step: called with ``(global_step, record)`` after each logged record.
        eval_chunk: episodes per evaluation request (see :class:`~rlinf_runners.ReasoningRunner`).
    """

    adv_types = AGENT_ADV_TYPES
    runner_name = "agent"

    def __init__(
        self,
        cfg: RunnerConfig,
        *,
        actor: RoleGroup[LLMActor],
        rollout: RoleGroup[AgentRollout],
        reward: RoleGroup[RewardRole],
        algorithm: AlgorithmConfig,
        data: DataConfig,
        encoder: PromptEncoder,
        train_data: PromptDataset,
        sampling: Mapping[str, Any],
        eval_data: PromptDataset | None = None,
        eval_sampling: Mapping[str, Any] | None = None,
        sft: SFTConfig | None = None,
        sft_data: PromptDataset | None = None,
        turn_reward: TurnRewardConfig | None = None,
        batch_multiple: int = 1,
        to_batch: Callable[[Batch], Any] | None = None,
        offload: bool = False,
        elastic_actor_ranks: Sequence[int] = (),
        run_config: Mapping[str, Any] | None = None,
        on_step: StepCallback | None = None,
        eval_chunk: int | None = None,
    ) -> None:
        super().__init__(
            cfg,
            actor=actor,
            rollout=rollout,
            reward=reward,
            algorithm=algorithm,
            data=data,
            encoder=encoder,
            train_data=train_data,
            sampling=sampling,
            eval_data=eval_data,
            eval_sampling=eval_sampling,
            sft=sft,
            sft_data=sft_data,
            to_batch=to_batch,
            offload=offload,
            batch_multiple=batch_multiple,
            elastic_actor_ranks=elastic_actor_ranks,
            run_config=run_config,
            on_step=on_step,
            eval_chunk=eval_chunk,
        )
        self.turn_reward = turn_reward or TurnRewardConfig()
        self._demos: list[dict[str, Any]] | None = None

    def check_sft_data(self, sft_data: PromptDataset) -> None:
        """Every demonstration row needs a ``demo`` list of assistant turns."""
        missing = [i for i, e in enumerate(sft_data) if not e.extra.get("demo")]
        if missing:
            raise ValueError(
                f"data.sft_path ({sft_data.source}): rows {missing[:5]} have no 'demo' list of assistant turns"
            )

    # ------------------------------------------------------------------------------------------ episodes
    def run_episodes(
        self, requests: Sequence[Mapping[str, Any]], sampling: Mapping[str, Any]
    ) -> list[dict[str, Any]]:
        """Run one episode per request; every rollout rank gets the full list and runs its contiguous share."""
        episodes = self._gather(
            self.rollout.call(AgentRollout.run_episodes, [dict(r) for r in requests], dict(sampling))
        )
        if len(episodes) != len(requests):
            raise RuntimeError(f"the rollout returned {len(episodes)} episodes for {len(requests)} requests")
        return episodes

    @staticmethod
    def episode_metrics(
        episodes: Sequence[Mapping[str, Any]],
        correct: Sequence[bool],
        prefix: str,
        kinds: Sequence[str] | None = None,
    ) -> dict[str, float]:
        """``<prefix>/success_rate`` and tool-use statistics of a list of episodes."""
        n = len(episodes)
        calls = [float(e["num_tool_calls"]) for e in episodes]
        errors = [float(e["num_tool_errors"]) for e in episodes]
        out = {
            f"{prefix}/success_rate": mean([float(c) for c in correct]),
            f"{prefix}/turns_mean": mean([float(len(e["turns"])) for e in episodes]),
            f"{prefix}/tool_calls_mean": mean(calls),
            f"{prefix}/tool_error_rate": sum(errors) / sum(calls) if sum(calls) else 0.0,
            f"{prefix}/used_tool_frac": mean([float(c > 0) for c in calls]),
            f"{prefix}/answered_frac": mean([float(e["finish_reason"] == "answer") for e in episodes]),
            f"{prefix}/tokens_mean": mean(
                [float(len(e["token_ids"]) - len(e["prompt_ids"])) for e in episodes]
            ),
            f"{prefix}/num_episodes": float(n),
        }
        if kinds is not None:
            for kind in sorted(set(kinds)):
                sel = [float(c) for c, k in zip(correct, kinds, strict=True) if k == kind]
                out[f"{prefix}/success_rate_{kind}"] = mean(sel)
        return out

    def evaluate(self, prefix: str = "eval") -> dict[str, float]:
        """Greedy episodes on the held-out tasks; returns ``<prefix>/success_rate`` (also as ``accuracy``) etc."""
        if not self.eval_data:
            return {}
        start = time.perf_counter()
        requests = [{"prompt_ids": p} for p in self._eval_ids]
        episodes = self._in_chunks(
            len(requests),
            lambda part: self.rollout.call(
                AgentRollout.run_episodes, [dict(r) for r in requests[part]], dict(self.eval_sampling)
            ),
            prefix,
        )
        self._phase(self.rollout, OffloadRole.offload)
        rewards, correct = self._score(
            [e["response_text"] for e in episodes], [x.answers for x in self.eval_data]
        )
        kinds = [str(x.extra.get("kind", "task")) for x in self.eval_data]
        self._dump_episodes(f"{prefix}_step{self.global_step}", episodes, correct, kinds)
        metrics = self.episode_metrics(episodes, correct, prefix, kinds)
        metrics[f"{prefix}/accuracy"] = metrics[f"{prefix}/success_rate"]
        metrics[f"{prefix}/reward_mean"] = mean(rewards)
        return self.record_eval(metrics, start, main=prefix == "eval")

    def _dump_episodes(
        self, name: str, episodes: Sequence[Mapping[str, Any]], correct: Sequence[bool], kinds: Sequence[str]
    ) -> None:
        """Write the episodes' texts to ``<log_path>/episodes/<name>.jsonl`` (to read what the agent did)."""
        out_dir = self.log_path / "episodes"
        out_dir.mkdir(parents=True, exist_ok=True)
        lines = []
        for e, ok, kind in zip(episodes, correct, kinds, strict=True):
            turns = [
                {
                    "text": t.get("text"),
                    "tool_calls": t.get("tool_calls"),
                    "tool_responses": t.get("tool_responses"),
                }
                for t in e["turns"]
            ]
            row = {"kind": kind, "correct": bool(ok), "answer": e.get("answer"), "finish": e["finish_reason"]}
            lines.append(json.dumps({**row, "turns": turns}, ensure_ascii=False))
        (out_dir / f"{name}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")

    # ----------------------------------------------------------------------------------------------- SFT
    def demonstrations(self) -> list[dict[str, Any]]:
        """The SFT demonstrations as token ids, built once by the rollout group (real tools and template)."""
        if self._demos is None:
            assert self.sft_data is not None
            requests = [
                {"prompt_ids": self.encoder.encode_prompt(e), "demo": list(e.extra["demo"])}
                for e in self.sft_data
            ]
            self._demos = self._gather(self.rollout.call(AgentRollout.build_demonstrations, requests))
        return self._demos

    def sft_step(self) -> dict[str, float]:
        """One warm-up update on the next ``sft.batch_size`` demonstrations (assistant turns trained only)."""
        assert self.sft_sampler is not None
        demos = self.demonstrations()
        picked = [demos[i] for i in self.sft_sampler.next_batch(self.sft.batch_size)]
        batch = _episode_batch(picked, self.encoder.pad_token_id)
        batch = {k: batch[k] for k in ("input_ids", "attention_mask", "loss_mask")}
        return prefixed(mean_over_ranks(self._actor_all(LLMActor.run_sft, batch)), "sft")

    # ------------------------------------------------------------------------------------------------ RL
    def train_step(self) -> dict[str, float]:
        """One RL step: episodes, outcome rewards, per-turn advantages, actor update; returns its metrics."""
        gs = self.group_size
        t0 = time.perf_counter()
        idx = self.sampler.next_batch(self.data.rollout_batch_size)
        requests = [{"prompt_ids": self._train_ids[i]} for i in idx for _ in range(gs)]
        refs = [self.train_data[i].answers for i in idx for _ in range(gs)]
        kinds = [str(self.train_data[i].extra.get("kind", "task")) for i in idx for _ in range(gs)]
        episodes = self.run_episodes(requests, self.sampling)
        self._phase(self.rollout, OffloadRole.offload)
        rewards, correct = self._score([e["response_text"] for e in episodes], refs)
        t1 = time.perf_counter()
        metrics = self.episode_metrics(episodes, correct, "rollout", kinds)
        metrics["rollout/reward_mean"] = mean(rewards)
        metrics["rollout/accuracy"] = metrics["rollout/success_rate"]
        metrics["time/rollout_s"] = t1 - t0
        adv, turn_rewards = turn_advantages(
            episodes,
            rewards,
            group_size=gs,
            adv_type=self.algorithm.adv_type.lower(),
            advantage_mode=self.turn_reward.advantage_mode,
            tool_error_penalty=self.turn_reward.tool_error_penalty,
        )
        metrics["rollout/turn_reward_mean"] = mean(turn_rewards)
        keep = list(range(len(episodes)))
        if self.algorithm.dynamic_sampling:
            keep = []
            for g in range(len(episodes) // gs):
                members = range(g * gs, (g + 1) * gs)
                if any(abs(a) > 1e-8 for i in members for a in adv[i]):
                    keep += list(members)
        metrics["dapo/kept_groups"] = float(len(keep) // gs)
        keep = keep[: len(keep) - len(keep) % self.batch_multiple]
        metrics["train/num_episodes"] = float(len(keep))
        if not keep:
            metrics["train/skipped"] = 1.0
            metrics["time/train_s"] = 0.0
            return metrics
        kept = [episodes[i] for i in keep]
        batch = _episode_batch(kept, self.encoder.pad_token_id, advantages=[adv[i] for i in keep])
        batch["rewards"] = np.asarray([rewards[i] for i in keep], dtype=np.float32)
        valid = batch["advantages"][batch["loss_mask"]]
        metrics["adv/mean"] = float(valid.mean()) if valid.size else math.nan
        metrics["adv/std"] = float(valid.std()) if valid.size else math.nan
        metrics["adv/trained_tokens"] = float(valid.size)
        metrics.update(self.begin_training())
        train_batch = {
            k: batch[k]
            for k in ("input_ids", "attention_mask", "loss_mask", "advantages", "rollout_logprobs", "rewards")
        }
        metrics.update(
            prefixed(mean_over_ranks(self._actor_all(LLMActor.run_training, train_batch)), "train")
        )
        metrics.update(self.end_training())
        metrics["train/skipped"] = 0.0
        metrics["time/train_s"] = time.perf_counter() - t1
        return metrics


def _episode_batch(
    episodes: Sequence[Mapping[str, Any]],
    pad_token_id: int,
    *,
    advantages: Sequence[Sequence[float]] | None = None,
) -> Batch:
    """Pad episodes into a training batch: prompts LEFT-padded to column ``P``, the rest RIGHT-padded.

    ``loss_mask`` is the episode's (model tokens only); ``rollout_logprobs`` and, when given, per-turn
    ``advantages`` are placed on the same columns (each turn's advantage on its ``[start, end)`` tokens).
    """
    prompts = [list(e["prompt_ids"]) for e in episodes]
    rest = [list(e["token_ids"])[len(p) :] for e, p in zip(episodes, prompts, strict=True)]
    batch = pack_sequences(prompts, rest, pad_token_id=pad_token_id)
    n, t = batch["input_ids"].shape
    p_len = t - max(1, max(len(r) for r in rest))
    loss_mask = np.zeros((n, t), dtype=bool)
    logprobs = np.zeros((n, t), dtype=np.float32)
    adv = np.zeros((n, t), dtype=np.float32)
    for i, (e, p) in enumerate(zip(episodes, prompts, strict=True)):
        shift = p_len - len(p)  # episode index j sits at column j + shift
        mask = np.asarray(e["loss_mask"], dtype=bool)
        loss_mask[i, shift : shift + len(mask)] = mask
        if "rollout_logprobs" in e:
            logprobs[i, shift : shift + len(mask)] = np.asarray(e["rollout_logprobs"], dtype=np.float32)
        if advantages is not None:
            for turn, a in zip(e["turns"], advantages[i], strict=True):
                adv[i, shift + int(turn["start"]) : shift + int(turn["end"])] = a
    batch["loss_mask"] = loss_mask
    batch["rollout_logprobs"] = logprobs
    if advantages is not None:
        batch["advantages"] = np.where(loss_mask, adv, 0.0).astype(np.float32)
    return batch
