"""Off-policy embodied training: replay buffers, the SAC-family and DAgger trainers and ``OffPolicyActorWorker``.

The math (critic targets, actor and temperature losses, Polyak updates) is ``rlinf_algos.offpolicy``; the
networks are ``rlinf_models.policies.SquashedGaussianPolicy`` and ``QEnsemble``.
"""

from typing import TYPE_CHECKING

from rlinf_core import lazy_exports

from ._buffer import ReplayBuffer, SymmetricSampler
from ._dagger import DAggerTrainer, build_expert, expert_spec
from ._hgdagger import DiscrepancyGate, GateStep, action_discrepancy, count_takeovers, intervention_metrics
from ._trainer import TRANSITION_KEYS, SACTrainer, trajectory_transitions

if TYPE_CHECKING:
    from ._actor_worker import OffPolicyActorWorker

__all__ = [
    "TRANSITION_KEYS",
    "DAggerTrainer",
    "DiscrepancyGate",
    "GateStep",
    "OffPolicyActorWorker",
    "ReplayBuffer",
    "SACTrainer",
    "SymmetricSampler",
    "action_discrepancy",
    "build_expert",
    "count_takeovers",
    "expert_spec",
    "intervention_metrics",
    "trajectory_transitions",
]

# The worker pulls in Ray (through rlinf_scheduler): loaded on first use only.
__getattr__ = lazy_exports(__name__, {"OffPolicyActorWorker": "._actor_worker"})
