"""Policies: MLP and CNN actor-critics (discrete and continuous actions, action chunks, value head)."""

from typing import TYPE_CHECKING

from rlinf_core import lazy_exports

from ._config import PolicyConfig

if TYPE_CHECKING:
    from ._actor_critic import ActorCritic, PolicyOutput, build_policy

# The modules pull in torch: loaded on first use, so that the configs (read by the driver before Ray starts
# the workers) stay light.
__getattr__ = lazy_exports(
    __name__,
    {"ActorCritic": "._actor_critic", "PolicyOutput": "._actor_critic", "build_policy": "._actor_critic"},
)

__all__ = ["ActorCritic", "PolicyConfig", "PolicyOutput", "build_policy"]
