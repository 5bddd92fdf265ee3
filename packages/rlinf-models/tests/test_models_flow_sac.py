"""SAC-Flow: the flow policy as SAC's actor (reparameterised chains, the noisy chain's log-prob, the trainer)."""

from __future__ import annotations

import attrs
import pytest
import torch
from rlinf_core.config import AlgorithmConfig, EntropyTuningConfig, ReplayBufferConfig
from rlinf_core.protocols import EnvSpec
from rlinf_models import EmbodiedActorConfig, OptimConfig
from rlinf_models.flow import rsample_chain, sample_chain
from rlinf_models.offpolicy import SACTrainer
from rlinf_models.policies import FlowSACPolicy, PolicyConfig, build_inference_policy

SPEC = EnvSpec((3,), "continuous", 2, action_low=(-2.0, -1.0), action_high=(2.0, 1.0))


def _config(**kw: object) -> PolicyConfig:
    base: dict[str, object] = {
        "model_type": "flow",
        "add_q_head": True,
        "add_value_head": False,
        "hidden_sizes": (32, 32),
        "num_action_chunks": 2,
        "denoising_steps": 3,
        "flow_velocity": "gated",
    }
    base.update(kw)
    return PolicyConfig(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize("noise_method", ["flow_sde", "flow_noise"])
@pytest.mark.parametrize("velocity", ["mlp", "gated"])
def test_logprob_of_sampled_action_equals_chain_logprob(noise_method: str, velocity: str) -> None:
    torch.manual_seed(0)
    policy = FlowSACPolicy(SPEC, _config(noise_method=noise_method, flow_velocity=velocity))
    obs = torch.randn(5, 3)
    noise = torch.randn(5, *policy.noise_shape)
    action, logp, chain = policy.sample_chain(obs, noise=noise)
    assert action.shape == logp.shape == (5, 2, 2)
    assert chain.shape == (5, 4, 2, 2)
    torch.testing.assert_close(chain[:, 0], noise[:, 0])
    torch.testing.assert_close(torch.tanh(chain[:, -1]), action)
    torch.testing.assert_close(policy.log_prob(obs, chain.detach()), logp)
    # forward (what the trainer calls) is the same draw
    a2, l2 = policy(obs, noise=noise)
    torch.testing.assert_close(a2, action)
    torch.testing.assert_close(l2, logp)


def test_reparameterised_chain_matches_the_sampler_statistics() -> None:
    """``rsample_chain``'s step log-densities are those of ``sample_chain``'s own chain recomputed."""
    torch.manual_seed(1)
    policy = FlowSACPolicy(SPEC, _config())
    features = policy.flow._features(torch.randn(4, 3))
    noise = torch.randn(4, *policy.noise_shape)
    out = rsample_chain(policy.flow.field, features, noise, noise_method="flow_sde", noise_level=0.5)
    assert bool(out.denoise_mask.all())
    ode = sample_chain(policy.flow.field, features, noise[:, 0], num_steps=3, noise_method="flow_ode")
    det = rsample_chain(policy.flow.field, features, noise, noise_method="flow_ode")
    torch.testing.assert_close(det.actions, ode.actions)
    assert not bool(det.denoise_mask.any())


def test_gradients_reach_the_velocity_network_through_the_sampler() -> None:
    torch.manual_seed(2)
    policy = FlowSACPolicy(SPEC, _config(noise_method="flow_sde"))
    action, logp = policy(torch.randn(6, 3))
    action.sum().backward(retain_graph=True)
    for name in ("velocity_head", "gate_head"):
        grad = getattr(policy.flow, name).weight.grad
        assert grad is not None and float(grad.abs().sum()) > 0, name
    first = next(policy.flow.velocity_body.parameters()).grad
    assert first is not None and float(first.abs().sum()) > 0
    policy.zero_grad()
    logp.sum().backward()  # the tanh correction of the chain's end depends on every step
    grad = policy.flow.velocity_head.weight.grad
    assert grad is not None and float(grad.abs().sum()) > 0


def test_deterministic_and_act_are_in_bounds() -> None:
    policy = FlowSACPolicy(SPEC, _config())
    obs = torch.randn(7, 3)
    a, logp = policy(obs, deterministic=True)
    torch.testing.assert_close(a, policy(obs, deterministic=True)[0])
    assert float(logp.abs().sum()) == 0.0
    out = policy.act(obs)
    low, high = torch.tensor(SPEC.action_low), torch.tensor(SPEC.action_high)
    assert bool(((out.actions >= low) & (out.actions <= high)).all())
    torch.testing.assert_close(policy.from_env(policy.to_env(a)), a)
    assert isinstance(build_inference_policy(SPEC, _config()), FlowSACPolicy)
    assert policy.random_actions(3).shape == (3, 2, 2)


def test_config_validation_names_the_field() -> None:
    with pytest.raises(ValueError, match="joint_logprob"):
        _config(joint_logprob=False)
    with pytest.raises(ValueError, match="flow_velocity"):
        PolicyConfig(flow_velocity="gated")
    with pytest.raises(ValueError, match="add_q_head"):
        PolicyConfig(model_type="pi0", add_q_head=True, add_value_head=False)
    assert _config(joint_logprob=True).flow_joint_logprob


def _trainer(seed: int = 0) -> SACTrainer:
    torch.manual_seed(seed)
    model = _config(num_action_chunks=1)
    actor = EmbodiedActorConfig(
        model=model, optim=OptimConfig(lr=3e-3, clip_grad=None), global_batch_size=32, micro_batch_size=32
    )
    algorithm = AlgorithmConfig(
        adv_type="embodied_sac",
        loss_type="embodied_sac",
        replay_buffer=ReplayBufferConfig(cache_size=1000, min_buffer_size=32),
        entropy_tuning=EntropyTuningConfig(alpha_type="fixed_alpha", initial_alpha=0.05),
    )
    policy = FlowSACPolicy(SPEC, model)
    return SACTrainer(policy, SPEC, actor, algorithm)


def test_actor_loss_falls_on_a_fixed_batch() -> None:
    trainer = _trainer()
    obs = torch.randn(32, 3)
    actor_losses = []
    for _ in range(60):
        out, _ = trainer._actor_step(obs)
        actor_losses.append(float(out["sac/actor_loss"]))
    assert sum(actor_losses[-10:]) / 10 < sum(actor_losses[:10]) / 10


def test_trainer_updates_from_a_replay_buffer() -> None:
    trainer = _trainer(3)
    t, e = 8, 4
    traj = {
        "obs": torch.randn(t, e, 3),
        "next_obs": torch.randn(t, e, 3),
        "actions": torch.rand(t, e, 1, 2) * 2 - 1,
        "rewards": torch.randn(t, e, 1),
        "terminations": torch.zeros(t, e, 1, dtype=torch.bool),
    }
    assert trainer.add_trajectory(traj) == 32
    before = [p.detach().clone() for p in trainer.policy.parameters()]
    metrics = trainer.update(3)
    assert metrics["sac/num_updates"] == 3.0
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values())
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.policy.parameters(), strict=True))


def test_noise_shape_follows_the_chain() -> None:
    trainer = _trainer()
    assert trainer._noise().shape == (32, 4, 1, 2)
    assert attrs.evolve(_config(), denoising_steps=5).denoising_steps == 5
