"""``build_policy`` / ``build_inference_policy``: the policy class chosen by ``actor.model``."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import attrs
import torch
from rlinf_core.checkpoint import capture_rng_state, restore_rng_state
from rlinf_core.protocols import EnvSpec
from torch import nn

from .._fsdp import _is_sharded
from ._actor_critic import ActorCritic
from ._config import PolicyConfig, vla_checkpoint_directory
from ._flow import FlowPolicy
from ._flow_sac import FlowSACPolicy
from ._sac import SquashedGaussianPolicy

if TYPE_CHECKING:
    from ..gr00t import GR00TPolicy
    from ..openvla import OpenVLAOFTPolicy, OpenVLAPolicy
    from ..pi0 import Pi0Policy
    from ..smolvla import SmolVLAPolicy

__all__ = ["build_inference_policy", "build_offpolicy_policy", "build_policy", "export_pretrained"]

_DEFAULT_CONFIG = PolicyConfig()


def build_policy(
    spec: EnvSpec, config: PolicyConfig = _DEFAULT_CONFIG
) -> ActorCritic | FlowPolicy | Pi0Policy | SmolVLAPolicy | GR00TPolicy | OpenVLAPolicy | OpenVLAOFTPolicy:
    """The on-policy policy of ``config`` for ``spec``.

    :class:`FlowPolicy` for ``model_type: flow``, :class:`~rlinf_models.pi0.Pi0Policy` for ``pi0`` / ``pi05``,
    :class:`~rlinf_models.smolvla.SmolVLAPolicy` for ``smolvla``,
    :class:`~rlinf_models.gr00t.GR00TPolicy` for ``gr00t``, :class:`~rlinf_models.openvla.OpenVLAPolicy`
    for ``openvla``, :class:`~rlinf_models.openvla.OpenVLAOFTPolicy` for ``openvla_oft``, else ActorCritic.

    A VLA's ``model_path`` may be a ``global_step_<N>`` checkpoint of the SFT runner: its ``pretrained/``
    export is read (:func:`~rlinf_models.policies.vla_checkpoint_directory`).

    Raises:
        FileNotFoundError: naming ``actor.model.model_path`` when a VLA's is no checkpoint directory.
    """
    if config.is_vla and config.model_path is not None:
        config = attrs.evolve(config, model_path=str(vla_checkpoint_directory(config.model_path)))
    if config.model_type == "openvla_oft":
        # The one place that imports the OpenVLA backend (transformers, the [openpi] extra), only when chosen.
        from ..openvla import OpenVLAOFTPolicy

        return OpenVLAOFTPolicy(spec, config)
    if config.model_type == "openvla":
        # The one place that imports the OpenVLA backend (transformers, the [openpi] extra), only when chosen.
        from ..openvla import OpenVLAPolicy

        return OpenVLAPolicy(spec, config)
    if config.model_type == "gr00t":
        # The one place that imports the GR00T backend (transformers, the [openpi] extra), only when chosen.
        from ..gr00t import GR00TPolicy

        return GR00TPolicy(spec, config)
    if config.model_type == "smolvla":
        # The one place that imports the SmolVLA backend (transformers, the [openpi] extra), only when chosen.
        from ..smolvla import SmolVLAPolicy

        return SmolVLAPolicy(spec, config)
    if config.is_vla:
        # The one place that imports the π0 backend (transformers, the [openpi] extra), only when chosen.
        from ..pi0 import Pi0Policy

        return Pi0Policy(spec, config)
    if config.model_type == "flow":
        return FlowPolicy(spec, config)
    return ActorCritic(spec, config)


def build_offpolicy_policy(spec: EnvSpec, config: PolicyConfig) -> SquashedGaussianPolicy | FlowSACPolicy:
    """The off-policy actor of ``config`` (``add_q_head``).

    SAC-Flow's :class:`FlowSACPolicy` for ``model_type: flow``, else the tanh-Gaussian
    :class:`SquashedGaussianPolicy`.
    """
    if config.model_type == "flow":
        return FlowSACPolicy(spec, config)
    return SquashedGaussianPolicy(spec, config)


def build_inference_policy(
    spec: EnvSpec, config: PolicyConfig
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
    """The policy the rollout runs for ``config``: the off-policy actor when ``add_q_head``.

    The off-policy actor is :func:`build_offpolicy_policy`'s.

    All classes have ``act(obs, deterministic=...) -> PolicyOutput`` and ``value(obs)``, and they load what the
    matching actor worker sends (:func:`~rlinf_models.policies.load_rollout_weights`). With ``is_lora``, the
    policy is the plain model for ``lora_sync: merged`` and the adapted one, on ``model_path``'s base weights,
    for ``lora_sync: adapters``.
    """
    if config.add_q_head:
        return build_offpolicy_policy(spec, config)
    if config.is_lora and config.lora_sync == "merged":
        # The actor sends merged weights (rollout_state_dict): the rollout runs the plain model.
        config = attrs.evolve(config, is_lora=False)
    return build_policy(spec, config)


def export_pretrained(
    policy: nn.Module,
    spec: EnvSpec,
    config: PolicyConfig,
    directory: str | Path,
    full_state: Mapping[str, torch.Tensor] | None = None,
) -> Path:
    """Export a VLA policy to ``directory`` in its adapter's published layout (its ``save_pretrained``).

    A plain policy exports itself. A sharded one (FSDP2: its parameters are ``DTensor`` shards) cannot:
    ``full_state`` is then its full state dict (``full_model_state_dict``, gathered collectively; call this on
    rank 0 only), loaded into a fresh unsharded policy built from ``config`` on the CPU, which exports it. That
    policy reads ``config.model_path`` once more and holds a second full copy of the weights while it exports;
    the RNG states it draws on at construction are restored afterwards, so a run with exports samples as one
    without.

    Args:
        policy: the policy (``build_policy(spec, config)``, possibly sharded).
        spec: the env spec it was built for.
        config: its ``actor.model``.
        directory: where to write (created).
        full_state: the full state dict of a sharded ``policy`` (ignored for a plain one).

    Returns:
        ``directory``.

    Raises:
        ValueError: naming ``actor.model.model_type`` when it is no VLA, or when a sharded policy comes without
            ``full_state``.
    """
    if not config.is_vla:
        raise ValueError(
            f"actor.model.model_type: {config.model_type!r} has no pretrained export (only the VLA model types do)"
        )
    if not _is_sharded(policy):
        if not isinstance(policy, _Exportable):
            raise ValueError(f"export_pretrained: {type(policy).__name__} has no save_pretrained")
        return policy.save_pretrained(directory)
    if full_state is None:
        raise ValueError(
            "export_pretrained: a sharded policy needs its full state dict (full_model_state_dict)"
        )
    rng = capture_rng_state()
    try:
        plain = build_policy(spec, config)
    finally:
        restore_rng_state(rng)
    assert isinstance(plain, _Exportable)  # every VLA policy is
    plain.load_state_dict(full_state)
    return plain.save_pretrained(directory)


@runtime_checkable
class _Exportable(Protocol):
    """A policy that exports itself in its model's published layout (the VLA policies)."""

    def save_pretrained(self, directory: str | Path) -> Path: ...

    def load_state_dict(
        self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False
    ) -> Any: ...
