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
``input_ids[:, t]``), ``returns [N, T]`` (PPO critic), ``rewards [N]``; with prompt images (a vision-language
model) also ``images [N, K, H, W, 3]`` and ``image_sizes [N, K, 2]`` (``rlinf_core.data.pack_images``), and the
rollout's ``generate`` gets each prompt's images.
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
from rlinf_core.config import AlgorithmConfig
from rlinf_core.data import pack_images, pack_sequences
from rlinf_core.protocols import LLMActor, LLMRollout, OffloadRole
from rlinf_scheduler import Channel, RoleCall

from ._config import RunnerConfig
from ._llm import Batch, LLMRunner, SFTConfig
from ._metrics import mean, mean_over_ranks, prefixed

__all__ = ["REASONING_ADV_TYPES", "ReasoningRunner", "SFTConfig", "pipeline_problems"]

Images = Sequence[Sequence[npt.NDArray[np.uint8]]]
"""Each prompt's ``[H, W, 3]`` uint8 images (vision-language runs)."""

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
    advantages: list[float] = attrs.field(factory=list)
    """Per-sequence GRPO advantages (pipelined mode only: computed per group as the group is kept)."""
    images: list[list[npt.NDArray[np.uint8]]] = attrs.field(factory=list)
    """Each sequence's prompt images (vision-language runs; empty for text)."""

    def extend(self, other: _Rollouts, start: int, stop: int) -> None:
        self.prompts += other.prompts[start:stop]
        self.responses += other.responses[start:stop]
        self.logprobs += other.logprobs[start:stop]
        self.rewards += other.rewards[start:stop]
        self.truncated += other.truncated[start:stop]
        self.advantages += other.advantages[start:stop]
        self.images += other.images[start:stop]

    def pop_front(self, n: int) -> _Rollouts:
        """Remove the first ``n`` sequences and return them."""
        head = _Rollouts()
        head.extend(self, 0, n)
        rest = _Rollouts()
        rest.extend(self, n, len(self.rewards))
        for field in attrs.fields(_Rollouts):
            setattr(self, field.name, getattr(rest, field.name))
        return head


