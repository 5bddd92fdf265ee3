"""The embodied app's off-policy path (``algorithm.loss_type: embodied_sac``): its checks and its runner.

:class:`~rlinf_runners.apps.EmbodiedApp` picks this path from the algorithm; the groups are the same three (the
actor is ``OffPolicyActorWorker``, the env workers collect transitions), the runner is
:class:`~rlinf_runners.OffPolicyRunner`, or :class:`~rlinf_runners.AsyncOffPolicyRunner` for ``runner.mode: async``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
from rlinf_core.config import OFFPOLICY_LOSS_TYPES

from .._async_offpolicy import AsyncOffPolicyRunner
from .._offpolicy import OffPolicyRunner

if TYPE_CHECKING:
    from ._embodied import EmbodiedConfig

__all__ = ["MAKE_DEMOS", "build_offpolicy_runner", "offpolicy_problems"]


MAKE_DEMOS = "uv run apps/embodied/make_demos.py"
"""The command that writes a demo buffer file (``algorithm.demo_buffer.load_path``) from a scripted expert."""


def offpolicy_problems(
    cfg: EmbodiedConfig,
    world_sizes: Mapping[str, int] | None,
    *,
    resolve_path: Callable[[str], Path] = Path,
) -> list[str]:
    """What an off-policy embodied config must satisfy beyond each section's own checks (``[]``: nothing).

    ``resolve_path`` finds a relative ``algorithm.demo_buffer.load_path`` (the app's data-path lookup).
    """
    alg = cfg.algorithm
    problems: list[str] = []
    if not alg.is_offpolicy:
        return [
            f"actor.model.add_q_head builds the off-policy policy: set algorithm.loss_type and adv_type to one of "
            f"{', '.join(OFFPOLICY_LOSS_TYPES)}, or add_q_head: false"
        ]
    if not cfg.actor.model.add_q_head:
        problems.append(
            f"actor.model.add_q_head must be true for algorithm.loss_type {alg.loss_type!r} "
            "(the tanh-Gaussian policy, or SAC-Flow's flow policy for model_type 'flow', and its Q heads; with "
            "add_value_head: false)"
        )
    if cfg.actor.model.model_type == "flow" and alg.loss_type == "embodied_dagger":
        problems.append(
            "actor.model.model_type 'flow' with algorithm.loss_type 'embodied_dagger': DAgger trains the "
            "tanh-Gaussian policy; choose model_type 'mlp', 'cnn' or 'resnet'"
        )
    if not cfg.env.train.auto_reset:
        problems.append(
            "env.train.auto_reset must be true for off-policy training (transitions span episodes)"
        )
    problems += _dagger_problems(cfg, world_sizes, resolve_path)
    rb = alg.replay_buffer
    if rb.min_buffer_size > rb.cache_size:
        problems.append(
            f"algorithm.replay_buffer.min_buffer_size ({rb.min_buffer_size}) exceeds its cache_size "
            f"({rb.cache_size}): learning would never start"
        )
    if alg.demo_buffer is not None and not resolve_path(alg.demo_buffer.load_path).is_file():
        problems.append(
            f"algorithm.demo_buffer.load_path: no file {alg.demo_buffer.load_path!r}; write the scripted "
            f"expert's demonstrations there with `{MAKE_DEMOS} --config-name <this config>`"
        )
    actors = 1 if world_sizes is None else world_sizes["actor"]
    if actors > 1 and cfg.actor.global_batch_size % actors:
        problems.append(
            f"actor.global_batch_size ({cfg.actor.global_batch_size}) must split evenly over the {actors} "
            "off-policy actor ranks cluster.component_placement gives"
        )
    if actors > 1 and alg.q_head_type == "crossq":
        problems.append(
            f"algorithm.q_head_type: crossq runs on one actor rank (batch renormalisation needs the whole "
            f"batch); cluster.component_placement gives the actor {actors}"
        )
    return problems


def _dagger_problems(
    cfg: EmbodiedConfig, world_sizes: Mapping[str, int] | None, resolve_path: Callable[[str], Path]
) -> list[str]:
    dagger = cfg.algorithm.loss_type == "embodied_dagger"
    expert = cfg.actor.expert
    if not dagger:
        return (
            ["actor.expert is read by DAgger only: set algorithm.loss_type embodied_dagger or drop it"]
            if expert
            else []
        )
    if expert is None:
        return ["algorithm.loss_type 'embodied_dagger' needs actor.expert (model, checkpoint, obs_key)"]
    problems = []
    if expert.gating == "intervention":
        if cfg.env.train.env_type != "gymnasium":
            problems.append(
                f"actor.expert.gating 'intervention' reads the human's takeovers from the step info of a gymnasium "
                f"env (is_intervention, teleop_action: e.g. gym-hil's); env.train.env_type is {cfg.env.train.env_type!r}"
            )
        weights = None
    else:
        weights = attrs.evolve(expert, checkpoint=str(resolve_path(expert.checkpoint))).weights_file()
    if weights is not None and not weights.is_file():
        problems.append(
            f"actor.expert.checkpoint: no expert weights at {weights}; train the expert first (e.g. "
            f"`uv run apps/embodied/train.py --config-name maniskill_pushcube_ppo`) and point this at its checkpoint"
        )
    if world_sizes is not None and world_sizes["actor"] > 1:
        problems.append(
            f"algorithm.loss_type 'embodied_dagger' runs on one actor rank; the placement gives {world_sizes['actor']}"
        )
    if cfg.runner.mode == "async":
        problems.append(
            "algorithm.loss_type 'embodied_dagger' runs with runner.mode sync (β and the gate follow the weights "
            "version)"
        )
    if cfg.algorithm.random_warmup_steps:
        problems.append(
            "algorithm.random_warmup_steps: DAgger starts from the expert (actor.expert.gating), set 0"
        )
    return problems


def build_offpolicy_runner(cfg: EmbodiedConfig, common: Mapping[str, Any]) -> OffPolicyRunner:
    """The runner of ``cfg`` (``OffPolicyRunner``; ``AsyncOffPolicyRunner`` for ``runner.mode: async``).

    ``common``: the keywords every embodied runner takes (the groups, ``rollout_epoch``, ``run_config``,
    ``on_step``).
    """
    warmup = cfg.algorithm.random_warmup_steps
    if cfg.runner.mode == "async":
        k = cfg.algorithm.staleness_threshold
        return AsyncOffPolicyRunner(cfg.runner, random_warmup_steps=warmup, staleness_threshold=k, **common)
    return OffPolicyRunner(cfg.runner, random_warmup_steps=warmup, **common)
