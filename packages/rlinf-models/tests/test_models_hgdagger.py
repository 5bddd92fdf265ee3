"""HG-DAgger: the discrepancy gate, takeover counting, gated aggregation and the gating config's errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from rlinf_core.config import AlgorithmConfig, ReplayBufferConfig
from rlinf_core.protocols import EnvSpec
from rlinf_models import EmbodiedActorConfig, ExpertConfig, OptimConfig
from rlinf_models.offpolicy import (
    DAggerTrainer,
    DiscrepancyGate,
    action_discrepancy,
    count_takeovers,
    intervention_metrics,
)
from rlinf_models.policies import PolicyConfig, SquashedGaussianPolicy, build_policy

SPEC = EnvSpec((3,), "continuous", 2, action_low=(-1.0, -2.0), action_high=(1.0, 2.0))
MODEL = PolicyConfig(hidden_sizes=(16,), add_value_head=False, add_q_head=True, num_action_chunks=2)


def _gate_run(
    gate: DiscrepancyGate, ds: list[float], starts: list[bool] | None = None
) -> tuple[list[bool], list[bool]]:
    control, takeovers = [], []
    for i, d in enumerate(ds):
        new = None if starts is None else torch.tensor([starts[i]])
        step = gate.step(torch.tensor([d]), new_episode=new)
        control.append(bool(step.control[0]))
        takeovers.append(bool(step.takeovers[0]))
    return control, takeovers


def test_gate_takes_over_above_the_threshold_and_hands_back_below_the_release() -> None:
    gate = DiscrepancyGate(0.5, 0.2)
    ds = [0.1, 0.5, 0.6, 0.4, 0.3, 0.2, 0.19, 0.4, 0.51, 0.1]
    control, takeovers = _gate_run(gate, ds)
    # 0.5 is not above the gate; 0.6 takes over; 0.4..0.2 stay (hysteresis: not below 0.2); 0.19 hands back;
    # 0.4 is between the thresholds but the learner holds control, so it keeps it; 0.51 takes over again.
    assert control == [False, False, True, True, True, True, False, False, True, False]
    assert takeovers == [False, False, True, False, False, False, False, False, True, False]


def test_without_hysteresis_the_gate_follows_the_threshold() -> None:
    control, _ = _gate_run(DiscrepancyGate(0.5, 0.5), [0.6, 0.49, 0.6, 0.5, 0.5])
    assert control == [True, False, True, True, True]  # 0.5 is not below the release: kept


def test_a_new_episode_starts_under_the_learner_and_batches_keep_their_own_state() -> None:
    gate = DiscrepancyGate(0.5, 0.2)
    control, takeovers = _gate_run(gate, [0.9, 0.3, 0.3, 0.3], starts=[False, False, True, False])
    assert control == [True, True, False, False]
    assert takeovers == [True, False, False, False]
    a = gate.step(torch.tensor([0.9, 0.1]), key="a").control
    b = gate.step(torch.tensor([0.3, 0.3]), key="b").control
    assert a.tolist() == [True, False] and b.tolist() == [False, False]
    assert gate.step(torch.tensor([0.3, 0.3]), key="a").control.tolist() == [True, False]
    with pytest.raises(
        ValueError, match=r"release_threshold \(0\.6\) must be in \[0, gate_threshold \(0\.5\)\]"
    ):
        DiscrepancyGate(0.5, 0.6)


def test_gate_state_round_trips_through_a_pickle_and_continues_identically() -> None:
    import pickle

    gate = DiscrepancyGate(0.5, 0.2)
    gate.step(torch.tensor([0.9, 0.1, 0.6]), key=0)
    gate.step(torch.tensor([0.1, 0.9]), key=1)
    raw = gate.state_dict()
    state = pickle.loads(pickle.dumps(raw))
    restored = DiscrepancyGate(0.5, 0.2)
    restored.load_state_dict(state)
    fresh = DiscrepancyGate(0.5, 0.2)
    for key in (0, 1):
        held, back = gate.in_control(key), restored.in_control(key)
        assert held is not None and back is not None
        assert torch.equal(back, held)
    # Between the thresholds: the restored gate keeps the expert where it held control, as the original does.
    d = torch.tensor([0.3, 0.3, 0.3])
    want = gate.step(d, key=0)
    got = restored.step(d, key=0)
    assert torch.equal(got.control, want.control) and torch.equal(got.takeovers, want.takeovers)
    assert want.control.tolist() == [True, False, True]
    assert fresh.step(d, key=0).control.tolist() == [False, False, False]  # what a resume without it did
    # The saved state is a copy: stepping the gate afterwards leaves it as it was.
    gate.step(torch.tensor([0.1, 0.1, 0.1]), key=0)
    assert raw["control"][0].tolist() == [True, False, True]
    with pytest.raises(ValueError, match=r"DiscrepancyGate state must be \{'control'"):
        restored.load_state_dict({"control": {0: torch.zeros(2)}})


def test_discrepancy_is_the_mean_step_norm_of_the_chunk() -> None:
    learner = torch.zeros(2, 2, 2)
    expert = torch.tensor([[[0.3, 0.4], [0.0, 0.0]], [[1.0, 0.0], [0.0, -1.0]]])
    torch.testing.assert_close(action_discrepancy(learner, expert), torch.tensor([0.25, 1.0]))


def test_takeovers_count_across_steps_episodes_and_rollouts() -> None:
    flags = torch.tensor([[1, 0], [1, 1], [0, 1], [1, 1]], dtype=torch.bool)
    starts = torch.tensor([[0, 0], [0, 0], [0, 0], [0, 1]], dtype=torch.bool)
    takeovers, last = count_takeovers(flags, starts)
    assert takeovers.int().tolist() == [[1, 0], [0, 1], [0, 0], [1, 1]]  # a new episode's takeover counts
    again, _ = count_takeovers(torch.ones(1, 2, dtype=torch.bool), torch.zeros(1, 2, dtype=torch.bool), last)
    assert again.int().tolist() == [[0, 0]]  # control held over the rollout boundary is no new takeover
    d = torch.tensor([[0.6, 0.1], [0.3, 0.9], [float("nan"), 0.4], [0.8, 0.2]])
    m = intervention_metrics(flags, takeovers, d)
    assert m["hgdagger/intervention_rate"] == 6 / 8 and m["hgdagger/takeovers"] == 4
    assert m["hgdagger/discrepancy"] == pytest.approx(float(d[~d.isnan()].mean()))
    assert m["hgdagger/takeover_discrepancy"] == pytest.approx((0.6 + 0.9 + 0.8 + 0.2) / 4)
    assert "hgdagger/discrepancy" not in intervention_metrics(flags, takeovers, None)


def _trainer(tmp_path: Path, gating: str) -> DAggerTrainer:
    checkpoint = ""
    if gating != "intervention":
        path = tmp_path / "expert" / "actor" / "model.pt"
        path.parent.mkdir(parents=True)
        torch.save(build_policy(SPEC, PolicyConfig(hidden_sizes=(8,))).state_dict(), path)
        checkpoint = str(path.parent.parent)
    expert = ExpertConfig(
        model=PolicyConfig(hidden_sizes=(8,)), checkpoint=checkpoint, obs_key=None, gating=gating
    )
    actor = EmbodiedActorConfig(
        model=MODEL, expert=expert, global_batch_size=4, micro_batch_size=4, optim=OptimConfig(lr=1e-2)
    )
    alg = AlgorithmConfig(
        loss_type="embodied_dagger",
        adv_type="embodied_dagger",
        update_epoch=40,
        replay_buffer=ReplayBufferConfig(cache_size=64, min_buffer_size=2),
    )
    torch.manual_seed(0)
    return DAggerTrainer(SquashedGaussianPolicy(SPEC, MODEL), SPEC, actor, alg)


def _traj(flags: torch.Tensor, *, discrepancy: bool) -> dict[str, Any]:
    t, e, c = flags.shape
    g = torch.Generator().manual_seed(1)
    out: dict[str, Any] = {
        "obs": torch.randn(t, e, 3, generator=g),
        # executed actions in env units; dimension 1 spans [-2, 2], and 3.0 lies outside it (clipped)
        "actions": torch.stack(
            [torch.rand(t, e, c, generator=g) * 2 - 1, torch.full((t, e, c), 3.0)], dim=-1
        ),
        "dones": torch.zeros(t + 1, e, c, dtype=torch.bool),
        "interventions": flags,
    }
    if discrepancy:
        out["discrepancy"] = torch.rand(t, e, generator=g)
    return out


@pytest.mark.parametrize("gating", ["discrepancy", "intervention"])
def test_only_the_experts_chunks_enter_the_buffer_with_its_executed_actions(
    tmp_path: Path, gating: str
) -> None:
    tr = _trainer(tmp_path, gating)
    assert tr.expert is None  # the labels are the executed actions: no expert network on the learner's side
    flags = torch.zeros(3, 4, 2, dtype=torch.bool)
    flags[0, 1] = True
    flags[2, 3] = True
    flags[1, 2, 0] = True  # half a chunk: the learner executed the rest, not a sample
    traj = _traj(flags, discrepancy=gating == "discrepancy")
    assert tr.add_trajectory(traj) == 12
    assert len(tr.buffer) == 2
    stored = tr.buffer.sample(64)  # with replacement: every stored row shows up
    want_obs = torch.stack([traj["obs"][0, 1], traj["obs"][2, 3]])
    want = torch.stack([traj["actions"][0, 1], traj["actions"][2, 3]]).clone()
    want[..., 1] = 1.0  # 3.0 clipped to the bound 2.0, normalised
    for obs, label in zip(stored["obs"], stored["expert_actions"], strict=True):
        row = int((want_obs - obs).abs().sum(-1).argmin())
        torch.testing.assert_close(obs, want_obs[row])
        torch.testing.assert_close(label, want[row])
    metrics = tr.update(40)
    assert metrics["hgdagger/aggregated"] == 2 and metrics["hgdagger/takeovers"] == 3
    assert metrics["hgdagger/intervention_rate"] == pytest.approx(5 / 24)
    assert "dagger/beta" not in metrics and metrics["replay_buffer/size"] == 2
    if gating == "discrepancy":
        assert metrics["hgdagger/discrepancy"] == pytest.approx(float(traj["discrepancy"].mean()))
    else:  # the learner's distance from the human where the human acted, before training
        assert 0 < metrics["hgdagger/discrepancy"] < 2 * 2**0.5
    assert metrics["dagger/num_updates"] == 40
    assert "hgdagger/aggregated" not in tr.update(200)  # the rollout's statistics are reported once
    tr.policy.eval()
    with torch.no_grad():
        fitted, _ = tr.policy.sample(want_obs, deterministic=True)
    assert action_discrepancy(fitted, want).max() < 0.25  # regression reached the expert's labels


def test_a_gated_trainer_needs_the_interventions(tmp_path: Path) -> None:
    tr = _trainer(tmp_path, "intervention")
    traj = _traj(torch.zeros(2, 2, 2, dtype=torch.bool), discrepancy=False)
    del traj["interventions"]
    with pytest.raises(ValueError, match=r"actor\.expert\.gating 'intervention': the trajectory carries no"):
        tr.add_trajectory(traj)
    tr.add_trajectory(_traj(torch.zeros(2, 2, 2, dtype=torch.bool), discrepancy=False))
    assert len(tr.buffer) == 0 and tr.update(3)["dagger/num_updates"] == 0


def test_takeover_state_survives_a_checkpoint(tmp_path: Path) -> None:
    a = _trainer(tmp_path / "a", "discrepancy")
    a.add_trajectory(_traj(torch.ones(1, 2, 2, dtype=torch.bool), discrepancy=True))
    for name, state in a.checkpoint_files():
        torch.save(state, tmp_path / name)
    b = _trainer(tmp_path / "b", "discrepancy")
    b.load_checkpoint_files(lambda name: torch.load(tmp_path / name, weights_only=True))
    b.add_trajectory(_traj(torch.ones(1, 2, 2, dtype=torch.bool), discrepancy=True))
    assert b.update(1)["hgdagger/takeovers"] == 0  # control held since the last rollout


def test_gating_config_errors_name_the_keys() -> None:
    with pytest.raises(
        ValueError, match=r"actor\.expert\.gating: 'ensemble' is not one of mixture, discrepancy, "
    ):
        ExpertConfig(checkpoint="x", gating="ensemble")  # type: ignore[arg-type]
    with pytest.raises(
        ValueError, match=r"actor\.expert\.release_threshold \(0\.7\) must be <= actor\.expert\.gate"
    ):
        ExpertConfig(checkpoint="x", gating="discrepancy", gate_threshold=0.5, release_threshold=0.7)
    with pytest.raises(ValueError, match=r"gate_threshold"):
        ExpertConfig(checkpoint="x", gate_threshold=0.0)
    with pytest.raises(
        ValueError, match=r"actor\.expert\.checkpoint: gating 'intervention' labels with the human"
    ):
        ExpertConfig(checkpoint="x", gating="intervention")
    with pytest.raises(
        ValueError, match=r"actor\.expert\.checkpoint: give .*\(gating 'discrepancy' runs the expert"
    ):
        ExpertConfig(gating="discrepancy")
    assert ExpertConfig(gating="intervention").checkpoint == ""
