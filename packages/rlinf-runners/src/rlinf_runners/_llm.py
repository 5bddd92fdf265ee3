"""What the LLM runners share on top of :class:`~rlinf_runners.Runner`: prompts, the SFT warm-up, scoring.

:class:`LLMRunner` is the common layer of :class:`~rlinf_runners.ReasoningRunner` and
:class:`~rlinf_runners.AgentRunner` (siblings, neither extends the other): it tokenizes the prompt sets on the
driver, samples prompts and demonstrations resumably, fans calls out over the rollout and reward ranks, moves
models on and off the accelerators between phases (collocated runs), runs the SFT warm-up before the first RL
step, and checkpoints the actor plus the samplers. A subclass implements :meth:`~rlinf_runners.Runner.train_step`,
:meth:`LLMRunner.evaluate` and :meth:`LLMRunner.sft_step`.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

import attrs
import numpy as np
import numpy.typing as npt
from attrs import validators as v
from rlinf_core.config import AlgorithmConfig
from rlinf_core.data import (
    DataConfig,
    ImagePromptEncoder,
    PromptDataset,
    PromptEncoder,
    PromptExample,
    PromptSampler,
)
from rlinf_core.metrics import MetricLogger
from rlinf_core.protocols import LLMActor, LLMRollout, OffloadRole, RewardRole
from rlinf_scheduler import RoleCall, RoleGroup
from tqdm.auto import tqdm

from ._base import Runner, StepCallback
from ._config import RunnerConfig

__all__ = ["Batch", "LLMRunner", "SFTConfig"]

Batch = dict[str, npt.NDArray[Any]]
"""A training batch: named numpy arrays, ``[N, T]`` or ``[N]``."""

RolloutT = TypeVar("RolloutT", bound=LLMRollout)
"""The rollout role of an LLM runner (``LLMRollout``, or ``AgentRollout`` for whole episodes)."""
T = TypeVar("T")
R = TypeVar("R")


@attrs.frozen(kw_only=True)
class SFTConfig:
    """The supervised warm-up before RL (config ``sft``); demonstrations come from ``data.sft_path``."""

    steps: int = attrs.field(default=0, validator=v.ge(0))
    """``actor.run_sft`` calls (optimizer updates) before the first RL step (``0``: no warm-up)."""
    batch_size: int = attrs.field(default=16, validator=v.ge(1))
    """Demonstrations per ``run_sft`` call."""
    eval_before: bool = False
    """Also evaluate the model before the warm-up (logged as ``eval_pre_sft/*``)."""


class LLMRunner(Runner, Generic[RolloutT]):
    """The shared part of the LLM runners (see the module docstring; arguments as on the subclasses).

    Raises:
        ValueError: for an ``adv_type`` outside :attr:`adv_types`, a warm-up without demonstrations, a ``batch_multiple`` below 1, or a prompt longer
            than ``data.max_prompt_length``.
    """

    progress_keys: ClassVar[Sequence[tuple[str, str]]] = (
        ("rollout/accuracy", "acc"),
        ("eval/accuracy", "eval"),
        ("train/actor/policy_loss", "loss"),
        ("time/step_s", "s/step"),
    )

    adv_types: ClassVar[tuple[str, ...]]
    """The ``algorithm.adv_type`` values the runner supports."""
    runner_name: ClassVar[str]
    """How errors name the runner (``reasoning``, ``agent``)."""

    def __init__(
        self,
        cfg: RunnerConfig,
        *,
        actor: RoleGroup[LLMActor],
        rollout: RoleGroup[RolloutT],
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
        to_batch: Callable[[Batch], Any] | None = None,
        offload: bool = False,
        batch_multiple: int = 1,
        refresh_reference: bool = False,
        elastic_actor_ranks: Sequence[int] = (),
        run_config: Mapping[str, Any] | None = None,
        on_step: StepCallback | None = None,
        eval_chunk: int | None = None,
    ) -> None:
        if algorithm.adv_type.lower() not in self.adv_types:
            raise ValueError(
                f"algorithm.adv_type {algorithm.adv_type!r} is not supported by the {self.runner_name} runner; "
                f"allowed: {', '.join(self.adv_types)}"
            )
        if sft_data is not None:
            self.check_sft_data(sft_data)
        with_images = [
            d.source for d in (train_data, eval_data, sft_data) if d is not None and any(e.images for e in d)
        ]
        if with_images and not isinstance(encoder, ImagePromptEncoder):
            raise ValueError(
                f"{', '.join(with_images)}: prompts with images need a vision-language model (actor.model.model_path "
                "with a vision_config, e.g. Qwen2.5-VL)"
            )
        self.sft = sft or SFTConfig()
        if self.sft.steps > 0 and not sft_data:
            raise ValueError("sft.steps > 0 needs SFT demonstrations (data.sft_path)")
        if batch_multiple < 1:
            raise ValueError(f"batch_multiple must be >= 1, got {batch_multiple}")
        if eval_chunk is not None and eval_chunk < 1:
            raise ValueError(f"eval_chunk must be >= 1 or None, got {eval_chunk}")
        elastic = tuple(elastic_actor_ranks)
        if elastic and (
            offload or len(set(elastic)) != len(elastic) or not all(0 < r < actor.world_size for r in elastic)
        ):
            raise ValueError(
                f"elastic_actor_ranks {list(elastic)}: expected distinct actor ranks in 1..{actor.world_size - 1} "
                "(rank 0 stays on the actor's own devices) and no collocated offload"
            )
        super().__init__(cfg, run_config=run_config, on_step=on_step)
        self.actor = actor
        self.rollout = rollout
        self.reward = reward
        self.algorithm = algorithm
        self.group_size = algorithm.group_size
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
        self.to_batch = to_batch or (lambda b: b)
        self.offload = offload
        self.batch_multiple = batch_multiple
        self.eval_chunk = eval_chunk
        self.refresh_reference = refresh_reference
        self.elastic_actor_ranks = elastic
        self.sft_done = self.sft.steps == 0
        self.sampler = PromptSampler(len(train_data), seed=data.seed, shuffle=data.shuffle)
        self.sft_sampler = (
            PromptSampler(len(sft_data), seed=data.seed + 1, shuffle=data.shuffle) if sft_data else None
        )
        self._train_ids = self._encode_all(train_data, "data.train_path")
        self._eval_ids = self._encode_all(self.eval_data, "data.eval_path") if self.eval_data else []

    # ---------------------------------------------------------------------------------------------- hooks
    @abc.abstractmethod
    def evaluate(self, prefix: str = "eval") -> dict[str, float]:
        """One greedy evaluation on the held-out prompts; returns ``<prefix>/*`` metrics (empty without any)."""

    @abc.abstractmethod
    def sft_step(self) -> dict[str, float]:
        """One warm-up update on the next ``sft.batch_size`` demonstrations; returns ``sft/*`` metrics."""

    def check_sft_data(self, sft_data: PromptDataset) -> None:
        """Raise ``ValueError`` if the demonstrations lack what :meth:`sft_step` needs (default: accept)."""
        del sft_data  # solutions are optional; sft_step trains on what is there

    def has_evaluation(self) -> bool:
        return bool(self.eval_data)

    def runner_state(self) -> dict[str, Any]:
        return {
            "sft_done": self.sft_done,
            "sampler": self.sampler.state_dict(),
            "sft_sampler": self.sft_sampler.state_dict() if self.sft_sampler else None,
        }

    def load_runner_state(self, state: Mapping[str, Any] | None) -> None:
        if state is None:
            self.sft_done = True
            return
        self.sft_done = bool(state.get("sft_done", True))
        self.sampler.load_state_dict(state["sampler"])
        if self.sft_sampler is not None and state.get("sft_sampler"):
            self.sft_sampler.load_state_dict(state["sft_sampler"])

    def save_worker_state(self, staging: Path) -> None:
        """The actor's state and the rollout's sampling RNGs (the reward workers hold none)."""
        calls = [
            self.actor.call(LLMActor.save_checkpoint, str(staging)),
            self.rollout.call(LLMRollout.save_checkpoint, str(staging)),
        ]
        for call in calls:
            self.wait(call)

    def load_worker_state(self, path: Path) -> None:
        """Restore what :meth:`save_worker_state` wrote."""
        calls = [
            self.actor.call(LLMActor.load_checkpoint, str(path)),
            self.rollout.call(LLMRollout.load_checkpoint, str(path)),
        ]
        for call in calls:
            self.wait(call)

    def worker_groups(self) -> Sequence[RoleGroup[Any]]:
        """Actor, rollout and reward (what ``runner.profile`` traces)."""
        return (self.actor, self.rollout, self.reward)

    def sync_weights(self) -> None:
        """Send the actor's weights to every rollout rank (versioned broadcast)."""
        if self.offload or self.elastic_actor_ranks:  # the actor (or its elastic ranks) gave the devices back
            self.wait(self.rollout.call(OffloadRole.onload))
        send = self.actor.call(LLMActor.sync_model_to_rollout, self.rollout.name)
        recv = self.rollout.call(LLMRollout.sync_model_from_actor, self.actor.name)
        self.wait(send)
        self.wait(recv)

    def before_training(self, logger: MetricLogger) -> None:
        """The SFT warm-up (unless a resumed checkpoint already did it), then a checkpoint if saving."""
        if self.sft_done:
            return
        self._warm_up(logger)
        if self.cfg.save_interval > 0:
            self.save_checkpoint()

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

    def images_of(self, examples: Sequence[PromptExample]) -> list[list[npt.NDArray[np.uint8]]] | None:
        """Each example's images as ``[H, W, 3]`` uint8 arrays, or ``None`` when none has any (text prompts)."""
        if not any(e.images for e in examples):
            return None
        encoder = self.encoder
        assert isinstance(encoder, ImagePromptEncoder)  # checked in __init__
        return [encoder.prompt_images(e) if e.images else [] for e in examples]

    def _in_chunks(self, n: int, submit: Callable[[slice], RoleCall[list[T]]], desc: str) -> list[T]:
        """``submit`` over consecutive slices of ``n`` items, gathered in order, with a progress bar.

        A slice holds :attr:`eval_chunk` items (``None``: all ``n`` in one call). The next slice is submitted
        before the current one is gathered, so the rollout ranks go on without a pause; the bar (when
        ``runner.progress_bar`` and there is more than one slice) counts the items answered.
        """
        size = self.eval_chunk or max(n, 1)
        parts = [slice(i, min(i + size, n)) for i in range(0, n, size)]
        if len(parts) <= 1:
            return self._gather(submit(slice(0, n)))
        bar = (
            tqdm(total=n, desc=desc, unit="prompt", leave=False, dynamic_ncols=True)
            if self.cfg.progress_bar
            else None
        )
        out: list[T] = []
        try:
            pending = submit(parts[0])
            for k, part in enumerate(parts):
                ahead = submit(parts[k + 1]) if k + 1 < len(parts) else None
                got = self._gather(pending)
                if len(got) != part.stop - part.start:
                    raise RuntimeError(
                        f"the rollout returned {len(got)} results for {part.stop - part.start} {desc} items"
                    )
                out += got
                if bar is not None:
                    bar.update(len(got))
                if ahead is not None:
                    pending = ahead
        finally:
            if bar is not None:
                bar.close()
        return out

    def _gather(self, call: RoleCall[list[T]]) -> list[T]:
        """The lists a call returned on every rank (each rank's share), concatenated in rank order."""
        out: list[T] = []
        for part in self.wait(call):
            out += list(part)
        return out

    def _score(self, texts: Sequence[str], refs: Sequence[Sequence[str]]) -> tuple[list[float], list[bool]]:
        results = self.wait(self.reward.call(RewardRole.compute, list(texts), [list(r) for r in refs]))
        rewards = [float(x) for res in results for x in res["rewards"]]
        correct = [bool(x) for res in results for x in res["correct"]]
        if len(rewards) != len(texts) or len(correct) != len(texts):
            raise RuntimeError(f"the reward group returned {len(rewards)} rewards for {len(texts)} responses")
        return rewards, correct

    def _phase(self, group: RoleGroup[OffloadRole], method: Callable[[OffloadRole], None]) -> None:
        """``offload``/``onload`` between phases when the run asks for it (collocated groups)."""
        if self.offload:
            self.wait(group.call(method))

    def begin_training(self) -> dict[str, float]:
        """Give the devices to the actor before it trains; returns ``scaling/*`` timings (dynamic scaling).

        Collocated runs onload the actor (``offload``). With elastic actor ranks (``runner.dynamic_scaling``) the
        actor's world grows onto the rollout's devices: the rollout releases them, then the elastic ranks load
        their shard of the model and optimizer state onto them.
        """
        if not self.elastic_actor_ranks:
            self._phase(self.actor, OffloadRole.onload)
            return {}
        t0 = time.perf_counter()
        self.wait(self.rollout.call(OffloadRole.offload))
        self.wait(self.actor.execute_on(*self.elastic_actor_ranks).call(OffloadRole.onload))
        return {
            "scaling/grow_s": time.perf_counter() - t0,
            "scaling/actor_ranks": float(self.actor.world_size),
        }

    def end_training(self) -> dict[str, float]:
        """Undo :meth:`begin_training` once the actor is done: the elastic ranks give the rollout's devices back."""
        if not self.elastic_actor_ranks:
            self._phase(self.actor, OffloadRole.offload)
            return {}
        t0 = time.perf_counter()
        self.wait(self.actor.execute_on(*self.elastic_actor_ranks).call(OffloadRole.offload))
        return {"scaling/shrink_s": time.perf_counter() - t0}

    def _actor_all(self, method: Callable[[LLMActor, Mapping[str, Any]], R], batch: Batch) -> list[R]:
        """Send the whole ``batch`` to every actor rank (each trains on its share)."""
        return self.wait(self.actor.call(method, self.to_batch(batch)))

    def _warm_up(self, logger: MetricLogger) -> None:
        if self.sft.eval_before and self.eval_data:
            self.sync_weights()
            self.log(logger, self.evaluate("eval_pre_sft"), None)
            self.flush_samples(logger)
        bar = (
            tqdm(total=self.sft.steps, desc="sft", unit="step", dynamic_ncols=True)
            if self.cfg.progress_bar
            else None
        )
        if self.elastic_actor_ranks:
            self.begin_training()  # the warm-up trains on the grown world too
        try:
            for k in range(self.sft.steps):
                t0 = time.perf_counter()
                record = self.sft_step()
                record["sft/step"] = float(k + 1)
                record["time/sft_step_s"] = time.perf_counter() - t0
                self.log(logger, record, None)
                if bar is not None:
                    bar.update(1)
                    loss = record.get("sft/loss")
                    if loss is not None:
                        bar.set_postfix({"loss": f"{loss:.3g}"}, refresh=False)
        finally:
            if bar is not None:
                bar.close()
        if self.elastic_actor_ranks:
            self.end_training()
        if self.refresh_reference:
            self.wait(self.actor.call(LLMActor.update_reference_model))
        self.sft_done = True
