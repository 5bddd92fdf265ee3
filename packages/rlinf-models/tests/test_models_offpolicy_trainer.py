"""The SAC-family trainer: shapes, soft target updates, temperature types, CrossQ and TD3 paths, exact state."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Literal

import attrs
import pytest
import torch
from rlinf_algos.offpolicy import soft_target_update
from rlinf_core.config import AlgorithmConfig, DemoBufferConfig, EntropyTuningConfig, ReplayBufferConfig
from rlinf_core.protocols import EnvSpec
from rlinf_models import EmbodiedActorConfig, OptimConfig
from rlinf_models.actor import adamw
from rlinf_models.offpolicy import SACTrainer
from rlinf_models.policies import (
    BatchRenorm1d,
    PolicyConfig,
    QEnsemble,
    SquashedGaussianPolicy,
    build_inference_policy,
)

SPEC = EnvSpec((3,), "continuous", 2, action_low=(-2.0, 0.0), action_high=(2.0, 1.0))
MODEL = PolicyConfig(hidden_sizes=(16,), add_value_head=False, add_q_head=True, num_action_chunks=2)
ACTOR = EmbodiedActorConfig(
    model=MODEL, optim=OptimConfig(lr=1e-3, clip_grad=None), global_batch_size=8, micro_batch_size=8
)


def _alg(**kw: Any) -> AlgorithmConfig:
    kw.setdefault("replay_buffer", ReplayBufferConfig(cache_size=64, min_buffer_size=8))
    return AlgorithmConfig(loss_type="embodied_sac", adv_type="embodied_sac", **kw)


def _trainer(alg: AlgorithmConfig, model: PolicyConfig = MODEL) -> SACTrainer:
    torch.manual_seed(0)
    actor = attrs.evolve(ACTOR, model=model)
    return SACTrainer(SquashedGaussianPolicy(SPEC, model), SPEC, actor, alg)


def _fill(tr: SACTrainer, n: int = 16, *, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    c = tr.policy.chunks
    traj = {
        "obs": torch.randn(n, 1, 3, generator=g),
        "next_obs": torch.randn(n, 1, 3, generator=g),
        "actions": tr.policy.to_env(torch.rand(n, 1, c, 2, generator=g) * 2 - 1),
        "rewards": torch.randn(n, 1, c, generator=g),
        "terminations": torch.rand(n, 1, c, generator=g) < 0.1,
    }
    assert tr.add_trajectory(traj) == n


def test_policy_and_critic_shapes() -> None:
    policy = build_inference_policy(SPEC, MODEL)
    assert isinstance(policy, SquashedGaussianPolicy)
    obs = torch.randn(5, 3)
    out = policy.act(obs)
    assert out.actions.shape == (5, 2, 2) and out.logprobs.shape == (5, 2, 2) and out.values.shape == (5, 1)
    low, high = torch.tensor(SPEC.action_low), torch.tensor(SPEC.action_high)
    assert ((out.actions >= low) & (out.actions <= high)).all()
    norm = policy.from_env(out.actions)
    assert torch.allclose(policy.to_env(norm), out.actions, atol=1e-5)
    rand = policy.random_actions(200)
    assert ((rand >= low) & (rand <= high)).all() and rand[..., 0].min() < -1.0
    q = QEnsemble(SPEC, attrs.evolve(MODEL, num_q_heads=3, q_layer_norm=True))
    assert q(obs, norm).shape == (5, 3)
    assert any(isinstance(m, torch.nn.LayerNorm) for m in q.modules())


def test_sac_config_conflicts_are_refused() -> None:
    with pytest.raises(ValueError, match="add_value_head"):
        PolicyConfig(add_q_head=True)
    with pytest.raises(ValueError, match="continuous"):
        SquashedGaussianPolicy(EnvSpec((3,), "discrete", 1, num_actions=2), MODEL)
    with pytest.raises(ValueError, match="adv_type"):
        AlgorithmConfig(loss_type="embodied_sac")
    with pytest.raises(ValueError, match="embodied_sac"):
        AlgorithmConfig(loss_type="sac", adv_type="embodied_sac")


def test_no_update_before_min_buffer_size() -> None:
    tr = _trainer(_alg(replay_buffer=ReplayBufferConfig(cache_size=64, min_buffer_size=32)))
    _fill(tr, 16)
    before = copy.deepcopy(tr.critic.state_dict())
    m = tr.update(5)
    assert m["sac/num_updates"] == 0.0 and m["replay_buffer/size"] == 16.0
    assert all(torch.equal(before[k], v) for k, v in tr.critic.state_dict().items())
    _fill(tr, 16, seed=1)
    m = tr.update(3)
    assert m["sac/num_updates"] == 3.0 and tr.update_steps == 3 and tr.train_steps == 2


def test_soft_target_update_uses_tau() -> None:
    tr = _trainer(_alg(tau=0.25))
    _fill(tr)
    assert tr.target_critic is not None
    old_target = [p.detach().clone() for p in tr.target_critic.parameters()]
    tr.update(1)
    for old, new, online in zip(
        old_target, tr.target_critic.parameters(), tr.critic.parameters(), strict=True
    ):
        assert torch.allclose(new, 0.75 * old + 0.25 * online.detach(), atol=1e-6)
    tr2 = _trainer(_alg(tau=0.25, target_update_freq=2))
    _fill(tr2)
    assert tr2.target_critic is not None
    start = [p.detach().clone() for p in tr2.target_critic.parameters()]
    tr2.update(1)  # first critic step: no target update yet
    assert all(torch.equal(a, b) for a, b in zip(start, tr2.target_critic.parameters(), strict=True))


@pytest.mark.parametrize("alpha_type", ["softplus", "exp", "fixed_alpha"])
def test_temperature_types(alpha_type: str) -> None:
    tuning = EntropyTuningConfig(alpha_type=alpha_type, initial_alpha=0.2)  # type: ignore[arg-type]
    tr = _trainer(_alg(entropy_tuning=tuning))
    assert tr.alpha().item() == pytest.approx(0.2, rel=1e-5)
    _fill(tr)
    m = tr.update(4)
    if alpha_type == "fixed_alpha":
        assert tr.alpha_optimizer is None and "sac/alpha_loss" not in m
        assert tr.alpha().item() == pytest.approx(0.2, rel=1e-6)
    else:
        assert "sac/alpha_loss" in m and tr.alpha().item() != pytest.approx(0.2, rel=1e-6)
    assert tr.target_entropy == -4.0  # chunks x action dims


def test_critic_actor_ratio() -> None:
    tr = _trainer(_alg(critic_actor_ratio=2))
    _fill(tr)
    policy_before = copy.deepcopy(tr.policy.state_dict())
    tr.update(1)
    assert all(torch.equal(policy_before[k], v) for k, v in tr.policy.state_dict().items())
    tr.update(1)
    assert not all(torch.equal(policy_before[k], v) for k, v in tr.policy.state_dict().items())


def test_crossq_has_no_target_and_renormalises() -> None:
    tr = _trainer(_alg(q_head_type="crossq", bootstrap_type="always"))
    assert tr.target_critic is None
    brn = [m for m in tr.critic.modules() if isinstance(m, BatchRenorm1d)]
    assert brn
    _fill(tr)
    m = tr.update(3)
    assert m["sac/num_updates"] == 3.0 and torch.isfinite(torch.tensor(m["sac/critic_loss"]))
    assert int(brn[0].steps) == 3  # one joint training forward per critic step, none from the actor step
    assert not torch.equal(brn[0].running_mean, torch.zeros_like(brn[0].running_mean))


def test_td3_smoothing_and_redq_subsets_run() -> None:
    tr = _trainer(_alg(target_policy_noise=0.2))
    _fill(tr)
    assert tr.update(2)["sac/num_updates"] == 2.0
    tr = _trainer(
        _alg(critic_subsample_size=2, actor_agg_q="mean", backup_entropy=False),
        attrs.evolve(MODEL, num_q_heads=5),
    )
    _fill(tr)
    assert tr.update(2)["sac/num_updates"] == 2.0


def test_utd_ratio_sets_the_number_of_updates() -> None:
    assert _trainer(_alg(update_epoch=3)).updates_for(40) == 3
    assert _trainer(_alg(utd_ratio=0.5)).updates_for(40) == 20
    assert _trainer(_alg(utd_ratio=0.01)).updates_for(40) == 1


def test_state_round_trip_continues_exactly() -> None:
    a = _trainer(_alg())
    _fill(a)
    a.update(3)
    b = _trainer(_alg(replay_buffer=ReplayBufferConfig(cache_size=64, min_buffer_size=8, seed=7)))
    b.policy.load_state_dict(a.policy.state_dict())
    b.load_critic_state_dict(copy.deepcopy(a.critic_state_dict()))
    b.load_optimizer_state_dict(copy.deepcopy(a.optimizer_state_dict()))
    b.load_counters(copy.deepcopy(a.counters()))
    rng = torch.get_rng_state()
    ma = a.update(3)
    torch.set_rng_state(rng)
    mb = b.update(3)
    assert ma == mb
    for x, y in ((a.policy, b.policy), (a.critic, b.critic), (a.target_critic, b.target_critic)):
        assert x is not None and y is not None
        assert all(torch.equal(v, y.state_dict()[k]) for k, v in x.state_dict().items())
    assert torch.equal(a.alpha_param, b.alpha_param)


def test_demo_buffer_gives_half_of_each_batch(tmp_path: Path) -> None:
    demo_src = _trainer(_alg())
    _fill(demo_src, 12, seed=5)
    demo_src.buffer.save(tmp_path / "demo.pt")
    alg = _alg(demo_buffer=DemoBufferConfig(load_path=str(tmp_path / "demo.pt"), min_buffer_size=12))
    tr = _trainer(alg)
    assert tr.demo_buffer is not None and len(tr.demo_buffer) == 12
    assert tr.update(2)["sac/num_updates"] == 0.0  # the online buffer is still empty
    _fill(tr, 16)
    batch = tr.sampler.sample(8)
    demo_obs = demo_src.buffer.contents()["obs"]
    from_demo = [any(torch.equal(row, d) for d in demo_obs) for row in batch["obs"]]
    assert from_demo == [False] * 4 + [True] * 4
    assert tr.update(2)["sac/num_updates"] == 2.0
    state = copy.deepcopy(tr.counters())
    tr2 = _trainer(alg)
    tr2.load_counters(state)
    assert tr2.demo_buffer is not None
    assert torch.equal(tr2.demo_buffer.sample(5)["obs"], tr.demo_buffer.sample(5)["obs"])


def test_cnn_encoder_for_image_observations() -> None:
    spec = EnvSpec((36, 36, 3), "continuous", 2, action_low=(-1.0, -1.0), action_high=(1.0, 1.0))
    model = PolicyConfig(model_type="cnn", hidden_sizes=(16,), add_value_head=False, add_q_head=True)
    actor = attrs.evolve(ACTOR, model=model)
    tr = SACTrainer(SquashedGaussianPolicy(spec, model), spec, actor, _alg())
    n = 10
    tr.add_trajectory(
        {
            "obs": torch.randint(0, 255, (n, 1, 36, 36, 3), dtype=torch.uint8),
            "next_obs": torch.randint(0, 255, (n, 1, 36, 36, 3), dtype=torch.uint8),
            "actions": torch.rand(n, 1, 1, 2) * 2 - 1,
            "rewards": torch.randn(n, 1, 1),
            "terminations": torch.zeros(n, 1, 1, dtype=torch.bool),
        }
    )
    assert tr.buffer.sample(3)["obs"].dtype == torch.uint8  # images stay uint8 in the buffer
    assert tr.update(2)["sac/num_updates"] == 2.0


def _looped(q: QEnsemble) -> QEnsemble:
    """A copy of ``q`` that computes its heads one by one (the reference for the batched path)."""
    ref = copy.deepcopy(q)
    ref.batched_heads = False
    return ref


@pytest.mark.parametrize(
    ("heads", "hidden", "activation"),
    [(2, (256, 256), "relu"), (3, (16, 8, 4), "tanh"), (5, (16,), "relu"), (2, (), "relu")],
)
def test_batched_q_heads_match_the_loop_over_heads(
    heads: int, hidden: tuple[int, ...], activation: Literal["tanh", "relu", "gelu"]
) -> None:
    torch.manual_seed(0)
    model = attrs.evolve(MODEL, num_q_heads=heads, hidden_sizes=hidden, activation=activation)
    q = QEnsemble(SPEC, model)
    assert not q.batched_heads  # opt-in
    q.batched_heads = True
    ref = _looped(q)
    obs = torch.randn(64, 3)
    actions = (torch.rand(64, 2, 2) * 2 - 1).requires_grad_(True)
    ref_actions = actions.detach().clone().requires_grad_(True)
    out, want = q(obs, actions), ref(obs, ref_actions)
    assert out.shape == want.shape == (64, heads)
    assert torch.allclose(out, want, atol=1e-6, rtol=1e-6)
    weights = torch.randn(64, heads)
    (out * weights).sum().backward()
    (want * weights).sum().backward()
    assert actions.grad is not None and ref_actions.grad is not None
    assert torch.allclose(actions.grad, ref_actions.grad, atol=1e-6, rtol=1e-6)
    for (name, p), r in zip(q.named_parameters(), ref.parameters(), strict=True):
        assert p.grad is not None and r.grad is not None, name
        assert torch.allclose(p.grad, r.grad, atol=1e-6, rtol=1e-6), name


def test_q_heads_keep_their_layout_and_loop_where_batching_does_not_apply() -> None:
    q = QEnsemble(SPEC, attrs.evolve(MODEL, hidden_sizes=(16, 8)))
    # the checkpoint layout of the looped heads: checkpoints of either path load into the other
    assert [k for k in q.state_dict() if k.startswith("heads.0.")] == [
        "heads.0.0.weight",
        "heads.0.0.bias",
        "heads.0.2.weight",
        "heads.0.2.bias",
        "heads.0.4.weight",
        "heads.0.4.bias",
    ]
    _looped(q).load_state_dict(q.state_dict())
    for q in (
        QEnsemble(SPEC, attrs.evolve(MODEL, q_layer_norm=True)),
        QEnsemble(SPEC, MODEL, batch_renorm=True),
        QEnsemble(SPEC, attrs.evolve(MODEL, num_q_heads=1)),
    ):
        q.batched_heads = True  # the loop all the same
        assert not q._batchable
        assert torch.equal(
            q(torch.zeros(4, 3), torch.zeros(4, 2, 2)), _looped(q)(torch.zeros(4, 3), torch.zeros(4, 2, 2))
        )


def _reference_step(tr: SACTrainer) -> None:
    """The trainer as it was before its step was made faster: looped heads, for-loop AdamW, pairwise update."""
    optim = ACTOR.optim
    tr.actor_optimizer = adamw(tr.policy.parameters(), optim)  # torch's default: a for-loop on the CPU
    tr.critic_optimizer = adamw(tr.critic.parameters(), optim)
    assert tr.target_critic is not None
    tr.critic.batched_heads = tr.target_critic.batched_heads = False
    target = tr.target_critic

    def pairwise() -> None:
        for t, s in zip(target.parameters(), tr.critic.parameters(), strict=True):
            soft_target_update([t], [s], tau=tr.algorithm.tau)

    tr._target_update = pairwise  # type: ignore[method-assign]


@pytest.mark.parametrize("hidden", [(16,), (32, 32)])
def test_fast_step_is_the_reference_step(hidden: tuple[int, ...]) -> None:
    model = attrs.evolve(MODEL, hidden_sizes=hidden)
    fast, ref = _trainer(_alg(tau=0.1), model), _trainer(_alg(tau=0.1), model)
    assert all(g["fused"] for o in (fast.actor_optimizer, fast.critic_optimizer) for g in o.param_groups)
    _reference_step(ref)
    _fill(fast)
    _fill(ref)
    rng = torch.get_rng_state()
    mf = fast.update(5)
    torch.set_rng_state(rng)
    mr = ref.update(5)
    assert mf.keys() == mr.keys()
    assert all(mf[k] == pytest.approx(mr[k], abs=1e-6) for k in mf)
    for x, y in (
        (fast.policy, ref.policy),
        (fast.critic, ref.critic),
        (fast.target_critic, ref.target_critic),
    ):
        assert x is not None and y is not None
        for k, v in x.state_dict().items():
            assert torch.allclose(v, y.state_dict()[k], atol=1e-6, rtol=0), k


def test_target_update_is_bitwise_the_pairwise_update() -> None:
    tr = _trainer(_alg(tau=0.3))
    assert tr.target_critic is not None
    with torch.no_grad():
        for p in tr.critic.parameters():
            p.add_(torch.randn_like(p))
    want = copy.deepcopy(tr.target_critic)
    soft_target_update(want.parameters(), tr.critic.parameters(), tau=0.3)
    tr._target_update()
    assert all(
        torch.equal(a, b) for a, b in zip(tr.target_critic.parameters(), want.parameters(), strict=True)
    )


def test_optimizer_state_of_a_for_loop_adamw_loads_and_stays_fused() -> None:
    old = _trainer(_alg())
    _reference_step(old)  # what a checkpoint written before the fused optimizer holds
    _fill(old)
    old.update(3)
    state = copy.deepcopy(old.optimizer_state_dict())
    assert not any(g["fused"] for g in state["critic"]["param_groups"])
    new = _trainer(_alg())
    new.load_critic_state_dict(copy.deepcopy(old.critic_state_dict()))
    new.policy.load_state_dict(old.policy.state_dict())
    new.load_optimizer_state_dict(state)
    for opt in (new.actor_optimizer, new.critic_optimizer):
        assert all(g["fused"] for g in opt.param_groups)
    for opt_new, opt_old in (
        (new.actor_optimizer, old.actor_optimizer),
        (new.critic_optimizer, old.critic_optimizer),
    ):
        for p_new, p_old in zip(
            opt_new.param_groups[0]["params"], opt_old.param_groups[0]["params"], strict=True
        ):
            for key in ("step", "exp_avg", "exp_avg_sq"):
                assert torch.equal(opt_new.state[p_new][key], opt_old.state[p_old][key])
    new.load_counters(copy.deepcopy(old.counters()))
    rng = torch.get_rng_state()
    mn = new.update(2)
    torch.set_rng_state(rng)
    mo = old.update(2)
    assert all(mn[k] == pytest.approx(mo[k], abs=1e-6) for k in mn)
