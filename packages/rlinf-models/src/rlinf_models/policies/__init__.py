"""Policies: actor-critics, the flow-matching policy, the off-policy tanh-Gaussian policy with its Q heads.

The MLP and CNN actor-critics cover discrete and continuous actions, action chunks and a value head.
"""

from typing import TYPE_CHECKING

from rlinf_core import lazy_exports

from ._config import (
    PRETRAINED_SUBDIR,
    VLA_MODEL_TYPES,
    PolicyConfig,
    checkpoint_weights_file,
    vla_checkpoint_directory,
)

if TYPE_CHECKING:
    from ._actor_critic import ActorCritic, PolicyOutput
    from ._factory import build_inference_policy, build_offpolicy_policy, build_policy, export_pretrained
    from ._flow import FlowPolicy
    from ._flow_sac import FlowSACPolicy
    from ._sac import BatchRenorm1d, QEnsemble, SquashedGaussianPolicy
    from ._weights import (
        LoadedWeights,
        load_policy_weights,
        load_rollout_weights,
        rollout_state_dict,
        trainable_names,
    )

# The modules pull in torch: loaded on first use, so that the configs (read by the driver before Ray starts
# the workers) stay light.
__getattr__ = lazy_exports(
    __name__,
    {
        "ActorCritic": "._actor_critic",
        "PolicyOutput": "._actor_critic",
        "build_policy": "._factory",
        "FlowPolicy": "._flow",
        "FlowSACPolicy": "._flow_sac",
        "build_inference_policy": "._factory",
        "build_offpolicy_policy": "._factory",
        "export_pretrained": "._factory",
        "BatchRenorm1d": "._sac",
        "QEnsemble": "._sac",
        "SquashedGaussianPolicy": "._sac",
        "LoadedWeights": "._weights",
        "load_policy_weights": "._weights",
        "rollout_state_dict": "._weights",
        "load_rollout_weights": "._weights",
        "trainable_names": "._weights",
    },
)

__all__ = [
    "PRETRAINED_SUBDIR",
    "VLA_MODEL_TYPES",
    "ActorCritic",
    "BatchRenorm1d",
    "FlowPolicy",
    "FlowSACPolicy",
    "LoadedWeights",
    "PolicyConfig",
    "PolicyOutput",
    "QEnsemble",
    "SquashedGaussianPolicy",
    "build_inference_policy",
    "build_offpolicy_policy",
    "build_policy",
    "checkpoint_weights_file",
    "export_pretrained",
    "load_policy_weights",
    "load_rollout_weights",
    "rollout_state_dict",
    "trainable_names",
    "vla_checkpoint_directory",
]
