"""DAgger: the expert from a checkpoint, labels, aggregation, regression and the checkpoint round trip."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from rlinf_core.config import AlgorithmConfig, ReplayBufferConfig
from rlinf_core.protocols import EnvSpec, ObsSpec
from rlinf_models import EmbodiedActorConfig, ExpertConfig, OptimConfig
from rlinf_models.offpolicy import DAggerTrainer, build_expert, expert_spec
from rlinf_models.policies import PolicyConfig, SquashedGaussianPolicy, build_policy

SPEC = EnvSpec(
    (),
    "continuous",
    2,
    action_low=(-1.0, -2.0),
    action_high=(1.0, 2.0),
    obs_dict={
        "rgb": ObsSpec((36, 36, 3), "uint8"),
        "state": ObsSpec((3,)),
        "privileged_state": ObsSpec((5,)),
    },
)
EXPERT_MODEL = PolicyConfig(hidden_sizes=(16,))
LEARNER = PolicyConfig(
    model_type="cnn",
    obs_keys=("rgb", "state"),
    hidden_sizes=(32,),
    image_feature_dim=16,
    add_value_head=False,
    add_q_head=True,
    num_action_chunks=2,
)


def _expert_file(tmp_path: Path) -> Path:
    torch.manual_seed(3)
    expert = build_policy(expert_spec(SPEC, ExpertConfig(checkpoint="x")), EXPERT_MODEL)
    path = tmp_path / "global_step_7" / "actor" / "model.pt"
    path.parent.mkdir(parents=True)
    torch.save(expert.state_dict(), path)
    return path


def _trainer(tmp_path: Path, **expert: Any) -> DAggerTrainer:
    _expert_file(tmp_path)
    cfg = ExpertConfig(model=EXPERT_MODEL, checkpoint=str(tmp_path / "global_step_7"), **expert)
    actor = EmbodiedActorConfig(
        model=LEARNER, expert=cfg, global_batch_size=16, micro_batch_size=16, optim=OptimConfig(lr=3e-3)
    )
    alg = AlgorithmConfig(
        loss_type="embodied_dagger",
        adv_type="embodied_dagger",
        update_epoch=30,
        replay_buffer=ReplayBufferConfig(cache_size=256, min_buffer_size=16),
    )
    torch.manual_seed(0)
    return DAggerTrainer(SquashedGaussianPolicy(SPEC, LEARNER), SPEC, actor, alg)


def _traj(t: int = 8, e: int = 4, seed: int = 0) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    return {
        "obs": {
            "rgb": torch.randint(0, 256, (t, e, 36, 36, 3), generator=g, dtype=torch.uint8),
            "state": torch.randn(t, e, 3, generator=g),
            "privileged_state": torch.randn(t, e, 5, generator=g),
        },
        "actions": torch.zeros(t, e, 2, 2),
    }


def test_expert_spec_and_loading_errors_name_the_field(tmp_path: Path) -> None:
    assert expert_spec(SPEC, ExpertConfig(checkpoint="x")).obs_shape == (5,)
    with pytest.raises(ValueError, match=r"actor\.expert\.obs_key: 'goal' is not in the observation"):
        expert_spec(SPEC, ExpertConfig(checkpoint="x", obs_key="goal"))
    with pytest.raises(ValueError, match=r"actor\.expert\.checkpoint: give"):
        ExpertConfig()
    with pytest.raises(FileNotFoundError, match=r"actor\.expert\.checkpoint: no policy weights"):
        build_expert(SPEC, ExpertConfig(checkpoint=str(tmp_path / "missing")))
    path = _expert_file(tmp_path)
    wrong = ExpertConfig(model=PolicyConfig(hidden_sizes=(8,)), checkpoint=str(path))
    with pytest.raises(ValueError, match=r"actor\.expert\.checkpoint: .* shapes differ: actor_body"):
        build_expert(SPEC, wrong)


def test_labels_are_the_experts_mean_clipped_and_normalised(tmp_path: Path) -> None:
    tr = _trainer(tmp_path)
    obs = _traj(1, 6)["obs"]
    flat = {k: v[0] for k, v in obs.items()}
    labels = tr.label(flat)
    assert labels.shape == (6, 2, 2) and labels.abs().max() <= 1.0
    mean = tr.expert.act(flat["privileged_state"], deterministic=True).actions[:, 0]
    want = torch.stack([mean[:, 0].clamp(-1, 1), mean[:, 1].clamp(-2, 2) / 2], dim=-1)
    torch.testing.assert_close(labels[:, 0], want)
    torch.testing.assert_close(labels[:, 1], want)  # a one-step expert labels the whole chunk


def test_aggregation_keeps_only_the_learners_view_and_regression_fits_the_expert(tmp_path: Path) -> None:
    tr = _trainer(tmp_path)
    assert tr.beta() == 1.0
    assert tr.add_trajectory(_traj()) == 32
    assert set(tr.buffer.keys) == {"obs/rgb", "obs/state", "expert_actions"}  # no privileged state stored
    first = tr.update(1)
    later = [tr.update(30)["dagger/loss"] for _ in range(3)]
    assert later[-1] < 0.5 * first["dagger/loss"]
    assert tr.beta() == 0.5**4 and first["dagger/beta"] == 0.5


def test_checkpoint_files_round_trip(tmp_path: Path) -> None:
    a = _trainer(tmp_path)
    a.add_trajectory(_traj())
    a.update(3)
    for name, state in a.checkpoint_files():  # through files, as a checkpoint (no tensor shared with `a`)
        torch.save(state, tmp_path / name)
    b = _trainer(tmp_path / "b")
    b.policy.load_state_dict(a.policy.state_dict())
    b.load_checkpoint_files(lambda name: torch.load(tmp_path / name, weights_only=True))
    assert (b.train_steps, b.update_steps, len(b.buffer)) == (1, 3, 32)
    torch.manual_seed(5)
    la = a.update(2)["dagger/loss"]
    torch.manual_seed(5)
    lb = b.update(2)["dagger/loss"]
    assert la == lb
