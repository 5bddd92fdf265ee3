from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from rlinf_core.protocols import EnvSpec
from rlinf_models.policies import PolicyConfig, build_policy

DISCRETE = EnvSpec((4,), "discrete", 1, num_actions=3)
CONTINUOUS = EnvSpec((5,), "continuous", 2, action_low=(-1.0, -1.0), action_high=(1.0, 1.0))


@pytest.mark.parametrize("spec", [DISCRETE, CONTINUOUS])
@pytest.mark.parametrize("chunks", [1, 3])
def test_act_and_evaluate_agree(spec: EnvSpec, chunks: int) -> None:
    torch.manual_seed(0)
    policy = build_policy(spec, PolicyConfig(num_action_chunks=chunks, hidden_sizes=(16,)))
    obs = torch.randn(6, *spec.obs_shape)
    out = policy.act(obs)
    d = spec.action_dim
    expected_actions = (6, chunks) if spec.action_type == "discrete" else (6, chunks, d)
    assert out.actions.shape == expected_actions
    assert out.logprobs.shape == (6, chunks, d) and out.values.shape == (6, 1)
    logprobs, entropy, values = policy.evaluate(obs, out.actions)
    torch.testing.assert_close(logprobs, out.logprobs)
    torch.testing.assert_close(values, out.values)
    assert entropy.shape == (6, chunks, d) and (entropy > 0).all()


def test_gradients_reach_actor_and_critic() -> None:
    policy = build_policy(CONTINUOUS)
    obs = torch.randn(8, 5)
    out = policy.act(obs)
    logprobs, entropy, values = policy(obs, out.actions)
    (logprobs.sum() + entropy.sum() + values.sum()).backward()
    assert policy.log_std is not None and policy.log_std.grad is not None
    assert all(p.grad is not None for p in policy.parameters())


def test_deterministic_discrete_is_argmax() -> None:
    policy = build_policy(DISCRETE)
    obs = torch.randn(4, 4)
    a1 = policy.act(obs, deterministic=True).actions
    a2 = policy.act(obs, deterministic=True).actions
    assert torch.equal(a1, a2)
    assert torch.equal(a1[:, 0], policy.distribution(obs).probs[:, 0].argmax(-1))


def test_cnn_on_images() -> None:
    spec = EnvSpec((64, 64, 3), "discrete", 1, num_actions=4)
    policy = build_policy(spec, PolicyConfig(model_type="cnn", hidden_sizes=(32,)))
    obs = torch.randint(0, 255, (2, 64, 64, 3), dtype=torch.uint8)
    out = policy.act(obs)
    assert out.actions.shape == (2, 1) and out.values.shape == (2, 1)


def test_shape_mismatch_is_explained() -> None:
    with pytest.raises(
        ValueError, match=r"model_type 'mlp' cannot encode images \['obs'\] \(shapes \[\[8, 8, 3\]\]\)"
    ):
        build_policy(EnvSpec((8, 8, 3), "discrete", 1, num_actions=2, obs_dtype="uint8"))
    with pytest.raises(ValueError, match="'cnn' needs image observations"):
        build_policy(DISCRETE, PolicyConfig(model_type="cnn"))


def test_no_value_head_returns_zeros() -> None:
    policy = build_policy(DISCRETE, PolicyConfig(add_value_head=False))
    assert torch.equal(policy.value(torch.randn(3, 4)), torch.zeros(3, 1))


def test_configs_import_without_torch() -> None:
    # The driver reads the configs before Ray starts the workers; torch (seconds) loads only with the models.
    code = (
        "import sys; from rlinf_models import EmbodiedActorConfig; from rlinf_models.policies import PolicyConfig; "
        "assert 'torch' not in sys.modules, 'configs imported torch'; "
        "from rlinf_models.policies import build_policy; assert 'torch' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def _masked_reference(per_step: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    total, count = torch.zeros(()), 0
    for b in range(per_step.shape[0]):
        for c in range(per_step.shape[1]):
            if mask[b, c]:
                total = total + per_step[b, c]
                count += 1
    return total / count


@pytest.mark.parametrize("kind", ["mse", "nll"])
def test_imitation_loss_is_the_masked_mean_over_real_steps(kind: str) -> None:
    torch.manual_seed(0)
    policy = build_policy(
        CONTINUOUS, PolicyConfig(num_action_chunks=3, hidden_sizes=(8,), imitation_loss=kind)
    )  # type: ignore[arg-type]
    obs, actions = torch.randn(4, 5), torch.randn(4, 3, 2)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]], dtype=torch.bool)
    dist = policy.distribution(obs)
    per_step = (dist.mean - actions).pow(2).mean(-1) if kind == "mse" else -dist.log_prob(actions).sum(-1)
    loss = policy.imitation_loss(obs, actions, mask)
    torch.testing.assert_close(loss, _masked_reference(per_step, mask))
    padded = actions.clone()
    padded[1, 2] = padded[2, 1:] = 100.0  # padding never counts
    torch.testing.assert_close(policy.imitation_loss(obs, padded, mask), loss)
    loss.backward()
    assert policy.log_std is not None and (policy.log_std.grad is not None) == (kind == "nll")


def test_imitation_loss_discrete_and_shape_errors() -> None:
    torch.manual_seed(0)
    policy = build_policy(DISCRETE, PolicyConfig(num_action_chunks=2, hidden_sizes=(8,)))
    obs = torch.randn(3, 4)
    actions = torch.tensor([[0, 2], [1, 1], [2, 0]]).unsqueeze(-1)
    mask = torch.ones(3, 2, dtype=torch.bool)
    logits = policy.distribution(obs).logits
    want = torch.nn.functional.cross_entropy(logits.reshape(-1, 3), actions.reshape(-1))
    torch.testing.assert_close(policy.imitation_loss(obs, actions.float(), mask), want)
    with pytest.raises(ValueError, match=r"actions must be \[B, 2, 1\]"):
        policy.imitation_loss(obs, actions[:, :1], mask)
