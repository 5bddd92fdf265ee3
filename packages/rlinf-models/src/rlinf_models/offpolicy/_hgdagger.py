"""HG-DAgger (Kelly et al. 2019, https://arxiv.org/abs/1810.02890): the learner drives, a human takes over.

The learner's deterministic policy acts; a gated expert takes control when it judges the learner unsafe and
hands control back later. Only the steps the expert controlled are labelled (with the expert's action) and
aggregated; the learner regresses the aggregate as in DAgger (:class:`~rlinf_models.offpolicy.DAggerTrainer`).

Two gates (``actor.expert.gating``): ``discrepancy``, a simulated human for simulators, takes over when the
normalised action discrepancy ``‖a_learner − a_expert‖`` exceeds ``gate_threshold`` and keeps control until it
falls below ``release_threshold`` (:class:`DiscrepancyGate`, run by the rollout worker); ``intervention``, a
real human, whose takeovers and actions the env reports in its step info (``is_intervention`` and
``teleop_action``, the keys gym-hil's input-control wrapper writes).

The paper's learner is an ensemble whose disagreement ("doubt") is logged at the human's takeovers to fit a
risk threshold; this module keeps the ensemble-free part: the discrepancy at the takeovers
(:func:`intervention_metrics`).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

import attrs
import torch

__all__ = [
    "DiscrepancyGate",
    "GateStep",
    "action_discrepancy",
    "count_takeovers",
    "intervention_metrics",
]


def action_discrepancy(learner: torch.Tensor, expert: torch.Tensor) -> torch.Tensor:
    """``[N]``: the mean over a chunk's ``C`` steps of ``‖a_learner − a_expert‖₂`` (both ``[N, C, D]``, normalised)."""
    out: torch.Tensor = torch.linalg.vector_norm((learner - expert).float(), dim=-1).mean(dim=-1)
    return out


@attrs.frozen
class GateStep:
    """One decision of :class:`DiscrepancyGate` for ``N`` envs."""

    control: torch.Tensor
    """``[N]`` bool: the expert controls this chunk."""
    takeovers: torch.Tensor
    """``[N]`` bool: the expert took control at this chunk (it did not hold it at the previous one)."""


class DiscrepancyGate:
    """The simulated human of HG-DAgger: takeover above ``gate_threshold``, hand-back below ``release_threshold``.

    It holds, per env, whether the expert is in control, for each independent batch of envs (``key``: the
    rollout worker's pipeline stage). A new episode starts under the learner's control.

    Args:
        gate_threshold: take control when the discrepancy exceeds this.
        release_threshold: keep control while the discrepancy is at least this (``<= gate_threshold``).
    """

    def __init__(self, gate_threshold: float, release_threshold: float) -> None:
        if not 0 <= release_threshold <= gate_threshold:
            raise ValueError(
                f"release_threshold ({release_threshold}) must be in [0, gate_threshold ({gate_threshold})]"
            )
        self.gate_threshold = gate_threshold
        self.release_threshold = release_threshold
        self._control: dict[Hashable, torch.Tensor] = {}

    def step(
        self, discrepancy: torch.Tensor, *, key: Hashable = 0, new_episode: torch.Tensor | None = None
    ) -> GateStep:
        """Decide who controls the next chunk of each env from its discrepancy ``[N]``.

        Args:
            discrepancy: ``[N]`` (:func:`action_discrepancy`).
            key: which batch of envs (a batch of another size than before starts afresh).
            new_episode: ``[N]`` bool, envs whose observation starts an episode (they start with the learner).
        """
        n = discrepancy.shape[0]
        prev = self._control.get(key)
        if prev is None or prev.shape[0] != n:
            prev = torch.zeros(n, dtype=torch.bool)
        if new_episode is not None:
            prev = prev & ~new_episode.to(torch.bool).reshape(n)
        d = discrepancy.detach().cpu()
        control = torch.where(prev, d >= self.release_threshold, d > self.gate_threshold)
        self._control[key] = control
        return GateStep(control, control & ~prev)

    def in_control(self, key: Hashable = 0) -> torch.Tensor | None:
        """``[N]`` bool: who holds control of batch ``key`` now (``None`` before its first step)."""
        return self._control.get(key)

    def state_dict(self) -> dict[str, Any]:
        """Who holds control of each batch (``{"control": {key: [N] bool}}``), picklable.

        A run checkpointed mid-episode saves it with the envs' episodes so that a resume continues each episode
        under the same controller.
        """
        return {"control": {k: v.clone() for k, v in self._control.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` (the batches it does not name start afresh).

        Raises:
            ValueError: if ``state`` has no ``control`` mapping of ``[N]`` bool tensors.
        """
        control = state.get("control")
        if not isinstance(control, Mapping) or not all(
            isinstance(v, torch.Tensor) and v.dtype == torch.bool and v.dim() == 1 for v in control.values()
        ):
            raise ValueError(
                f"DiscrepancyGate state must be {{'control': {{key: [N] bool tensor}}}}, got {state!r}"
            )
        self._control = {k: v.clone() for k, v in control.items()}


def count_takeovers(
    flags: torch.Tensor, starts: torch.Tensor, prev: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Takeovers in a sequence of per-step control flags.

    Args:
        flags: ``[S, E]`` bool, the expert (human) controlled env ``e`` at step ``s``.
        starts: ``[S, E]`` bool, step ``s`` starts a new episode of env ``e``.
        prev: ``[E]`` bool, the flags of the step before ``flags[0]`` (``None``: nobody had taken over).

    Returns:
        ``[S, E]`` bool takeovers (control at ``s`` and not at the step before in the same episode), and
        ``flags[-1]`` to pass as ``prev`` for the sequence's continuation.
    """
    first = torch.zeros_like(flags[0]) if prev is None else prev.to(torch.bool)
    before = torch.cat([first[None], flags[:-1]]) & ~starts
    return flags & ~before, flags[-1].clone()


def intervention_metrics(
    flags: torch.Tensor, takeovers: torch.Tensor, discrepancy: torch.Tensor | None
) -> dict[str, float]:
    """One rollout's HG-DAgger statistics.

    Args:
        flags: ``[S, E]`` bool per-step control flags (:func:`count_takeovers`).
        takeovers: ``[S, E]`` bool.
        discrepancy: ``[S, E]`` float, the discrepancy of each step where it is known (NaN elsewhere), or
            ``None``.

    Returns:
        ``hgdagger/intervention_rate`` (fraction of expert-controlled steps), ``hgdagger/takeovers`` (count),
        ``hgdagger/discrepancy`` (mean of the known discrepancies) and ``hgdagger/takeover_discrepancy`` (mean
        at the takeovers: the ensemble-free stand-in of the paper's doubt logged at interventions); the two
        means only where some are known.
    """
    out = {
        "hgdagger/intervention_rate": float(flags.float().mean()) if flags.numel() else 0.0,
        "hgdagger/takeovers": float(takeovers.sum()),
    }
    if discrepancy is not None:
        known = ~torch.isnan(discrepancy)
        if known.any():
            out["hgdagger/discrepancy"] = float(discrepancy[known].mean())
        at = known & takeovers
        if at.any():
            out["hgdagger/takeover_discrepancy"] = float(discrepancy[at].mean())
    return out
