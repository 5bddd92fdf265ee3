"""``build_policy`` / ``build_inference_policy``: the policy class chosen by ``actor.model``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
from rlinf_core.protocols import EnvSpec

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

__all__ = ["build_inference_policy", "build_offpolicy_policy", "build_policy"]

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
