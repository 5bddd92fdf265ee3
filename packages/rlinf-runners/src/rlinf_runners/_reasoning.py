"""The reasoning training loop: SFT warm-up, then generate → reward → DAPO filters → advantages → train → sync.

The runner is the driver of a run with verifiable rewards on a causal LM. It drives three worker groups through
their role protocols (``rlinf_core.protocols``; it imports no model, tokenizer or generation code):

- ``actor`` (:class:`~rlinf_core.protocols.LLMActor`): ``run_sft(batch)``, ``compute_logprobs(batch)``
  (``values`` for PPO, reference log-probs for the Reinforce++ KL), ``run_training(batch)``,
  ``sync_model_to_rollout``, ``save_checkpoint``, ``load_checkpoint``, ``offload``/``onload`` when offloading;
- ``rollout`` (:class:`~rlinf_core.protocols.LLMRollout`): ``generate(prompts, sampling)`` (one dict per
  prompt with ``token_ids``, ``logprobs``, ``text``, ``finish_reason``), ``sync_model_from_actor``,
  ``offload``/``onload`` when offloading;
- ``reward`` (:class:`~rlinf_core.protocols.RewardRole`): ``compute(responses, references)`` →
  ``{"rewards", "correct"}``.

Prompts are tokenized on the driver by a :class:`~rlinf_core.data.PromptEncoder`. Every group call sends the
same full list or batch to all ranks; each rank works on its contiguous share (``rollout.generate`` and
``reward.compute`` return their share's results, concatenated here in rank order; the actor trains on its share
of the batch). Batches are dicts of numpy arrays, turned into the actor's tensor type by ``to_batch`` (the app
passes ``torch.from_numpy``).

Batch layout (``N`` sequences, ``T = P + R`` tokens): prompts LEFT-padded so each ends at column ``P``,
responses RIGHT-padded: ``input_ids [N, T]``, ``attention_mask [N, T]``, ``loss_mask [N, T]`` (trained
response tokens), ``advantages [N, T]``, ``rollout_logprobs [N, T]`` (index ``t`` = log-prob of
``input_ids[:, t]``), ``returns [N, T]`` (PPO critic), ``rewards [N]``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import numpy as np
import numpy.typing as npt
from rlinf_algos import (
    dynamic_sampling_filter,
    gae,
    grpo,
    kl_penalty,
    masked_normalization,
    overlong_reward_penalty,
    reinpp,
)
from rlinf_core.data import pack_sequences
from rlinf_core.protocols import LLMActor, LLMRollout, OffloadRole

from ._llm import Batch, LLMRunner, SFTConfig
from ._metrics import mean, mean_over_ranks, prefixed

__all__ = ["REASONING_ADV_TYPES", "ReasoningRunner", "SFTConfig"]

REASONING_ADV_TYPES = ("grpo", "reinpp", "gae")
"""Advantage estimators the reasoning runner supports (``algorithm.adv_type``)."""


@attrs.define
class _Rollouts:
    """Generated responses of kept groups (``group_size`` consecutive entries per prompt)."""

    prompts: list[list[int]] = attrs.field(factory=list)
    responses: list[list[int]] = attrs.field(factory=list)
    logprobs: list[list[float]] = attrs.field(factory=list)
    rewards: list[float] = attrs.field(factory=list)
    truncated: list[bool] = attrs.field(factory=list)

    def extend(self, other: _Rollouts, start: int, stop: int) -> None:
        self.prompts += other.prompts[start:stop]
        self.responses += other.responses[start:stop]
        self.logprobs += other.logprobs[start:stop]
        self.rewards += other.rewards[start:stop]
        self.truncated += other.truncated[start:stop]


class ReasoningRunner(LLMRunner[LLMRollout]):
    """Runs SFT warm-up then RL with verifiable rewards over actor, rollout and reward groups.

    Args:
        cfg: the ``runner`` config.
        actor: the actor group (the ``LLMActor`` role).
        rollout: the rollout group.
        reward: the reward group.
        algorithm: the ``algorithm`` config (``adv_type`` in :data:`REASONING_ADV_TYPES`, ``group_size``,
            DAPO and Reinforce++ switches).
        data: the ``data`` config (``rollout_batch_size``, shuffling, ``eval_size``, ``max_prompt_length``).
        encoder: turns examples into token ids.
        train_data: the RL prompts.
        sampling: the rollout's sampling parameters for training (``max_new_tokens`` is read for the DAPO
            overlong penalty).
        eval_data: held-out prompts for the greedy evaluation (``None``: no evaluation).
        eval_sampling: sampling parameters of the evaluation (default: ``sampling`` with temperature 0).
        sft: the warm-up config.
        sft_data: demonstrations (rows with a ``solution``) for the warm-up.
        to_batch: converts a dict of numpy arrays into what the actor takes (default: unchanged).
        offload: call ``offload()``/``onload()`` on the actor and rollout between phases (collocated runs).
        elastic_actor_ranks: the actor ranks on the rollout's devices (``runner.dynamic_scaling``): the rollout
            releases its devices to them after generating, they train with the others, then give them back.
        batch_multiple: the training batch's sequence count must be a multiple of this (the actor's
            ``micro_batch_size x ranks``); when dynamic sampling keeps fewer groups, whole groups are dropped.
        refresh_reference: after the SFT warm-up, call ``actor.update_reference_model()`` so the KL penalty
            is measured against the SFT model (runs with a reference model).
        run_config: the resolved configuration, stored with W&B / SwanLab runs.
        on_step: called with ``(global_step, record)`` after each logged record.

    Raises:
        ValueError: for an unsupported ``adv_type``, a prompt longer than ``data.max_prompt_length``, or a
            warm-up without demonstrations.
    """

    adv_types = REASONING_ADV_TYPES
    runner_name = "reasoning"

    @property
    def max_new_tokens(self) -> int | None:
        """The training sampling's ``max_new_tokens`` (``None`` when unset), for the DAPO overlong penalty."""
        return int(self.sampling.get("max_new_tokens", 0)) or None

    # ---------------------------------------------------------------------------------------- the phases
    def generate(
        self, prompt_ids: Sequence[Sequence[int]], sampling: Mapping[str, Any]
    ) -> list[dict[str, Any]]:
        """Generate one response per prompt (sharded over the rollout ranks); returns the output dicts."""
        outputs = self._gather(
            self.rollout.call(LLMRollout.generate, [list(p) for p in prompt_ids], dict(sampling))
        )
        if len(outputs) != len(prompt_ids):
            raise RuntimeError(f"the rollout returned {len(outputs)} outputs for {len(prompt_ids)} prompts")
        return outputs

    def evaluate(self, prefix: str = "eval") -> dict[str, float]:
        """Greedy answers to the held-out prompts, scored by the reward group; returns ``<prefix>/*``."""
        if not self.eval_data:
            return {}
        start = time.perf_counter()
        outputs = self.generate(self._eval_ids, self.eval_sampling)
        self._phase(self.rollout, OffloadRole.offload)
        rewards, correct = self._score([o["text"] for o in outputs], [e.answers for e in self.eval_data])
        lengths = [len(o["token_ids"]) for o in outputs]
        self.add_samples(
            prefix,
            [
                {
                    "prompt": e.messages[-1]["content"] if e.messages else "",
                    "response": o["text"],
                    "reward": r,
                    "correct": bool(c),
                    "answers": list(e.answers),
                    "finish_reason": o.get("finish_reason"),
                }
                for e, o, r, c in zip(self.eval_data, outputs, rewards, correct, strict=True)
            ],
        )
        metrics = {
            f"{prefix}/accuracy": mean([float(c) for c in correct]),
            f"{prefix}/reward_mean": mean(rewards),
            f"{prefix}/response_len_mean": mean([float(n) for n in lengths]),
            f"{prefix}/truncated_frac": mean([float(o.get("finish_reason") == "length") for o in outputs]),
            f"{prefix}/num_samples": float(len(outputs)),
        }
        return self.record_eval(metrics, start, main=prefix == "eval")

    def sft_step(self) -> dict[str, float]:
        """One warm-up update on the next ``sft.batch_size`` demonstrations; returns ``sft/*`` metrics."""
        assert self.sft_data is not None and self.sft_sampler is not None
        examples = [self.sft_data[i] for i in self.sft_sampler.next_batch(self.sft.batch_size)]
        prompts = [self.encoder.encode_prompt(e) for e in examples]
        targets = [self.encoder.encode_completion(e.solution or "") for e in examples]
        batch = pack_sequences(prompts, targets, pad_token_id=self.encoder.pad_token_id)
        batch = {k: batch[k] for k in ("input_ids", "attention_mask", "loss_mask")}
        return prefixed(mean_over_ranks(self._actor_all(LLMActor.run_sft, batch)), "sft")

    def _generate_groups(self) -> tuple[_Rollouts, list[str], list[bool]]:
        """One generation batch: ``rollout_batch_size`` prompts x ``group_size`` samples, scored."""
        gs = self.group_size
        idx = self.sampler.next_batch(self.data.rollout_batch_size)
        prompts = [self._train_ids[i] for i in idx for _ in range(gs)]
        refs = [self.train_data[i].answers for i in idx for _ in range(gs)]
        outputs = self.generate(prompts, self.sampling)
        rewards, correct = self._score([o["text"] for o in outputs], refs)
        out = _Rollouts(
            prompts=prompts,
            responses=[list(o["token_ids"]) for o in outputs],
            logprobs=[list(o.get("logprobs") or [0.0] * len(o["token_ids"])) for o in outputs],
            rewards=rewards,
            truncated=[o.get("finish_reason") == "length" for o in outputs],
        )
        return out, [o["text"] for o in outputs], correct

    def collect(self) -> tuple[_Rollouts, dict[str, float]]:
        """Generate and score groups, applying the DAPO overlong penalty and dynamic sampling.

        Returns:
            The kept groups (at most ``data.rollout_batch_size``) and the ``rollout/*``/``dapo/*`` metrics of
            everything generated.
        """
        alg, gs, n_prompts = self.algorithm, self.group_size, self.data.rollout_batch_size
        kept = _Rollouts()
        raw_rewards: list[float] = []
        correct: list[bool] = []
        lengths: list[int] = []
        truncated: list[bool] = []
        gen_batches = 0
        while True:
            batch, _texts, ok = self._generate_groups()
            gen_batches += 1
            raw_rewards += batch.rewards
            correct += ok
            lengths += [len(r) for r in batch.responses]
            truncated += batch.truncated
            if alg.overlong_buffer_len > 0 and self.max_new_tokens is not None:
                penalty = overlong_reward_penalty(
                    np.asarray([len(r) for r in batch.responses]),
                    max_length=self.max_new_tokens,
                    cache_length=min(alg.overlong_buffer_len, self.max_new_tokens),
                )
                batch.rewards = [
                    r + alg.overlong_penalty_factor * float(p)
                    for r, p in zip(batch.rewards, penalty, strict=True)
                ]
            if alg.dynamic_sampling:
                keep = dynamic_sampling_filter(np.asarray(batch.rewards, dtype=np.float64), group_size=gs)
                for g in range(len(batch.rewards) // gs):
                    if bool(keep[g * gs]) and len(kept.rewards) < n_prompts * gs:
                        kept.extend(batch, g * gs, (g + 1) * gs)
            else:
                kept.extend(batch, 0, len(batch.rewards))
            if (
                not alg.dynamic_sampling
                or len(kept.rewards) >= n_prompts * gs
                or gen_batches >= alg.max_num_gen_batches
            ):
                break
        self._phase(self.rollout, OffloadRole.offload)
        metrics = {
            "rollout/reward_mean": mean(raw_rewards),
            "rollout/accuracy": mean([float(c) for c in correct]),
            "rollout/response_len_mean": mean([float(n) for n in lengths]),
            "rollout/response_len_max": float(max(lengths)) if lengths else math.nan,
            "rollout/truncated_frac": mean([float(t) for t in truncated]),
            "rollout/num_samples": float(len(raw_rewards)),
            "dapo/num_gen_batches": float(gen_batches),
            "dapo/kept_groups": float(len(kept.rewards) // gs),
        }
        return kept, metrics

    def build_batch(self, rollouts: _Rollouts) -> Batch:
        """Pad the kept groups into a training batch (``advantages`` not yet filled)."""
        train = [not t for t in rollouts.truncated] if self.algorithm.overlong_filter else None
        batch = pack_sequences(
            rollouts.prompts, rollouts.responses, pad_token_id=self.encoder.pad_token_id, train_response=train
        )
        p_len = batch["input_ids"].shape[1] - max(1, max(len(r) for r in rollouts.responses))
        logprobs = np.zeros(batch["input_ids"].shape, dtype=np.float32)
        for i, lp in enumerate(rollouts.logprobs):
            logprobs[i, p_len : p_len + len(lp)] = np.asarray(lp, dtype=np.float32)
        batch["rollout_logprobs"] = logprobs
        batch["rewards"] = np.asarray(rollouts.rewards, dtype=np.float32)
        return batch

    def compute_advantages(self, batch: Batch, extra: Mapping[str, Any]) -> dict[str, float]:
        """Fill ``batch["advantages"]`` (and ``returns`` for GAE) with the configured estimator.

        Args:
            batch: from :meth:`build_batch`.
            extra: the actor's ``compute_logprobs`` output (``values`` for GAE; ``logprobs`` and
                ``ref_logprobs`` for the Reinforce++ KL); may be empty otherwise.

        Returns:
            ``adv/*`` metrics.
        """
        alg = self.algorithm
        n, t = batch["input_ids"].shape
        r_len = max(1, int(batch["response_lengths"].max()))
        p_len = t - r_len
        mask = batch["loss_mask"][:, p_len:]  # [N, R]
        rewards = batch["rewards"].astype(np.float64)
        adv_type = alg.adv_type.lower()
        returns: npt.NDArray[Any] | None = None
        if adv_type == "grpo":
            adv = np.asarray(grpo(rewards, mask.T, group_size=self.group_size)).T
            if alg.normalize_advantages:
                adv = np.asarray(masked_normalization(adv, mask))
        elif adv_type == "reinpp":
            kl = None
            if alg.reinpp_kl_beta > 0:
                logprob = np.asarray(extra["logprobs"], dtype=np.float64)[:, p_len:]
                ref = np.asarray(extra["ref_logprobs"], dtype=np.float64)[:, p_len:]
                kl = np.asarray(kl_penalty(logprob, ref, alg.kl_penalty)).T
            adv = np.asarray(
                reinpp(
                    rewards,
                    mask.T,
                    group_size=self.group_size,
                    use_reinpp_baseline=alg.use_reinpp_baseline,
                    kl_beta=alg.reinpp_kl_beta,
                    kl=kl,
                )
            ).T
        else:  # gae with the actor's value head
            values = np.asarray(extra["values"], dtype=np.float64)[:, p_len:] * mask
            lengths = mask.sum(axis=1)
            step_rewards = np.zeros((r_len, n))
            dones = np.zeros((r_len + 1, n), dtype=bool)
            for i in range(n):
                if lengths[i] > 0:
                    last = int(np.nonzero(mask[i])[0][-1])
                    step_rewards[last, i] = rewards[i]
                    dones[last + 1, i] = True
            values_ext = np.concatenate([values.T, np.zeros((1, n))], axis=0)
            adv_t, ret_t = gae(
                step_rewards,
                values_ext,
                dones,
                gamma=alg.gamma,
                gae_lambda=alg.gae_lambda,
                normalize_advantages=alg.normalize_advantages,
                loss_mask=mask.T,
            )
            adv, returns = np.asarray(adv_t).T, np.asarray(ret_t).T
        full = np.zeros((n, t), dtype=np.float32)
        full[:, p_len:] = np.where(mask, adv, 0.0)
        batch["advantages"] = full
        if returns is not None:
            ret_full = np.zeros((n, t), dtype=np.float32)
            ret_full[:, p_len:] = np.where(mask, returns, 0.0)
            batch["returns"] = ret_full
        valid = full[batch["loss_mask"]]
        return {
            "adv/mean": float(valid.mean()) if valid.size else math.nan,
            "adv/std": float(valid.std()) if valid.size else math.nan,
            "adv/trained_tokens": float(valid.size),
        }

    def _needs_logprobs(self) -> bool:
        alg = self.algorithm
        return alg.adv_type.lower() == "gae" or (alg.adv_type.lower() == "reinpp" and alg.reinpp_kl_beta > 0)

    def train_step(self) -> dict[str, float]:
        """One RL step: collect (with DAPO filters), advantages, actor update; returns its metrics."""
        t0 = time.perf_counter()
        rollouts, metrics = self.collect()
        t1 = time.perf_counter()
        metrics["time/rollout_s"] = t1 - t0
        groups = len(rollouts.rewards) // self.group_size
        while groups > 0 and (groups * self.group_size) % self.batch_multiple:
            groups -= 1
        if groups * self.group_size < len(rollouts.rewards):
            trimmed = _Rollouts()
            trimmed.extend(rollouts, 0, groups * self.group_size)
            rollouts = trimmed
        metrics["train/num_sequences"] = float(len(rollouts.rewards))
        if not rollouts.rewards:
            metrics["train/skipped"] = 1.0
            metrics["time/train_s"] = 0.0
            return metrics
        batch = self.build_batch(rollouts)
        metrics.update(self.begin_training())
        extra: Mapping[str, Any] = {}
        if self._needs_logprobs():
            extra = self._actor_all(LLMActor.compute_logprobs, batch)[0]
            for key in ("values", "ref_logprobs", "logprobs"):
                if key in extra:
                    batch[f"{'old_' if key == 'logprobs' else ''}{key}"] = np.asarray(
                        extra[key], dtype=np.float32
                    )
        metrics.update(self.compute_advantages(batch, extra))
        train_batch = {k: val for k, val in batch.items() if k not in ("prompt_lengths", "response_lengths")}
        metrics.update(
            prefixed(mean_over_ranks(self._actor_all(LLMActor.run_training, train_batch)), "train")
        )
        metrics.update(self.end_training())
        metrics["train/skipped"] = 0.0
        metrics["time/train_s"] = time.perf_counter() - t1
        return metrics