@attrs.define
class _CollectStats:
    """What :meth:`ReasoningRunner.collect` reports about everything it generated (kept or not)."""

    rewards: list[float] = attrs.field(factory=list)
    correct: list[bool] = attrs.field(factory=list)
    lengths: list[int] = attrs.field(factory=list)
    truncated: list[bool] = attrs.field(factory=list)
    gen_batches: int = 0

    def add(self, batch: _Rollouts, correct: Sequence[bool]) -> None:
        self.rewards += batch.rewards
        self.correct += correct
        self.lengths += [len(r) for r in batch.responses]
        self.truncated += batch.truncated

    def metrics(self, kept_groups: int) -> dict[str, float]:
        return {
            "rollout/reward_mean": mean(self.rewards),
            "rollout/accuracy": mean([float(c) for c in self.correct]),
            "rollout/response_len_mean": mean([float(n) for n in self.lengths]),
            "rollout/response_len_max": float(max(self.lengths)) if self.lengths else math.nan,
            "rollout/truncated_frac": mean([float(t) for t in self.truncated]),
            "rollout/num_samples": float(len(self.rewards)),
            "dapo/num_gen_batches": float(self.gen_batches),
            "dapo/kept_groups": float(kept_groups),
        }


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
        eval_chunk: prompts per evaluation request (``None``: all at once). The apps pass the rollout's
            capacity, ``rollout.max_batch_size`` x its ranks: one engine batch per rank per request, the
            next request queued ahead, and a progress bar that counts the prompts answered.

    Raises:
        ValueError: for an unsupported ``adv_type``, a prompt longer than ``data.max_prompt_length``, or a
            warm-up without demonstrations.
    """

    adv_types = REASONING_ADV_TYPES
    runner_name = "reasoning"

    def __init__(
        self,
        cfg: RunnerConfig,
        *,
        pipeline: bool = False,
        pipeline_chunk_prompts: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(cfg, **kwargs)
        if pipeline:
            problems = pipeline_problems(
                self.algorithm,
                rollout_batch_size=self.data.rollout_batch_size,
                global_batch_size=None,
                offload=self.offload or bool(self.elastic_actor_ranks),
            )
            if problems:
                raise ValueError("; ".join(problems))
        if pipeline_chunk_prompts is not None and pipeline_chunk_prompts < 1:
            raise ValueError(f"pipeline_chunk_prompts must be >= 1, got {pipeline_chunk_prompts}")
        self.pipeline = pipeline
        # Just enough prompts per generation request to fill one streamed micro-batch (all actor ranks).
        self.chunk_prompts = pipeline_chunk_prompts or max(1, -(-self.batch_multiple // self.group_size))
        self._stream: Channel | None = None

    @property
    def max_new_tokens(self) -> int | None:
        """The training sampling's ``max_new_tokens`` (``None`` when unset), for the DAPO overlong penalty."""
        return int(self.sampling.get("max_new_tokens", 0)) or None

    # ---------------------------------------------------------------------------------------- the phases
    def _generate_call(
        self, prompt_ids: Sequence[Sequence[int]], sampling: Mapping[str, Any], images: Images | None
    ) -> RoleCall[list[dict[str, Any]]]:
        prompts = [list(p) for p in prompt_ids]
        if images is None:  # text prompts: the call every rollout takes
            return self.rollout.call(LLMRollout.generate, prompts, dict(sampling))
        return self.rollout.call(LLMRollout.generate, prompts, dict(sampling), images=images)

    def generate(
        self, prompt_ids: Sequence[Sequence[int]], sampling: Mapping[str, Any], images: Images | None = None
    ) -> list[dict[str, Any]]:
        """Generate one response per prompt (sharded over the rollout ranks); returns the output dicts.

        ``images``: each prompt's images (vision-language runs), sent along with the prompts.
        """
        outputs = self._gather(self._generate_call(prompt_ids, sampling, images))
        if len(outputs) != len(prompt_ids):
            raise RuntimeError(f"the rollout returned {len(outputs)} outputs for {len(prompt_ids)} prompts")
        return outputs

    def evaluate(self, prefix: str = "eval") -> dict[str, float]:
        """Greedy answers to the held-out prompts, scored by the reward group; returns ``<prefix>/*``."""
        if not self.eval_data:
            return {}
        start = time.perf_counter()
        images = self.images_of(self.eval_data)
        outputs = self._in_chunks(
            len(self._eval_ids),
            lambda part: self._generate_call(
                self._eval_ids[part], self.eval_sampling, None if images is None else images[part]
            ),
            prefix,
        )
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
        images = self.images_of(examples)
        if images is not None:
            batch.update(pack_images(images))
        return prefixed(mean_over_ranks(self._actor_all(LLMActor.run_sft, batch)), "sft")

    def _requests(self, idx: Sequence[int]) -> tuple[list[list[int]], list[list[str]], Images | None]:
        """The prompts (``group_size`` copies each), reference answers and images (or ``None``) of prompts ``idx``."""
        gs = self.group_size
        prompts = [self._train_ids[i] for i in idx for _ in range(gs)]
        refs = [list(self.train_data[i].answers) for i in idx for _ in range(gs)]
        images = self.images_of([self.train_data[i] for i in idx])
        if images is not None:  # decoded once per prompt, shared by its group's copies
            images = [row for row in images for _ in range(gs)]
        return prompts, refs, images

    def _scored(
        self,
        prompts: list[list[int]],
        refs: Sequence[Sequence[str]],
        outputs: Sequence[Mapping[str, Any]],
        images: Images | None = None,
    ) -> tuple[_Rollouts, list[bool]]:
        """Score generated responses; returns them (rewards with the DAPO overlong penalty) and their correctness."""
        rewards, correct = self._score([o["text"] for o in outputs], refs)
        out = _Rollouts(
            prompts=prompts,
            responses=[list(o["token_ids"]) for o in outputs],
            logprobs=[list(o.get("logprobs") or [0.0] * len(o["token_ids"])) for o in outputs],
            rewards=rewards,
            truncated=[o.get("finish_reason") == "length" for o in outputs],
            images=[] if images is None else [list(row) for row in images],
        )
        alg = self.algorithm
        if alg.overlong_buffer_len > 0 and self.max_new_tokens is not None:
            penalty = overlong_reward_penalty(
                np.asarray([len(r) for r in out.responses]),
                max_length=self.max_new_tokens,
                cache_length=min(alg.overlong_buffer_len, self.max_new_tokens),
            )
            out.rewards = [
                r + alg.overlong_penalty_factor * float(p) for r, p in zip(out.rewards, penalty, strict=True)
            ]
        return out, correct

    def _keep(self, batch: _Rollouts, kept: _Rollouts, limit: int) -> int:
        """Append ``batch``'s groups to ``kept`` until it holds ``limit`` sequences; returns how many were added.

        Dynamic sampling drops the groups whose rewards are all equal (no learning signal).
        """
        gs = self.group_size
        if not self.algorithm.dynamic_sampling:
            n = min(len(batch.rewards), max(0, limit - len(kept.rewards)))
            kept.extend(batch, 0, n)
            return n
        keep = dynamic_sampling_filter(np.asarray(batch.rewards, dtype=np.float64), group_size=gs)
        added = 0
        for g in range(len(batch.rewards) // gs):
            if bool(keep[g * gs]) and len(kept.rewards) < limit:
                kept.extend(batch, g * gs, (g + 1) * gs)
                added += gs
        return added

    def _collect_done(self, kept: int, stats: _CollectStats) -> bool:
        """Whether generation stops after a generation batch (enough kept, no DAPO, or the batch budget spent)."""
        alg = self.algorithm
        return (
            not alg.dynamic_sampling
            or kept >= self.data.rollout_batch_size * self.group_size
            or stats.gen_batches >= alg.max_num_gen_batches
        )

    def collect(self) -> tuple[_Rollouts, dict[str, float]]:
        """Generate and score groups, applying the DAPO overlong penalty and dynamic sampling.

        Returns:
            The kept groups (at most ``data.rollout_batch_size``) and the ``rollout/*``/``dapo/*`` metrics of
            everything generated.
        """
        kept, stats = _Rollouts(), _CollectStats()
        limit = self.data.rollout_batch_size * self.group_size
        while True:
            prompts, refs, images = self._requests(self.sampler.next_batch(self.data.rollout_batch_size))
            batch, correct = self._scored(
                prompts, refs, self.generate(prompts, self.sampling, images), images
            )
            stats.gen_batches += 1
            stats.add(batch, correct)
            self._keep(batch, kept, limit)
            if self._collect_done(len(kept.rewards), stats):
                break
        self._phase(self.rollout, OffloadRole.offload)
        return kept, stats.metrics(len(kept.rewards) // self.group_size)

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
        if rollouts.images:
            batch.update(pack_images(rollouts.images))
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
        if self.pipeline:
            return self.pipelined_step()
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

    # ------------------------------------------------------------------------------------ pipelined mode
    def _stream_channel(self) -> Channel:
        if self._stream is None:
            self._stream = Channel.create(f"{self.rollout.name}-to-{self.actor.name}-{id(self):x}")
        return self._stream

    def release(self) -> None:
        """Shut the rollout → actor channel of the pipelined mode down."""
        if self._stream is not None:
            self._stream.shutdown()
            self._stream = None

    def _send(self, channel: Channel, key: str, micro: _Rollouts) -> dict[str, float]:
        """Put one micro-batch (``micro_batch_size`` x actor ranks sequences) on the channel, rank by rank.

        The sequences are padded into a batch whose token advantages are the per-sequence GRPO ones; returns
        the sums behind the ``adv/*`` metrics.
        """
        batch = self.build_batch(micro)
        t = batch["input_ids"].shape[1]
        p_len = t - max(1, int(batch["response_lengths"].max()))
        mask = batch["loss_mask"]
        adv = np.zeros(mask.shape, dtype=np.float32)
        adv[:, p_len:] = np.where(
            mask[:, p_len:], np.asarray(micro.advantages, dtype=np.float32)[:, None], 0.0
        )
        batch["advantages"] = adv
        rows = {k: v for k, v in batch.items() if k not in ("prompt_lengths", "response_lengths")}
        share = len(micro.rewards) // self.actor.world_size
        for rank in range(self.actor.world_size):
            part = {k: v[rank * share : (rank + 1) * share] for k, v in rows.items()}
            channel.put(self.to_batch(part), key=f"{key}/{rank}")
        valid = adv[mask.astype(bool)].astype(np.float64)
        return {"sum": float(valid.sum()), "sq": float((valid**2).sum()), "n": float(valid.size)}

    def pipelined_step(self) -> dict[str, float]:
        """One RL step with generation, reward and training overlapped (``runner.pipeline``).

        The actor's update starts first and waits on a channel. The prompts of a generation batch go to the
        rollout in chunks of ``pipeline_chunk_prompts`` prompts (x ``group_size`` samples), the next chunk
        requested as soon as one finishes, so the rollout never idles; each finished chunk is scored by the
        reward group, passes the DAPO filters group by group, gets its GRPO advantages, and every full
        micro-batch of kept sequences (``micro_batch_size`` x actor ranks) goes straight to the actor, which
        runs its forward and backward while later chunks are still being generated. After the last one the
        actor takes the step's single optimizer step. Kept sequences short of a full micro-batch are dropped,
        as the sequential step drops groups beyond a multiple of it.

        Returns:
            The metrics of :meth:`train_step`; ``time/rollout_s`` is the generation phase and ``time/train_s``
            what the update took after it (the part generation did not hide).
        """
        gs, n_prompts = self.group_size, self.data.rollout_batch_size
        limit, unit = n_prompts * gs, self.batch_multiple
        channel = self._stream_channel()
        key = f"step{self.global_step}-{time.monotonic_ns():x}"
        t0 = time.perf_counter()
        update = self.actor.call(LLMActor.run_training_stream, channel, key, timeout=self.cfg.step_timeout_s)
        kept, pending, stats = 0, _Rollouts(), _CollectStats()
        adv = {"sum": 0.0, "sq": 0.0, "n": 0.0}
        sent = 0
        while True:
            chunks = _chunks(self.sampler.next_batch(n_prompts), self.chunk_prompts)
            stats.gen_batches += 1
            requests = self._requests(chunks[0])
            call = self._generate_call(requests[0], self.sampling, requests[2])
            for k in range(len(chunks)):
                outputs = self._gather(call)
                prompts, refs, images = requests
                if len(outputs) != len(prompts):
                    raise RuntimeError(
                        f"the rollout returned {len(outputs)} outputs for {len(prompts)} prompts"
                    )
                if k + 1 < len(chunks):  # keep the rollout busy while this chunk is scored and sent
                    requests = self._requests(chunks[k + 1])
                    call = self._generate_call(requests[0], self.sampling, requests[2])
                batch, correct = self._scored(prompts, refs, outputs, images)
                stats.add(batch, correct)
                one_token = np.ones((1, len(batch.rewards)), dtype=bool)  # GRPO: one advantage per sequence
                advantages = grpo(np.asarray(batch.rewards), one_token, group_size=gs)
                batch.advantages = np.asarray(advantages)[0].tolist()
                kept += self._keep(batch, pending, limit - sent)
                while len(pending.rewards) >= unit:
                    part = self._send(channel, key, pending.pop_front(unit))
                    adv = {name: adv[name] + part[name] for name in adv}
                    sent += unit
                if update.done():  # the update cannot end before the end marker: it failed; raise it now
                    self.wait(update)
                    raise RuntimeError(
                        "the actor's streamed update returned before the end of the step's stream"
                    )
            if self._collect_done(kept, stats):
                break
        generated = time.perf_counter()
        for rank in range(self.actor.world_size):
            channel.put(None, key=f"{key}/{rank}")
        metrics = stats.metrics(kept // gs)
        metrics["train/num_sequences"] = float(sent)
        metrics["time/rollout_s"] = generated - t0
        if adv["n"]:
            m = adv["sum"] / adv["n"]
            metrics.update(
                {
                    "adv/mean": m,
                    "adv/std": math.sqrt(max(0.0, adv["sq"] / adv["n"] - m * m)),
                    "adv/trained_tokens": adv["n"],
                }
            )
        results: list[dict[str, float]] = self.wait(update)
        metrics.update(prefixed(mean_over_ranks(results), "train"))
        metrics["train/skipped"] = 0.0 if sent else 1.0
        metrics["time/train_s"] = time.perf_counter() - generated
        return metrics


def _chunks(idx: Sequence[int], size: int) -> list[list[int]]:
    """``idx`` cut into consecutive lists of at most ``size``."""
    return [list(idx[i : i + size]) for i in range(0, len(idx), size)]


def pipeline_problems(
    algorithm: AlgorithmConfig, *, rollout_batch_size: int, global_batch_size: int | None, offload: bool
) -> list[str]:
    """Why a reasoning run cannot be pipelined (empty: it can).

    The pipelined step takes one on-policy optimizer step over GRPO advantages computed group by group, so
    it needs ``adv_type: grpo`` without batch-wide normalisation, one update epoch, all of a step's samples
    in one optimizer step, and devices that the actor and the rollout do not take turns on.
    """
    problems = []
    if algorithm.adv_type.lower() != "grpo":
        problems.append(
            f"runner.pipeline needs algorithm.adv_type 'grpo' (advantages computed group by group as samples "
            f"finish), got {algorithm.adv_type!r}"
        )
    if algorithm.normalize_advantages:
        problems.append(
            "runner.pipeline: algorithm.normalize_advantages normalises over the whole batch, which is only "
            "known after the last sample; set it to false"
        )
    if algorithm.update_epoch != 1:
        problems.append(f"runner.pipeline needs algorithm.update_epoch 1, got {algorithm.update_epoch}")
    samples = rollout_batch_size * algorithm.group_size
    if global_batch_size is not None and global_batch_size != samples:
        problems.append(
            f"runner.pipeline takes one optimizer step per RL step: actor.global_batch_size ({global_batch_size}) "
            f"must equal data.rollout_batch_size x algorithm.group_size ({samples})"
        )
    if offload:
        problems.append(
            "runner.pipeline needs actor and rollout on disjoint devices without offloading or dynamic scaling "
            "(they run at the same time)"
        )
    return problems
