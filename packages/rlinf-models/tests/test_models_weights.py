"""``actor.model.model_path``: pretrained weights into a fresh policy (``load_policy_weights``)."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
import torch
from rlinf_core.protocols import EnvSpec
from rlinf_models import ExpertConfig
from rlinf_models.policies import (
    PolicyConfig,
    build_inference_policy,
    build_offpolicy_policy,
    build_policy,
    checkpoint_weights_file,
    load_policy_weights,
)

SPEC = EnvSpec((5,), "continuous", 2, action_low=(-1.0, -1.0), action_high=(1.0, 1.0))


def _save(tmp_path: Path, config: PolicyConfig, seed: int = 0) -> tuple[Path, dict[str, torch.Tensor]]:
    torch.manual_seed(seed)
    state = build_policy(SPEC, config).state_dict()
    path = tmp_path / "global_step_3" / "actor" / "model.pt"
    path.parent.mkdir(parents=True)
    torch.save(state, path)
    return path, state


def test_checkpoint_weights_file_takes_a_directory_or_the_file() -> None:
    assert checkpoint_weights_file("runs/x/global_step_3") == Path("runs/x/global_step_3/actor/model.pt")
    assert checkpoint_weights_file("w/model.pt") == Path("w/model.pt")


def test_a_file_without_value_head_loads_the_actor_and_keeps_the_fresh_critic(tmp_path: Path) -> None:
    path, state = _save(tmp_path, PolicyConfig(hidden_sizes=(8,), add_value_head=False), seed=1)
    torch.manual_seed(2)
    policy = build_policy(SPEC, PolicyConfig(hidden_sizes=(8,)))
    fresh_critic = {k: v.clone() for k, v in policy.state_dict().items() if k.startswith("critic_body")}
    loaded = load_policy_weights(
        policy, checkpoint_weights_file(path.parent.parent), field="actor.model.model_path", strict=False
    )
    now = policy.state_dict()
    for key, value in state.items():
        torch.testing.assert_close(now[key], value)
    for key, value in fresh_critic.items():
        torch.testing.assert_close(now[key], value)
    assert set(loaded.loaded) == set(state)
    assert {k.split(".")[0] for k in loaded.kept} == {"critic_body", "value_head"}
    assert loaded.ignored == ()
    assert "kept their fresh initialisation (not in the file): critic_body, value_head" in loaded.summary()


def test_a_flow_policy_checkpoint_initialises_the_sac_flow_actor(tmp_path: Path) -> None:
    """A flow policy's weights (SFT / PPO run) load into SAC-Flow's actor, which holds that policy as ``flow``."""
    flow = PolicyConfig(model_type="flow", hidden_sizes=(8,), flow_velocity="gated")
    path, state = _save(tmp_path, flow, seed=1)
    sac = build_offpolicy_policy(SPEC, attrs.evolve(flow, add_q_head=True, add_value_head=False))
    loaded = load_policy_weights(sac, path, field="actor.model.model_path", strict=False)
    now = sac.state_dict()
    actor_keys = [k for k in state if not k.startswith(("critic_body", "value_head"))]
    assert actor_keys and set(loaded.loaded) == {f"flow.{k}" for k in actor_keys}
    for key in actor_keys:
        torch.testing.assert_close(now[f"flow.{key}"], state[key])
    assert "ignored (not in this policy): flow" in loaded.summary()  # the PPO value head and its body


def test_extra_entries_are_ignored(tmp_path: Path) -> None:
    path, _ = _save(tmp_path, PolicyConfig(hidden_sizes=(8,)))
    policy = build_policy(SPEC, PolicyConfig(hidden_sizes=(8,), add_value_head=False))
    loaded = load_policy_weights(policy, path, field="actor.model.model_path", strict=False)
    assert {k.split(".")[0] for k in loaded.ignored} == {"critic_body", "value_head"}
    assert "ignored (not in this policy): critic_body, value_head" in loaded.summary()


def test_a_shape_mismatch_names_the_parameters(tmp_path: Path) -> None:
    path, _ = _save(tmp_path, PolicyConfig(hidden_sizes=(8,)))
    policy = build_policy(SPEC, PolicyConfig(hidden_sizes=(16,)))
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    with pytest.raises(
        ValueError, match=r"actor\.model\.model_path: .*actor_body\.0\.weight \(8, 5\) in the file"
    ):
        load_policy_weights(policy, path, field="actor.model.model_path", strict=False)
    for key, value in policy.state_dict().items():
        torch.testing.assert_close(value, before[key])  # nothing loaded


def test_missing_file_and_unrelated_files_are_errors(tmp_path: Path) -> None:
    policy = build_policy(SPEC, PolicyConfig(hidden_sizes=(8,)))
    with pytest.raises(FileNotFoundError, match=r"actor\.model\.model_path: no policy weights at"):
        load_policy_weights(policy, tmp_path / "model.pt", field="actor.model.model_path", strict=False)
    other = tmp_path / "other.pt"
    torch.save({"encoder.w": torch.zeros(2)}, other)
    with pytest.raises(ValueError, match=r"none of the 1 entries"):
        load_policy_weights(policy, other, field="actor.model.model_path", strict=False)


def test_strict_refuses_missing_entries(tmp_path: Path) -> None:
    path, _ = _save(tmp_path, PolicyConfig(hidden_sizes=(8,), add_value_head=False))
    policy = build_inference_policy(SPEC, PolicyConfig(hidden_sizes=(8,)))
    with pytest.raises(ValueError, match=r"missing \['critic_body"):
        load_policy_weights(policy, path, field="actor.expert.checkpoint", strict=True)


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="model_path"):
        PolicyConfig(model_path=" ")
    with pytest.raises(ValueError, match=r"actor\.expert\.model\.model_path"):
        ExpertConfig(checkpoint="x", model=PolicyConfig(model_path="y"))
