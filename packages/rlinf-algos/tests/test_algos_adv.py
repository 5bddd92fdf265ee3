"""Pure advantage functions: loop references, properties, numpy == torch, gradients, bad shapes."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import array_api_strict as xs
import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from rlinf_algos import _advantages, gae, grpo, grpo_dynamic, grpo_video, opd, raw, reinpp, safe_normalize

_spec = importlib.util.spec_from_file_location("_adv_refs", Path(__file__).with_name("_adv_refs.py"))
assert _spec is not None and _spec.loader is not None
ref = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ref)

TOL = {"rtol": 1e-5, "atol": 1e-5}
FAST = settings(max_examples=40, deadline=None)


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def t(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x))


def right_padded_mask(g: np.random.Generator, length: int, batch: int) -> np.ndarray:
    lens = g.integers(1, length + 1, size=batch)
    return np.arange(length)[:, None] < lens[None, :]


# ----------------------------------------------------------------------------------------------- GAE


@pytest.mark.parametrize("critic", [True, False])
@pytest.mark.parametrize("with_dones", [True, False])
@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("T", [1, 13, 70])  # 70 steps of B=6 span two scan blocks
def test_gae_matches_loop_reference(critic: bool, with_dones: bool, normalize: bool, T: int) -> None:
    g = rng(1)
    B = 6
    r = g.normal(size=(T, B)).astype(np.float32)
    v = g.normal(size=(T + 1, B)).astype(np.float32) if critic else None
    d = (g.random((T + 1, B)) < 0.2) if with_dones else None
    m = g.random((T, B)) < 0.7
    adv, ret = gae(
        t(r),
        None if v is None else t(v),
        None if d is None else t(d),
        gamma=0.97,
        gae_lambda=0.9,
        normalize_advantages=normalize,
        normalize_returns=normalize,
        loss_mask=t(m),
    )
    ref_adv, ref_ret = ref.gae(r, v, d, 0.97, 0.9, normalize, normalize, m)
    np.testing.assert_allclose(adv.numpy(), ref_adv, **TOL)
    np.testing.assert_allclose(ret.numpy(), ref_ret, **TOL)


@pytest.mark.parametrize("block_elements", [1, 12, 25])
def test_gae_block_boundaries_do_not_change_results(
    block_elements: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    g = rng(13)
    T, B = 11, 6
    r, v = g.normal(size=(T, B)).astype(np.float32), g.normal(size=(T + 1, B)).astype(np.float32)
    d = g.random((T + 1, B)) < 0.2
    one_block = gae(t(r), t(v), t(d), gamma=0.9, gae_lambda=0.7, normalize_advantages=False)
    monkeypatch.setattr(_advantages, "SCAN_BLOCK_ELEMENTS", block_elements)  # 1, 2 and 4 rows per block
    blocked = gae(t(r), t(v), t(d), gamma=0.9, gae_lambda=0.7, normalize_advantages=False)
    for a, b in zip(one_block, blocked, strict=True):
        assert torch.equal(a, b)
    np.testing.assert_allclose(blocked[0].numpy(), ref.gae(r, v, d, 0.9, 0.7)[0], **TOL)


@FAST
@given(
    T=st.integers(1, 12),
    B=st.integers(1, 5),
    gamma=st.floats(0.5, 1.0),
    seed=st.integers(0, 2**16),
    terminal=st.booleans(),
)
def test_gae_lambda_one_is_discounted_return_minus_value(
    T: int, B: int, gamma: float, seed: int, terminal: bool
) -> None:
    g = rng(seed)
    r = g.normal(size=(T, B))
    v = g.normal(size=(T + 1, B))
    d = np.zeros((T + 1, B), bool)
    d[-1] = terminal
    adv, ret = gae(r, v, d, gamma=gamma, gae_lambda=1.0, normalize_advantages=False)
    for s in range(T):
        disc = sum(gamma**k * r[s + k] for k in range(T - s))
        bootstrap = 0.0 if terminal else gamma ** (T - s) * v[T]
        np.testing.assert_allclose(adv[s], disc + bootstrap - v[s], rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(ret[s], disc + bootstrap, rtol=1e-9, atol=1e-9)


@FAST
@given(T=st.integers(1, 10), B=st.integers(1, 4), gamma=st.floats(0.0, 1.0), seed=st.integers(0, 2**16))
def test_gae_lambda_zero_is_one_step_td_error(T: int, B: int, gamma: float, seed: int) -> None:
    g = rng(seed)
    r, v = g.normal(size=(T, B)), g.normal(size=(T + 1, B))
    d = g.random((T + 1, B)) < 0.3
    adv, _ = gae(r, v, d, gamma=gamma, gae_lambda=0.0, normalize_advantages=False)
    np.testing.assert_allclose(adv, r + gamma * v[1:] * ~d[1:] - v[:-1], rtol=1e-9, atol=1e-9)


@FAST
@given(T=st.integers(2, 10), B=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_gae_done_cuts_credit_across_episodes(T: int, B: int, seed: int) -> None:
    g = rng(seed)
    r, v = g.normal(size=(T, B)), g.normal(size=(T + 1, B))
    d = np.zeros((T + 1, B), bool)
    cut = int(g.integers(1, T))
    d[cut] = True  # the episode ends with step cut-1
    adv, _ = gae(r, v, d, gamma=0.9, gae_lambda=0.8, normalize_advantages=False)
    r2 = r.copy()
    r2[cut:] += 100.0  # later episode's rewards must not leak into the earlier one
    adv2, _ = gae(r2, v, d, gamma=0.9, gae_lambda=0.8, normalize_advantages=False)
    np.testing.assert_allclose(adv[:cut], adv2[:cut], rtol=1e-12, atol=1e-12)


def test_gae_critic_free_ignores_gamma_and_is_reward_to_go() -> None:
    r = np.array([[1.0], [2.0], [3.0]])
    d = np.zeros((4, 1), bool)
    adv, ret = gae(r, None, d, gamma=0.5, gae_lambda=0.5, normalize_advantages=False)
    np.testing.assert_allclose(adv[:, 0], [6.0, 5.0, 3.0])
    assert adv is ret


def test_gae_normalisation_uses_masked_stats_and_does_not_remask() -> None:
    g = rng(3)
    r, v = g.normal(size=(6, 4)), g.normal(size=(7, 4))
    m = g.random((6, 4)) < 0.5
    m[0, 0] = True
    adv, _ = gae(r, v, None, gamma=0.9, gae_lambda=0.9, loss_mask=m)
    assert abs(adv[m].mean()) < 1e-9
    assert not np.allclose(adv[~m], 0.0)  # padding shifted too (RLinf)


# ---------------------------------------------------------------------------------------------- GRPO


def test_grpo_matches_loop_reference() -> None:
    g = rng(4)
    rewards = g.normal(size=(3, 4)).astype(np.float32)
    mask = g.random((5, 12)) < 0.7
    out = grpo(t(rewards), t(mask), group_size=4)
    np.testing.assert_allclose(out.numpy(), ref.grpo(rewards, mask, 4), **TOL)
    assert out.dtype == torch.float32


@FAST
@given(
    groups=st.integers(1, 4),
    group_size=st.integers(2, 6),
    length=st.integers(1, 5),
    data=st.data(),
)
def test_grpo_advantages_have_zero_mean_per_group(
    groups: int, group_size: int, length: int, data: st.DataObject
) -> None:
    vals = data.draw(
        st.lists(
            st.floats(-10, 10, allow_nan=False), min_size=groups * group_size, max_size=groups * group_size
        )
    )
    rewards = np.array(vals).reshape(groups, group_size)
    assume(all(np.std(grp, ddof=1) > 1e-3 for grp in rewards))
    adv = grpo(rewards, np.ones((length, groups * group_size), bool), group_size=group_size)
    per_group = adv[0].reshape(groups, group_size)
    np.testing.assert_allclose(per_group.mean(axis=1), 0.0, atol=1e-9)
    raw_std = rewards.std(axis=1, ddof=1)  # the +1e-6 in the denominator shrinks the std to s / (s + 1e-6)
    np.testing.assert_allclose(per_group.std(axis=1, ddof=1), raw_std / (raw_std + 1e-6), rtol=1e-7)
    np.testing.assert_allclose(adv, np.broadcast_to(adv[0], adv.shape))  # same value at every valid step


@pytest.mark.filterwarnings("ignore:.*degrees of freedom:UserWarning")
def test_grpo_constant_group_is_zero_and_singleton_group_is_nan() -> None:
    out = grpo(np.array([2.0, 2.0, 2.0, 1.0, 3.0, 5.0]), np.ones((2, 6), bool), group_size=3)
    np.testing.assert_array_equal(out[:, :3], 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        single = grpo(torch.tensor([1.0, 2.0]), torch.ones(1, 2, dtype=torch.bool), group_size=1)
    assert torch.isnan(single).all()


@pytest.mark.parametrize("mode", ["frame", "video"])
def test_grpo_video_matches_loop_reference(mode: str) -> None:
    g = rng(5)
    rewards = g.normal(size=(5, 8)).astype(np.float32)
    mask = g.random((5, 8)) < 0.8
    out = grpo_video(t(rewards), t(mask), group_size=4, advantage_mode=mode)
    np.testing.assert_allclose(out.numpy(), ref.grpo_video(rewards, mask, 4, mode), **TOL)


def test_grpo_video_rejects_unknown_mode() -> None:
    with pytest.raises(ValueError, match=r"advantage_mode.*'frame' or 'video'.*'clip'"):
        grpo_video(np.zeros((2, 4)), None, group_size=2, advantage_mode="clip")  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", ["turn", "trajectory"])
def test_grpo_dynamic_matches_loop_reference(mode: str) -> None:
    g = rng(6)
    idx = [0, 0, 1, 2, 2, 2, 3, 5, 4, 5, 6, 7, 7, 1]
    rewards = g.normal(size=(len(idx), 1)).astype(np.float32)
    mask = g.random((4, len(idx))) < 0.8
    out = grpo_dynamic(t(rewards), t(mask), group_size=4, idx_to_traj=idx, advantage_mode=mode)
    np.testing.assert_allclose(out.numpy(), ref.grpo_dynamic(rewards, mask, 4, idx, mode), **TOL)


def test_grpo_dynamic_trajectory_mode_shares_one_value_per_trajectory() -> None:
    idx = [0, 0, 0, 1, 2, 3, 3]
    rewards = np.array([1.0, 2.0, 3.0, 0.0, 5.0, 1.0, 1.0])
    out = grpo_dynamic(
        rewards, np.ones((2, 7), bool), group_size=4, idx_to_traj=idx, advantage_mode="trajectory"
    )
    np.testing.assert_allclose(out[0, 0:3], out[0, 0])
    np.testing.assert_allclose(out[0, 5:7], out[0, 5])


def test_grpo_dynamic_bad_inputs() -> None:
    with pytest.raises(ValueError, match=r"len\(idx_to_traj\) = 3.*\[4\]"):
        grpo_dynamic(np.zeros(4), np.ones((2, 4), bool), group_size=2, idx_to_traj=[0, 1, 1])
    with pytest.raises(ValueError, match=r"not divisible by group_size=2"):
        grpo_dynamic(np.zeros(3), np.ones((2, 3), bool), group_size=2, idx_to_traj=[0, 1, 2])
    with pytest.raises(ValueError, match=r"'turn' or 'trajectory'.*'episode'"):
        grpo_dynamic(
            np.zeros(2), np.ones((2, 2), bool), group_size=2, idx_to_traj=[0, 1], advantage_mode="episode"
        )  # type: ignore[arg-type]


# -------------------------------------------------------------------------------------- Reinforce++


@pytest.mark.parametrize("baseline", [False, True])
@pytest.mark.parametrize("kl_beta", [0.0, 0.1])
def test_reinpp_matches_loop_reference(baseline: bool, kl_beta: float) -> None:
    g = rng(7)
    L, B = 9, 8
    mask = right_padded_mask(g, L, B)
    mask[:, 3] = False  # a sequence with no valid token
    rewards = g.normal(size=(1, B)).astype(np.float32)
    kl = g.normal(size=(L, B)).astype(np.float32)
    out = reinpp(
        t(rewards),
        t(mask),
        group_size=4,
        use_reinpp_baseline=baseline,
        kl_beta=kl_beta,
        kl=t(kl) if kl_beta else None,
    )
    np.testing.assert_allclose(out.numpy(), ref.reinpp(rewards, mask, 4, baseline, kl_beta, kl), **TOL)


def test_reinpp_reward_lands_on_last_valid_token_of_each_sequence() -> None:
    # Fix 1: RLinf's fliplr flips the batch axis of [L, B]; with kl_beta=0 and one sequence the
    # reward-to-go must be the reward up to and including the last valid token and 0 after it.
    mask = np.array([[1, 1], [1, 1], [1, 0], [0, 0]], bool)
    out = reinpp(np.array([3.0, -1.0]), mask)
    ret_signs = out[:, 0] > out[3, 0]
    assert ret_signs[:3].all()
    np.testing.assert_allclose(out[0:3, 0], out[0, 0])
    np.testing.assert_allclose(out[0:2, 1], out[0, 1])
    np.testing.assert_allclose(out[2:, 1], out[3, 0])  # after eos both columns hold the "0" return


def test_reinpp_baseline_does_not_mutate_input() -> None:
    rewards = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    before = rewards.clone()
    out = reinpp(rewards, torch.ones(3, 4, dtype=torch.bool), group_size=2, use_reinpp_baseline=True)
    assert torch.equal(rewards, before)
    assert torch.isfinite(out).all()


def test_reinpp_needs_kl_and_group_size() -> None:
    with pytest.raises(ValueError, match=r"kl .*required"):
        reinpp(np.zeros(2), np.ones((3, 2), bool), kl_beta=0.1)
    with pytest.raises(ValueError, match=r"group_size is required"):
        reinpp(np.zeros(2), np.ones((3, 2), bool), use_reinpp_baseline=True)
    with pytest.raises(ValueError, match=r"rewards must have layout \[B\] or \[1, B\].*\[3\].*\[3, 2\]"):
        reinpp(np.zeros(3), np.ones((3, 2), bool))


# ---------------------------------------------------------------------------------------- OPD / raw


def test_opd_is_teacher_minus_student_split_into_chunks() -> None:
    g = rng(8)
    prev = g.normal(size=(5, 3, 2 * 7)).astype(np.float64)
    teacher = g.normal(size=(5, 3, 2 * 7)).astype(np.float64)
    out = opd(t(prev), t(teacher), num_action_chunks=2, num_steps=4)
    assert out.shape == (4, 3, 2, 7)
    assert out.dtype == torch.float32
    for s in range(4):
        for e in range(3):
            for c in range(2):
                for k in range(7):
                    assert math.isclose(
                        float(out[s, e, c, k]),
                        np.float32(teacher[s, e, c * 7 + k]) - np.float32(prev[s, e, c * 7 + k]),
                        rel_tol=1e-6,
                        abs_tol=1e-6,
                    )


def test_opd_bad_shapes() -> None:
    with pytest.raises(ValueError, match=r"prev_logprobs\[2, 4\].*teacher_logprobs\[2, 6\]"):
        opd(np.zeros((2, 4)), np.zeros((2, 6)), num_action_chunks=2)
    with pytest.raises(ValueError, match=r"num_action_chunks.*dividing"):
        opd(np.zeros((2, 5)), np.zeros((2, 5)), num_action_chunks=2)
    with pytest.raises(ValueError, match=r"loss_mask's 5 steps"):
        opd(np.zeros((3, 4)), np.zeros((3, 4)), num_action_chunks=2, num_steps=5)


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("grouped", [False, True])
def test_raw_matches_loop_reference(normalize: bool, grouped: bool) -> None:
    g = rng(9)
    rewards = g.normal(size=(2, 4) if grouped else (8,)).astype(np.float32)
    mask = g.random((6, 8)) < 0.6
    out = raw(t(rewards), t(mask), normalize_advantages=normalize)
    np.testing.assert_allclose(out.numpy(), ref.raw(rewards, mask, normalize), **TOL)


# ------------------------------------------------------------------------ numpy == torch, gradients


def _all_calls(g: np.random.Generator) -> dict[str, tuple]:
    T, B = 7, 8
    r = g.normal(size=(T, B)).astype(np.float32)
    v = g.normal(size=(T + 1, B)).astype(np.float32)
    d = g.random((T + 1, B)) < 0.2
    m = right_padded_mask(g, T, B)
    seq = g.normal(size=(B,)).astype(np.float32)
    idx = [0, 1, 1, 2, 3, 4, 6, 7]
    return {
        "gae": (lambda a: gae(a[0], a[1], a[2], gamma=0.9, gae_lambda=0.8, loss_mask=a[3]), (r, v, d, m)),
        "grpo": (lambda a: grpo(a[0], a[1], group_size=4), (seq, m)),
        "grpo_video": (lambda a: grpo_video(a[0], a[1], group_size=4, advantage_mode="video"), (r, m)),
        "grpo_dynamic": (lambda a: grpo_dynamic(a[0], a[1], group_size=4, idx_to_traj=idx), (seq, m)),
        "reinpp": (
            lambda a: reinpp(a[0], a[1], group_size=2, use_reinpp_baseline=True, kl_beta=0.2, kl=a[2]),
            (seq, m, r),
        ),
        "opd": (lambda a: opd(a[0], a[1], num_action_chunks=4, num_steps=6), (r, v[:T])),
        "raw": (lambda a: raw(a[0], a[1], normalize_advantages=True), (seq, m)),
    }


@pytest.mark.parametrize("name", ["gae", "grpo", "grpo_video", "grpo_dynamic", "reinpp", "opd", "raw"])
def test_numpy_equals_torch(name: str) -> None:
    fn, args = _all_calls(rng(10))[name]
    out_np = fn(args)
    out_t = fn(tuple(t(a) for a in args))
    outs_np = out_np if isinstance(out_np, tuple) else (out_np,)
    outs_t = out_t if isinstance(out_t, tuple) else (out_t,)
    for a, b in zip(outs_np, outs_t, strict=True):
        assert isinstance(a, np.ndarray) and isinstance(b, torch.Tensor)
        np.testing.assert_allclose(a, b.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["gae", "grpo", "grpo_video", "grpo_dynamic", "reinpp", "opd", "raw"])
def test_strict_array_api_namespace_equals_numpy(name: str) -> None:
    fn, args = _all_calls(rng(12))[name]
    out_np = fn(args)
    out_xs = fn(tuple(xs.asarray(a) for a in args))
    outs_np = out_np if isinstance(out_np, tuple) else (out_np,)
    outs_xs = out_xs if isinstance(out_xs, tuple) else (out_xs,)
    strict_array = type(xs.asarray(0.0))
    for a, b in zip(outs_np, outs_xs, strict=True):
        assert isinstance(b, strict_array)
        np.testing.assert_allclose(a, np.asarray(b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["gae", "grpo", "grpo_video", "grpo_dynamic", "reinpp", "opd", "raw"])
def test_gradients_flow(name: str) -> None:
    fn, args = _all_calls(rng(11))[name]
    tensors = [t(a).clone().requires_grad_(True) if a.dtype == np.float32 else t(a) for a in args]
    out = fn(tuple(tensors))
    outs = out if isinstance(out, tuple) else (out,)
    weights = torch.randn_like(outs[0])
    (outs[0] * weights).sum().backward()
    grads = [x.grad for x in tensors if x.requires_grad]
    assert grads and all(gr is not None and torch.isfinite(gr).all() for gr in grads)
    assert any(gr.abs().sum() > 0 for gr in grads if gr is not None)


# ------------------------------------------------------------------------------------- bad shapes


def test_gae_bad_shapes_name_argument_and_shape() -> None:
    r = np.zeros((4, 3))
    with pytest.raises(ValueError, match=r"values .*\[T\+1, B\] = \[5, 3\].*\[4, 3\].*got shape \[5, 1\]"):
        gae(r, np.zeros((5, 1)), np.zeros((5, 3), bool))  # RLinf would broadcast this silently
    with pytest.raises(ValueError, match=r"dones .*got shape \[4, 3\]"):
        gae(r, np.zeros((5, 3)), np.zeros((4, 3), bool))
    with pytest.raises(ValueError, match=r"rewards must have layout \[T, B\].*\(4, 3, 1\)"):
        gae(np.zeros((4, 3, 1)))
    with pytest.raises(ValueError, match=r"rewards\[4, 3\].*loss_mask\[4, 1\]"):
        gae(r, loss_mask=np.ones((4, 1), bool))


def test_group_functions_bad_shapes() -> None:
    with pytest.raises(
        ValueError, match=r"loss_mask must have layout \[L, B\] with B = rewards.size = 8.*\[5, 1\].*\[8\]"
    ):
        grpo(np.zeros(8), np.ones((5, 1), bool), group_size=4)  # RLinf would broadcast [5, 1] to [5, 8]
    with pytest.raises(ValueError, match=r"6 entries.*not divisible by group_size=4"):
        grpo(np.zeros(6), np.ones((5, 6), bool), group_size=4)
    with pytest.raises(ValueError, match=r"rewards\[3, 4\].*loss_mask\[3, 2\]"):
        grpo_video(np.zeros((3, 4)), np.ones((3, 2), bool), group_size=2, advantage_mode="frame")
    with pytest.raises(ValueError, match=r"B = rewards.size = 4.*\[2, 3\]"):
        raw(np.zeros(4), np.ones((2, 3), bool))


def test_group_size_accepts_integer_likes_and_rejects_others() -> None:
    rewards, mask = np.arange(8.0), np.ones((2, 8), bool)
    np.testing.assert_allclose(grpo(rewards, mask, group_size=np.int64(4)), grpo(rewards, mask, group_size=4))
    for bad in (0, -2, 2.0, True, "4", None):
        with pytest.raises(ValueError, match=r"group_size must be a positive int, got"):
            grpo(rewards, mask, group_size=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("mask_kind", ["bool", "float", "none", "empty"])
def test_masked_standardize_equals_safe_normalize(mask_kind: str) -> None:
    g = rng(14)
    values = g.normal(size=(9, 7)).astype(np.float32)
    mask = {
        "bool": g.random((9, 7)) < 0.6,
        "float": (g.random((9, 7)) < 0.6).astype(np.float32),
        "none": None,
        "empty": np.zeros((9, 7), bool),
    }[mask_kind]
    for conv in (np.asarray, t):
        ours = _advantages.masked_standardize(conv(values), None if mask is None else conv(mask))
        expected = safe_normalize(conv(values), None if mask is None else conv(mask))
        np.testing.assert_allclose(np.asarray(ours), np.asarray(expected), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(
        _advantages.masked_standardize(values, mask), ref.safe_normalize(values, mask), rtol=1e-5, atol=1e-5
    )
