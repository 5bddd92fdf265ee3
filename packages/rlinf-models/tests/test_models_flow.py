"""The flow-matching module (ODE/SDE chains, log-probs, SFT loss) and the flow policy in the PPO trainer."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import torch
from rlinf_core.config import AlgorithmConfig
from rlinf_core.protocols import EnvSpec
from rlinf_models import EmbodiedActorConfig, OptimConfig
from rlinf_models.embodied import EmbodiedPPOTrainer
from rlinf_models.flow import (
    chain_log_prob,
    flow_matching_loss,
    sample_chain,
    sde_sigmas,
    select_denoise_steps,
    timesteps,
)
from rlinf_models.policies import FlowPolicy, PolicyConfig, build_inference_policy, build_policy

SPEC = EnvSpec((5,), "continuous", 2, action_low=(-1.0, -1.0), action_high=(1.0, 1.0))
FLOW = PolicyConfig(model_type="flow", hidden_sizes=(32, 32), num_action_chunks=3, denoising_steps=4)


def _gaussian_field(m: float, s: float) -> Any:
    """The exact marginal velocity of flow matching from ``N(m, s²)`` data to ``N(0, 1)`` noise (openpi's time)."""

    def field(x: torch.Tensor, t: torch.Tensor, cond: Any) -> tuple[torch.Tensor, None]:
        tt = t.view(-1, 1, 1)
        # x_t = t·ε + (1 - t)·a: E[ε - a | x_t] is linear in x_t.
        var = tt**2 + (1 - tt) ** 2 * s**2
        cov = tt - (1 - tt) * s**2
        return -m + cov / var * (x - (1 - tt) * m), None

    return field


def _policy(dtype: torch.dtype = torch.float32, **changes: Any) -> FlowPolicy:
    torch.manual_seed(0)
    policy = build_policy(SPEC, attrs.evolve(FLOW, **changes))
    assert isinstance(policy, FlowPolicy)
    return policy.to(dtype)


# ---------------------------------------------------------------------------------------------- the module
def test_timesteps_run_from_noise_to_actions() -> None:
    assert timesteps(4).tolist() == [1.0, 0.75, 0.5, 0.25, 0.0]
    sigmas = sde_sigmas(4, 0.5, dtype=torch.float64)
    # σ_k = a·sqrt(t/(1-t)); at t = 1 the denominator is 1 - t_1 (finite).
    assert sigmas.tolist() == pytest.approx([0.5 * 2.0, 0.5 * 3**0.5, 0.5, 0.5 * (1 / 3) ** 0.5])


def test_ode_sampling_is_deterministic_euler() -> None:
    field = _gaussian_field(0.7, 0.3)
    noise = torch.randn(16, 2, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    a = sample_chain(field, None, noise, num_steps=5, noise_method="flow_ode")
    b = sample_chain(field, None, noise, num_steps=5, noise_method="flow_ode", generator=torch.Generator())
    assert torch.equal(a.actions, b.actions) and torch.equal(a.chain, b.chain)
    assert a.chain.shape == (16, 6, 2, 3) and torch.equal(a.chain[:, 0], noise)
    assert torch.count_nonzero(a.logprobs) == 0
    x, t = noise, timesteps(5, dtype=torch.float64)
    for k in range(5):
        x = x - (t[k] - t[k + 1]) * field(x, t[k].expand(16), None)[0]
    torch.testing.assert_close(a.actions, x, rtol=0, atol=1e-12)


@pytest.mark.parametrize("joint", [True, False])
def test_flow_sde_has_the_odes_marginal(joint: bool) -> None:
    # Data N(0.7, 0.3²): the exact velocity's ODE pushes N(0, 1) onto it; the SDE must end at the same law.
    m, s, n = 0.7, 0.3, 40_000
    field = _gaussian_field(m, s)
    gen = torch.Generator().manual_seed(0)
    noise = torch.randn(n, 1, 1, dtype=torch.float64, generator=gen)
    ode = sample_chain(field, None, noise, num_steps=50, noise_method="flow_ode").actions
    mask = select_denoise_steps(n, 50, joint=joint, generator=gen)
    sde = sample_chain(
        field,
        None,
        noise,
        num_steps=50,
        noise_method="flow_sde",
        noise_level=0.7,
        denoise_mask=mask,
        generator=gen,
    ).actions
    assert float(ode.mean()) == pytest.approx(m, abs=0.02) and float(ode.std()) == pytest.approx(s, abs=0.02)
    assert float(sde.mean()) == pytest.approx(float(ode.mean()), abs=0.02)
    assert float(sde.std()) == pytest.approx(float(ode.std()), abs=0.02)
    # The SDE really is stochastic: from the same noise it lands elsewhere than the ODE.
    assert float((sde - ode).abs().mean()) > 0.01


def test_chain_log_prob_is_the_sum_of_the_gaussian_transitions() -> None:
    # Against torch.distributions.Normal and the Flow-SDE mean written out for K = 2, a = 0.8.
    field = _gaussian_field(0.2, 0.5)
    gen = torch.Generator().manual_seed(3)
    out = sample_chain(
        field,
        None,
        torch.randn(32, 2, 1, generator=gen, dtype=torch.float64),
        num_steps=2,
        noise_method="flow_sde",
        noise_level=0.8,
        generator=gen,
    )
    expected = torch.zeros(32, 2, 1, dtype=torch.float64)
    for k, (t, delta) in enumerate([(1.0, 0.5), (0.5, 0.5)]):
        x = out.chain[:, k]
        v = field(x, torch.full((32,), t, dtype=torch.float64), None)[0]
        sigma = 0.8 * (t / (1 - 0.5)) ** 0.5
        mean = (x - v * t) * (1 - t + delta) + (x + v * (1 - t)) * (t - delta - sigma**2 * delta / (2 * t))
        normal = torch.distributions.Normal(mean, sigma * delta**0.5)
        expected += normal.log_prob(out.chain[:, k + 1])  # type: ignore[no-untyped-call]
    mask = torch.ones(32, 2, dtype=torch.bool)
    logprobs, _ = chain_log_prob(field, None, out.chain, mask, noise_method="flow_sde", noise_level=0.8)
    torch.testing.assert_close(logprobs, expected)
    torch.testing.assert_close(out.logprobs, expected)


def test_hybrid_sampling_makes_one_step_stochastic_per_row() -> None:
    mask = select_denoise_steps(64, 5, joint=False, generator=torch.Generator().manual_seed(0))
    assert mask.shape == (64, 5) and mask.sum(dim=1).tolist() == [1] * 64
    assert len(set(mask.float().argmax(dim=1).tolist())) > 1
    field = _gaussian_field(0.0, 1.0)
    out = sample_chain(
        field,
        None,
        torch.randn(64, 1, 1),
        num_steps=5,
        noise_method="flow_sde",
        noise_level=0.5,
        denoise_mask=mask,
    )
    # The chain moves off the ODE only at each row's stochastic step.
    t = timesteps(5)
    for k in range(5):
        ode_next = out.chain[:, k] - (t[k] - t[k + 1]) * field(out.chain[:, k], t[k].expand(64), None)[0]
        off = (out.chain[:, k + 1] - ode_next).abs().flatten() > 1e-6
        assert torch.equal(off, mask[:, k])


def test_flow_matching_loss_ignores_masked_entries_and_is_zero_for_the_exact_field() -> None:
    actions = torch.randn(8, 3, 2)
    mask = torch.ones(8, 3, dtype=torch.bool)
    mask[:, 2] = False

    def field(x: torch.Tensor, t: torch.Tensor, cond: torch.Tensor) -> tuple[torch.Tensor, None]:
        return x * cond, None

    cond = torch.tensor(0.3)
    loss = flow_matching_loss(field, cond, actions, mask, generator=torch.Generator().manual_seed(0))
    changed = actions.clone()
    changed[:, 2] += 10.0
    again = flow_matching_loss(field, cond, changed, mask, generator=torch.Generator().manual_seed(0))
    assert loss.ndim == 0 and float(loss) > 0
    torch.testing.assert_close(loss, again)
    # A data set of one point a: the straight-path velocity (x_t - a)/t is exact, the loss is 0.
    point = torch.full((8, 3, 2), 0.5, dtype=torch.float64)

    def exact(x: torch.Tensor, t: torch.Tensor, cond: Any) -> tuple[torch.Tensor, None]:
        return (x - point) / t.view(-1, 1, 1), None

    assert float(flow_matching_loss(exact, None, point, None)) == pytest.approx(0.0, abs=1e-20)


# ---------------------------------------------------------------------------------------------- the policy
@pytest.mark.parametrize(
    ("method", "joint"), [("flow_sde", None), ("flow_sde", True), ("flow_noise", None), ("flow_noise", False)]
)
def test_rollout_and_train_logprobs_agree(method: str, joint: bool | None) -> None:
    for dtype, tol in ((torch.float64, 0.0), (torch.float32, 1e-6)):
        policy = _policy(dtype, noise_method=method, joint_logprob=joint)
        obs = torch.randn(64, 5, dtype=dtype)
        out = policy.act(obs)
        assert out.forward_inputs is not None
        chains, mask = out.forward_inputs["chains"], out.forward_inputs["denoise_mask"]
        assert chains.shape == (64, 5, 3, 2) and torch.equal(chains[:, -1], out.actions)
        assert mask.sum(dim=1).tolist() == [4 if policy.config.flow_joint_logprob else 1] * 64
        logprobs, entropy, values = policy.evaluate(obs, out.actions, out.forward_inputs)
        assert logprobs.shape == entropy.shape == (64, 3, 2) and values.shape == (64, 1)
        torch.testing.assert_close(logprobs, out.logprobs, rtol=0, atol=tol)
        assert bool((logprobs != 0).all())


def test_deterministic_act_is_the_ode_from_zero_noise() -> None:
    policy = _policy()
    obs = torch.randn(8, 5)
    a, b = policy.act(obs, deterministic=True), policy.act(obs, deterministic=True)
    assert torch.equal(a.actions, b.actions) and torch.count_nonzero(a.logprobs) == 0
    assert a.forward_inputs is not None and not bool(a.forward_inputs["denoise_mask"].any())
    logprobs, entropy, _ = policy.evaluate(obs, a.actions, a.forward_inputs)
    assert torch.count_nonzero(logprobs) == 0 and torch.count_nonzero(entropy) == 0
    sampled = policy.act(obs, generator=torch.Generator().manual_seed(0))
    assert not torch.equal(sampled.actions, a.actions)


def test_flow_noise_gradient_reaches_the_noise_head() -> None:
    policy = _policy(noise_method="flow_noise")
    obs = torch.randn(32, 5)
    out = policy.act(obs)
    logprobs, entropy, _ = policy.evaluate(obs, out.actions, out.forward_inputs)
    (logprobs.sum() + entropy.sum()).backward()  # type: ignore[no-untyped-call]
    assert policy.noise_head is not None and policy.noise_body is not None
    for module in (policy.noise_head, policy.noise_body, policy.velocity_head):
        assert any(p.grad is not None and float(p.grad.abs().sum()) > 0 for p in module.parameters())
    _, stds = policy.field(out.forward_inputs["chains"][:, 0], torch.ones(32), policy._features(obs))  # type: ignore[index]
    low, high = FLOW.noise_logvar_range
    assert stds is not None and bool(((stds >= low - 1e-6) & (stds <= high + 1e-6)).all())


def test_flow_sde_entropy_carries_no_gradient_and_there_is_no_noise_head() -> None:
    policy = _policy(noise_method="flow_sde")
    assert policy.noise_head is None
    obs = torch.randn(16, 5)
    out = policy.act(obs)
    _, entropy, _ = policy.evaluate(obs, out.actions, out.forward_inputs)
    assert not entropy.requires_grad


def test_imitation_loss_fits_a_demonstrator() -> None:
    # The demonstrator's chunk is a function of the observation; a few hundred SFT steps make the ODE follow it.
    policy = _policy(hidden_sizes=(64, 64), num_action_chunks=2)
    opt = torch.optim.Adam(policy.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        obs = torch.randn(128, 5, generator=gen)
        target = torch.tanh(obs[:, :2]).unsqueeze(1).expand(-1, 2, -1)
        loss = policy.imitation_loss(obs, target, torch.ones(128, 2))
        opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
    obs = torch.randn(256, 5, generator=gen)
    err = (policy.act(obs, deterministic=True).actions - torch.tanh(obs[:, :2]).unsqueeze(1)).abs().mean()
    assert float(err) < 0.1


def test_the_trainer_recomputes_the_rollouts_logprobs_and_updates() -> None:
    policy = _policy(add_value_head=True)
    t, e = 8, 4
    obs = torch.randn(t * e, 5)
    out = policy.act(obs)
    assert out.forward_inputs is not None
    batch: dict[str, Any] = {
        "obs": obs.view(t, e, 5),
        "actions": out.actions.view(t, e, 3, 2),
        "rewards": torch.rand(t, e, 3),
        "dones": torch.zeros(t + 1, e, 3, dtype=torch.bool),
        "prev_logprobs": out.logprobs.view(t, e, 6),
        "prev_values": torch.randn(t + 1, e, 1),
        "versions": torch.zeros(t, e, dtype=torch.long),
        "forward_inputs": {k: v.view(t, e, *v.shape[1:]) for k, v in out.forward_inputs.items()},
    }
    actor = EmbodiedActorConfig(global_batch_size=16, micro_batch_size=8, optim=OptimConfig(lr=1e-3))
    trainer = EmbodiedPPOTrainer(policy, AlgorithmConfig(update_epoch=1), actor)
    trainer.train_steps = 1  # every sample is stale: the proximal log-probs are recomputed from the chains
    trainer.compute_proximal_logprobs(batch)
    torch.testing.assert_close(batch["proximal_logprobs"], batch["prev_logprobs"], rtol=0, atol=1e-5)
    before = policy.velocity_head.weight.detach().clone()
    metrics = trainer.train(trainer.compute_advantages_and_returns(batch))
    assert "actor/policy_loss" in metrics and "critic/value_loss" in metrics
    assert not torch.equal(before, policy.velocity_head.weight)
    without = {k: v for k, v in batch.items() if k != "forward_inputs"}
    with pytest.raises(ValueError, match="forward_inputs"):
        trainer.train(without)


# ---------------------------------------------------------------------------------------------- config
def test_flow_config_errors_name_the_field() -> None:
    with pytest.raises(ValueError, match="add_q_head"):  # SAC-Flow trains model_type flow, not a VLA
        PolicyConfig(model_type="pi0", add_q_head=True, add_value_head=False)
    with pytest.raises(ValueError, match="joint_logprob"):
        PolicyConfig(model_type="flow", add_q_head=True, add_value_head=False, joint_logprob=False)
    with pytest.raises(ValueError, match="noise_logvar_range"):
        PolicyConfig(model_type="flow", noise_logvar_range=(0.2, 0.1))
    with pytest.raises(ValueError, match="time_embed_dim"):
        PolicyConfig(model_type="flow", time_embed_dim=7)
    with pytest.raises(ValueError, match="noise_level"):
        PolicyConfig(model_type="flow", noise_level=0.0)
    with pytest.raises(ValueError, match="denoising_steps"):
        PolicyConfig(model_type="flow", denoising_steps=0)
    with pytest.raises(ValueError, match=r"model_type 'flow' needs continuous actions"):
        build_policy(EnvSpec((3,), "discrete", 1, num_actions=2), FLOW)
    with pytest.raises(ValueError, match=r"model_type 'flow' cannot encode images"):
        build_policy(EnvSpec((36, 36, 3), "continuous", 2, obs_dtype="uint8"), FLOW)
    assert isinstance(build_inference_policy(SPEC, FLOW), FlowPolicy)
    assert PolicyConfig(noise_method="flow_noise").flow_joint_logprob
    assert not PolicyConfig(noise_method="flow_sde").flow_joint_logprob
