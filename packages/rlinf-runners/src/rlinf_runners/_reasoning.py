"""The reasoning training loop: SFT warm-up, then generate → reward → DAPO filters → advantages → train → sync.

The runner is the driver of a run with verifiable rewards on a causal LM. It drives three worker groups by
method name only (it imports no model, tokenizer or generation code):

- ``actor``: ``run_sft(batch) -> dict``, ``compute_logprobs(batch) -> dict`` (``values`` for PPO, reference
  log-probs for the Reinforce++ KL), ``run_training(batch) -> dict``, ``sync_model_to_rollout(rollout_group)``,
  ``save_checkpoint(dir)``, ``load_checkpoint(dir)``, optionally ``offload()``/``onload()``;
- ``rollout``: ``generate(prompts: list[list[int]], sampling: dict) -> list[dict]`` (each with ``token_ids``,
  ``logprobs``, ``text``, ``finish_reason``), ``sync_model_from_actor(actor_group)``, optionally
  ``offload()``/``onload()``;
- ``reward``: ``compute(responses: list[str], references: list[list[str]]) -> {"rewards", "correct"}``.

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
import pickle
import random
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import numpy.typing as npt
from attrs import validators as v
from rlinf_algos import (
    dynamic_sampling_filter,
    gae,
    grpo,
    kl_penalty,
    masked_normalization,
    overlong_reward_penalty,
    reinpp,
)
from rlinf_core.checkpoint import (
    CheckpointManager,
    capture_rng_state,
    checkpoint_step,
    resolve_resume_dir,
    restore_rng_state,
)
from rlinf_core.config import AlgorithmConfig
from rlinf_core.data import DataConfig, PromptDataset, PromptEncoder, PromptSampler, pack_sequences
from rlinf_core.metrics import MetricLogger
from tqdm.auto import tqdm

from ._config import RunnerConfig
from ._embodied import GroupLike, RunResult, _CallLike
from ._progress import log_step

__all__ = ["REASONING_ADV_TYPES", "ReasoningRunner", "SFTConfig"]

_REASONING_SHOWN = (
    ("rollout/accuracy", "acc"),
    ("eval/accuracy", "eval"),
    ("train/actor/policy_loss", "loss"),
    ("time/step_s", "s/step"),
)

REASONING_ADV_TYPES = ("grpo", "reinpp", "gae")
"""Advantage estimators the reasoning runner supports (``algorithm.adv_type``)."""

RUNNER_STATE_FILE = "runner_state.pkl"

Batch = dict[str, npt.NDArray[Any]]


@attrs.frozen(kw_only=True)
class SFTConfig:
    """The supervised warm-up before RL (config ``sft``); demonstrations come from ``data.sft_path``."""

    steps: int = attrs.field(default=0, validator=v.ge(0))
    """``actor.run_sft`` calls (optimizer updates) before the first RL step (``0``: no warm-up)."""
    batch_size: int = attrs.field(default=16, validator=v.ge(1))
    """Demonstrations per ``run_sft`` call."""
    eval_before: bool = False
    """Also evaluate the model before the warm-up (logged as ``eval_pre_sft/*``)."""


def _mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else math.nan


def _mean_over_ranks(results: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    keys: dict[str, None] = {}
    for r in results:
        keys.update(dict.fromkeys(r))
    out = {}
    for k in keys:
        vals = [float(r[k]) for r in results if k in r and not math.isnan(float(r[k]))]
        out[k] = sum(vals) / len(vals) if vals else math.nan
    return out


def _prefixed(metrics: Mapping[str, float], prefix: str) -> dict[str, float]:
    return {k if k.startswith(f"{prefix}/") else f"{prefix}/{k}": float(v) for k, v in metrics.items()}


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


class ReasoningRunner:
    """Runs SFT warm-up then RL with verifiable rewards over actor, rollout and reward groups.

    Args:
        cfg: the ``runner`` config.
        actor: the actor group (methods in the module docstring).
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

    def __init__(
        self,
        cfg: RunnerConfig,
        *,
        actor: GroupLike,
        rollout: GroupLike,
        reward: GroupLike,
        algorithm: AlgorithmConfig,
        data: DataConfig,
        encoder: PromptEncoder,
        train_data: PromptDataset,
        sampling: Mapping[str, Any],
        eval_data: PromptDataset | None = None,
        eval_sampling: Mapping[str, Any] | None = None,
        sft: SFTConfig | None = None,
        sft_data: PromptDataset | None = None,
        to_batch: Callable[[Batch], Any] | None = None,
        offload: bool = False,
        batch_multiple: int = 1,
        refresh_reference: bool = False,
        run_config: Mapping[str, Any] | None = None,
        on_step: Callable[[int, dict[str, float]], None] | None = None,
    ) -> None:
        if algorithm.adv_type.lower() not in REASONING_ADV_TYPES:
            raise ValueError(
                f"algorithm.adv_type {algorithm.adv_type!r} is not supported by the reasoning runner; "
                f"allowed: {', '.join(REASONING_ADV_TYPES)}"
            )
        self.sft = sft or SFTConfig()
        if self.sft.steps > 0 and not sft_data:
            raise ValueError("sft.steps > 0 needs SFT demonstrations (data.sft_path)")
        self.cfg = cfg
        self.actor = actor
        self.rollout = rollout
        self.reward = reward
        self.algorithm = algorithm
        self.data = data
        self.encoder = encoder
        self.train_data = train_data
        self.eval_data = (
            eval_data if eval_data is None or data.eval_size is None else eval_data[: data.eval_size]
        )
        self.sft_data = sft_data
        self.sampling = dict(sampling)
        self.eval_sampling = (
            dict(eval_sampling) if eval_sampling is not None else {**self.sampling, "temperature": 0.0}
        )
        self.max_new_tokens = int(self.sampling.get("max_new_tokens", 0)) or None
        self.to_batch = to_batch or (lambda b: b)
        self.offload = offload
        if batch_multiple < 1:
            raise ValueError(f"batch_multiple must be >= 1, got {batch_multiple}")
        self.batch_multiple = batch_multiple
        self.refresh_reference = refresh_reference
        self.run_config = dict(run_config or {})
        self.on_step = on_step
        self.group_size = algorithm.group_size
        self.log_path = Path(cfg.logger.log_path)
        self.checkpoints = CheckpointManager(self.log_path, max_to_keep=cfg.max_checkpoints_to_keep)
        self.global_step = 0
        self.sft_done = self.sft.steps == 0
        self.last_eval: dict[str, float] = {}
        self._last_eval_step = -1
        self._eval_time_s = 0.0
        self.sampler = PromptSampler(len(train_data), seed=data.seed, shuffle=data.shuffle)
        self.sft_sampler = (
            PromptSampler(len(sft_data), seed=data.seed + 1, shuffle=data.shuffle) if sft_data else None
        )
        self._train_ids = self._encode_all(train_data, "data.train_path")
        self._eval_ids = self._encode_all(self.eval_data, "data.eval_path") if self.eval_data else []

    # ------------------------------------------------------------------------------------------ helpers
    def _encode_all(self, dataset: PromptDataset, what: str) -> list[list[int]]:
        ids = [self.encoder.encode_prompt(example) for example in dataset]
        too_long = [i for i, p in enumerate(ids) if len(p) > self.data.max_prompt_length]
        if too_long:
            longest = max(len(ids[i]) for i in too_long)
            raise ValueError(
                f"{what} ({dataset.source}): {len(too_long)} prompt(s) are longer than data.max_prompt_length="
                f"{self.data.max_prompt_length} tokens (longest {longest}, first at row {too_long[0]}); "
                "raise data.max_prompt_length or shorten the prompts"
            )
        return ids

    def _wait(self, call: _CallLike) -> list[Any]:
        return call.wait(timeout=self.cfg.step_timeout_s)

    def _gather(self, group: GroupLike, method: str, *args: Any) -> list[Any]:
        """Call ``method(*args)`` on every rank (each takes its share); concatenate the lists in rank order."""
        out: list[Any] = []
        for part in self._wait(group.call(method, *args)):
            out += list(part)
        return out

    def _score(self, texts: Sequence[str], refs: Sequence[Sequence[str]]) -> tuple[list[float], list[bool]]:
        results = self._wait(self.reward.call("compute", list(texts), [list(r) for r in refs]))
        rewards = [float(x) for res in results for x in res["rewards"]]
        correct = [bool(x) for res in results for x in res["correct"]]
        if len(rewards) != len(texts) or len(correct) != len(texts):
            raise RuntimeError(f"the reward group returned {len(rewards)} rewards for {len(texts)} responses")
        return rewards, correct

    def _phase(self, group: GroupLike, method: str) -> None:
        if self.offload:
            self._wait(group.call(method))

    def _actor_all(self, method: str, batch: Batch) -> list[Any]:
        return self._wait(self.actor.call(method, self.to_batch(batch)))

    # ---------------------------------------------------------------------------------------- the phases
    def sync_weights(self) -> None:
        """Send the actor's weights to every rollout rank (versioned broadcast)."""
        self._phase(self.rollout, "onload")
        send = self.actor.call("sync_model_to_rollout", self.rollout.name)
        recv = self.rollout.call("sync_model_from_actor", self.actor.name)
        self._wait(send)
        self._wait(recv)

    def generate(
        self, prompt_ids: Sequence[Sequence[int]], sampling: Mapping[str, Any]
    ) -> list[dict[str, Any]]:
        """Generate one response per prompt (sharded over the rollout ranks); returns the output dicts."""
        outputs = self._gather(self.rollout, "generate", [list(p) for p in prompt_ids], dict(sampling))
        if len(outputs) != len(prompt_ids):
            raise RuntimeError(f"the rollout returned {len(outputs)} outputs for {len(prompt_ids)} prompts")
        return outputs

    def evaluate(self, prefix: str = "eval") -> dict[str, float]:
        """Greedy answers to the held-out prompts, scored by the reward group; returns ``<prefix>/*``."""
        if not self.eval_data:
            return {}
        start = time.perf_counter()
        outputs = self.generate(self._eval_ids, self.eval_sampling)
        self._phase(self.rollout, "offload")
        rewards, correct = self._score([o["text"] for o in outputs], [e.answers for e in self.eval_data])
        lengths = [len(o["token_ids"]) for o in outputs]
        metrics = {
            f"{prefix}/accuracy": _mean([float(c) for c in correct]),
            f"{prefix}/reward_mean": _mean(rewards),
            f"{prefix}/response_len_mean": _mean([float(n) for n in lengths]),
            f"{prefix}/truncated_frac": _mean([float(o.get("finish_reason") == "length") for o in outputs]),
            f"{prefix}/num_samples": float(len(outputs)),
        }
        elapsed = time.perf_counter() - start
        self._eval_time_s += elapsed
        metrics["time/eval_s"] = elapsed
        if prefix == "eval":
            self.last_eval = metrics
            self._last_eval_step = self.global_step
        return metrics

    def sft_step(self) -> dict[str, float]:
        """One warm-up update on the next ``sft.batch_size`` demonstrations; returns ``sft/*`` metrics."""
        assert self.sft_data is not None and self.sft_sampler is not None
        examples = [self.sft_data[i] for i in self.sft_sampler.next_batch(self.sft.batch_size)]
        prompts = [self.encoder.encode_prompt(e) for e in examples]
        targets = [self.encoder.encode_completion(e.solution or "") for e in examples]
        batch = pack_sequences(prompts, targets, pad_token_id=self.encoder.pad_token_id)
        batch = {k: batch[k] for k in ("input_ids", "attention_mask", "loss_mask")}
        return _prefixed(_mean_over_ranks(self._actor_all("run_sft", batch)), "sft")

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
        self._phase(self.rollout, "offload")
        metrics = {
            "rollout/reward_mean": _mean(raw_rewards),
            "rollout/accuracy": _mean([float(c) for c in correct]),
            "rollout/response_len_mean": _mean([float(n) for n in lengths]),
            "rollout/response_len_max": float(max(lengths)) if lengths else math.nan,
            "rollout/truncated_frac": _mean([float(t) for t in truncated]),
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
        self._phase(self.actor, "onload")
        extra: Mapping[str, Any] = {}
        if self._needs_logprobs():
            extra = self._actor_all("compute_logprobs", batch)[0]
            for key in ("values", "ref_logprobs", "logprobs"):
                if key in extra:
                    batch[f"{'old_' if key == 'logprobs' else ''}{key}"] = np.asarray(
                        extra[key], dtype=np.float32
                    )
        metrics.update(self.compute_advantages(batch, extra))
        train_batch = {k: val for k, val in batch.items() if k not in ("prompt_lengths", "response_lengths")}
        metrics.update(_prefixed(_mean_over_ranks(self._actor_all("run_training", train_batch)), "train"))
        self._phase(self.actor, "offload")
        metrics["train/skipped"] = 0.0
        metrics["time/train_s"] = time.perf_counter() - t1
        return metrics

    # ------------------------------------------------------------------------------------ checkpointing
    def save_checkpoint(self) -> Path:
        """Write ``global_step_<N>`` atomically: the actor's state, then the runner's, then commit."""
        staging = self.checkpoints.begin(self.global_step)
        try:
            self._wait(self.actor.call("save_checkpoint", str(staging)))
            state = {
                "global_step": self.global_step,
                "sft_done": self.sft_done,
                "sampler": self.sampler.state_dict(),
                "sft_sampler": self.sft_sampler.state_dict() if self.sft_sampler else None,
                "rng": capture_rng_state(),
                "last_eval": self.last_eval,
            }
            (staging / RUNNER_STATE_FILE).write_bytes(pickle.dumps(state))
        except BaseException:
            self.checkpoints.abort(staging)
            raise
        return self.checkpoints.commit(self.global_step, staging, {"global_step": self.global_step})

    def load_checkpoint(self, path: str | Path) -> None:
        """Restore the actor and the runner from a checkpoint directory (the next step is N + 1)."""
        path = Path(path)
        self._wait(self.actor.call("load_checkpoint", str(path)))
        runner_state = path / RUNNER_STATE_FILE
        if runner_state.is_file():
            state = pickle.loads(runner_state.read_bytes())
            self.global_step = int(state["global_step"])
            self.sft_done = bool(state.get("sft_done", True))
            self.sampler.load_state_dict(state["sampler"])
            if self.sft_sampler is not None and state.get("sft_sampler"):
                self.sft_sampler.load_state_dict(state["sft_sampler"])
            restore_rng_state(state["rng"])
            self.last_eval = dict(state.get("last_eval", {}))
        else:
            self.global_step = checkpoint_step(path)
            self.sft_done = True

    def evaluate_checkpoint(self, path: str | Path) -> dict[str, float]:
        """Load a checkpoint (a ``global_step_<N>`` directory or ``auto``), sync it and evaluate once."""
        resolved = resolve_resume_dir(str(path), self.log_path)
        if resolved is None:
            raise ValueError(
                f"no complete checkpoint under {self.log_path / 'checkpoints'} (path={str(path)!r})"
            )
        self.load_checkpoint(resolved)
        self.sync_weights()
        metrics = self.evaluate()
        metrics["eval/checkpoint_step"] = float(self.global_step)
        return metrics

    # ------------------------------------------------------------------------------------------- the loop
    def _warm_up(self, logger: MetricLogger) -> None:
        if self.sft.eval_before and self.eval_data:
            self.sync_weights()
            self._log(logger, self.evaluate("eval_pre_sft"), None)
        bar = (
            tqdm(total=self.sft.steps, desc="sft", unit="step", dynamic_ncols=True)
            if self.cfg.progress_bar
            else None
        )
        try:
            for k in range(self.sft.steps):
                t0 = time.perf_counter()
                record = self.sft_step()
                record["sft/step"] = float(k + 1)
                record["time/sft_step_s"] = time.perf_counter() - t0
                self._log(logger, record, None)
                if bar is not None:
                    bar.update(1)
                    loss = record.get("sft/loss")
                    if loss is not None:
                        bar.set_postfix({"loss": f"{loss:.3g}"}, refresh=False)
        finally:
            if bar is not None:
                bar.close()
        if self.refresh_reference:
            self._wait(self.actor.call("update_reference_model"))
        self.sft_done = True

    def run(self) -> RunResult:
        """SFT warm-up (unless done), then ``runner.total_steps`` RL steps (resuming first if asked)."""
        cfg = self.cfg
        random.seed(cfg.seed)
        self.checkpoints.clean_stale()
        resume = resolve_resume_dir(cfg.resume_dir, self.log_path)
        if resume is not None:
            self.load_checkpoint(resume)
        total, val = cfg.total_steps, cfg.val_check_interval
        logger = MetricLogger(
            self.log_path,
            cfg.logger.logger_backends,
            project=cfg.logger.project_name,
            experiment=cfg.logger.experiment_name,
            config=self.run_config,
        )
        bar = None
        train_start = time.perf_counter()
        self._eval_time_s = 0.0
        try:
            if not self.sft_done:
                self._warm_up(logger)
                if cfg.save_interval > 0:
                    self.save_checkpoint()
            if cfg.progress_bar:
                bar = tqdm(
                    total=total, initial=self.global_step, desc="train", unit="step", dynamic_ncols=True
                )
            while self.global_step < total:
                step = self.global_step
                self.sync_weights()
                if val > 0 and step % val == 0:
                    self._log(logger, self.evaluate(), bar)
                record = self.train_step()
                self.global_step = step + 1
                record["time/step_s"] = record["time/rollout_s"] + record["time/train_s"]
                record["time/train_wall_s"] = time.perf_counter() - train_start - self._eval_time_s
                self._log(logger, record, bar, advance=True)
                if cfg.save_interval > 0 and self.global_step % cfg.save_interval == 0:
                    self.save_checkpoint()
            if val > 0 and self.eval_data and self._last_eval_step != self.global_step:
                self.sync_weights()
                self._log(logger, self.evaluate(), bar)
            if cfg.save_interval >= 0 and self.checkpoints.latest() != self.checkpoints.path_for(
                self.global_step
            ):
                self.save_checkpoint()
        finally:
            if bar is not None:
                bar.close()
            logger.close()
        return RunResult(
            self.log_path,
            self.log_path / "metrics.jsonl",
            self.checkpoints.latest(),
            self.global_step,
            self.last_eval,
        )

    def _log(
        self, logger: MetricLogger, record: dict[str, float], bar: Any, *, advance: bool = False
    ) -> None:
        if not record:
            return
        log_step(
            logger,
            self.global_step,
            record,
            bar,
            on_step=self.on_step,
            last_eval=self.last_eval,
            shown=_REASONING_SHOWN,
            advance=advance,
        )
