"""Embodied and reasoning layouts around the advantage functions: loop references and bad shapes."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import array_api_strict as xs
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from rlinf_algos import (
    calculate_scores,
    compute_loss_mask,
    filter_rewards,
    postprocess_embodied_advantages_outputs,
    postprocess_reasoning_advantages_outputs,
    preprocess_embodied_advantages_inputs,
    preprocess_reasoning_advantages_inputs,
)

_spec = importlib.util.spec_from_file_location("_adv_refs", Path(__file__).with_name("_adv_refs.py"))
assert _spec is not None and _spec.loader is not None
ref = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ref)

FAST = settings(max_examples=40, deadline=None)


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


# ----------------------------------------------------------------------------------- loss mask


@FAST
@given(
    T=st.integers(1, 6),
    E=st.integers(1, 4),
    C=st.integers(1, 4),
    p=st.floats(0.0, 0.5),
    seed=st.integers(0, 2**16),
)
def test_compute_loss_mask_matches_loop_reference(T: int, E: int, C: int, p: float, seed: int) -> None:
    dones = rng(seed).random((T + 1, E, C)) < p
    mask, mask_sum = compute_loss_mask(torch.from_numpy(dones))
    ref_mask, ref_sum = ref.compute_loss_mask(dones)
    assert mask.dtype == torch.bool and mask.shape == (T, E, C)
    np.testing.assert_array_equal(mask.numpy(), ref_mask)
    np.testing.assert_array_equal(mask_sum.numpy(), ref_sum)
    np_mask, np_sum = compute_loss_mask(dones)
    np.testing.assert_array_equal(np_mask, ref_mask)
    np.testing.assert_array_equal(np_sum, ref_sum)


def test_compute_loss_mask_keeps_the_done_step() -> None:
    dones = np.zeros((4, 1, 2), bool)
    dones[2, 0, 0] = True  # closes step (chunk 1, action 0) = flat step 2
    mask, mask_sum = compute_loss_mask(dones)
    np.testing.assert_array_equal(mask[:, 0, :].reshape(-1), [1, 1, 1, 0, 0, 0])
    assert (mask_sum == 3).all()


def test_compute_loss_mask_bad_shape() -> None:
    with pytest.raises(ValueError, match=r"dones must have layout \[T\+1, E, C\].*\(4, 2\)"):
        compute_loss_mask(np.zeros((4, 2), bool))


# ------------------------------------------------------------------------- embodied pre/post


@pytest.mark.parametrize("reward_type", ["action_level", "chunk_level"])
def test_embodied_preprocess_matches_loop_reference(reward_type: str) -> None:
    g = rng(1)
    T, E, C = 4, 3, 5
    rewards = g.normal(size=(T, E, C))
    dones = g.random((T + 1, E, C)) < 0.2
    mask, mask_sum = compute_loss_mask(dones)
    cs = 1 if reward_type == "chunk_level" else C
    values = g.normal(size=(T + 1, E, cs))
    out = preprocess_embodied_advantages_inputs(
        rewards, dones, values, mask, mask_sum, reward_type=reward_type
    )
    if reward_type == "chunk_level":
        rewards = rewards.sum(-1, keepdims=True)
        dones = dones.any(-1, keepdims=True)
        mask = mask.any(-1, keepdims=True)
        mask_sum = mask_sum.max(-1, keepdims=True)
    n = T * cs
    assert (out.num_chunk, out.batch_size, out.chunk_size, out.n_steps) == (T, E, cs, n)
    np.testing.assert_allclose(out.rewards, ref.flatten_embodied(rewards, n))
    np.testing.assert_array_equal(out.dones, ref.flatten_embodied(dones, -(n + 1)))
    np.testing.assert_allclose(out.values, ref.flatten_embodied(values, n + 1))  # FIRST n+1 rows
    np.testing.assert_array_equal(out.loss_mask, ref.flatten_embodied(mask, n))
    np.testing.assert_array_equal(out.loss_mask_sum, mask_sum)


def test_embodied_postprocess_inverts_flattening() -> None:
    g = rng(2)
    x = g.normal(size=(12, 3))
    adv, ret = postprocess_embodied_advantages_outputs(x, num_chunk=4, chunk_size=3, returns=2 * x)
    np.testing.assert_allclose(adv, ref.unflatten_embodied(x, 4, 3))
    np.testing.assert_allclose(ret, 2 * ref.unflatten_embodied(x, 4, 3))
    adv_only, none = postprocess_embodied_advantages_outputs(torch.from_numpy(x), num_chunk=12, chunk_size=1)
    assert none is None and adv_only.shape == (12, 3, 1)
    with pytest.raises(ValueError, match=r"advantages .*num_chunk \* chunk_size = 10, got shape \[12, 3\]"):
        postprocess_embodied_advantages_outputs(x, num_chunk=5, chunk_size=2)


def test_embodied_preprocess_bad_shapes() -> None:
    r = np.zeros((4, 3, 2))
    d = np.zeros((5, 3, 2), bool)
    with pytest.raises(ValueError, match=r"dones .*\[5, 3, 2\].*\[4, 3, 2\], got shape \[4, 3, 2\]"):
        preprocess_embodied_advantages_inputs(r, np.zeros((4, 3, 2), bool), reward_type="action_level")
    with pytest.raises(ValueError, match=r"loss_mask .*\[4, 3, 2\].*got shape \[4, 3, 1\]"):
        preprocess_embodied_advantages_inputs(
            r, d, loss_mask=np.ones((4, 3, 1), bool), reward_type="action_level"
        )
    # values [T+1, E, 1] with two actions per chunk: RLinf's reshape fails; we say which shapes clash.
    with pytest.raises(
        ValueError, match=r"values .*\[5, 3, 2\].*\[4, 3, 2\].*action_level.*got shape \[5, 3, 1\]"
    ):
        preprocess_embodied_advantages_inputs(r, d, np.zeros((5, 3, 1)), reward_type="action_level")
    out = preprocess_embodied_advantages_inputs(
        r, d, np.zeros((5, 3, 1)), np.ones((4, 3, 1), bool), reward_type="chunk_level"
    )
    assert out.values is not None and out.values.shape == (5, 3)


@FAST
@given(
    n=st.integers(1, 8),
    E=st.integers(1, 3),
    gs=st.sampled_from([1, 2]),
    p=st.floats(0, 0.5),
    seed=st.integers(0, 2**16),
)
def test_calculate_scores_is_first_episode_return(n: int, E: int, gs: int, p: float, seed: int) -> None:
    g = rng(seed)
    rewards = g.normal(size=(n, E * gs)).astype(np.float32)
    dones = g.random((n + 1, E * gs)) < p
    scores = calculate_scores(torch.from_numpy(rewards), torch.from_numpy(dones), group_size=gs)
    assert scores.dtype == torch.float32 and scores.shape == (E, gs)
    np.testing.assert_allclose(scores.numpy(), ref.calculate_scores(rewards, dones, gs), rtol=1e-5, atol=1e-5)


def test_calculate_scores_bad_inputs() -> None:
    with pytest.raises(ValueError, match=r"dones .*\[4, 6\].*got shape \[3, 6\]"):
        calculate_scores(np.zeros((3, 6)), np.zeros((3, 6), bool), group_size=2)
    with pytest.raises(
        ValueError,
        match=r"environment axis E of rewards has 6 entries, which is not divisible by group_size=4",
    ):
        calculate_scores(np.zeros((3, 6)), np.zeros((4, 6), bool), group_size=4)


def test_filter_rewards_drops_groups_outside_bounds() -> None:
    T, E, C = 3, 6, 2
    rewards = np.zeros((T, E, C))
    rewards[0, 0:2, 0] = 1.0  # group 0 (envs 0-2): mean return 2/3
    rewards[:, 3:6, :] = 1.0  # group 1: mean return 6 -> above the bound
    mask = np.ones((T, E, C), bool)
    mask[1:, 1, :] = False
    out = filter_rewards(rewards, mask, group_size=3, rewards_lower_bound=0.1, rewards_upper_bound=0.9)
    assert out.shape == (T, E, C)
    np.testing.assert_array_equal(out[:, 3:], False)
    np.testing.assert_array_equal(out[:, :3], mask[:, :3])
    only_filter = filter_rewards(
        torch.from_numpy(rewards), None, group_size=3, rewards_lower_bound=0.1, rewards_upper_bound=0.9
    )
    assert only_filter.shape == (T, E, 1)
    assert only_filter[:, :3].all() and not only_filter[:, 3:].any()


def test_filter_rewards_uses_masked_rewards() -> None:
    rewards = np.ones((2, 2, 1))
    mask = np.array([[[True], [True]], [[False], [False]]])
    # masked returns are 1 per env -> kept with bounds [1, 1]; unmasked returns 2 would be dropped
    out = filter_rewards(rewards, mask, group_size=2, rewards_lower_bound=1.0, rewards_upper_bound=1.0)
    np.testing.assert_array_equal(out, mask)


# --------------------------------------------------------------------------------- reasoning


@pytest.mark.parametrize("adv_type", ["gae", "grpo", "grpo_dynamic", "reinpp", "raw"])
def test_reasoning_preprocess_layouts(adv_type: str) -> None:
    g = rng(3)
    B, L = 8, 5
    rewards = torch.from_numpy(g.normal(size=(B,)))
    mask = torch.from_numpy(g.random((B, L)) < 0.7)
    values = torch.from_numpy(g.normal(size=(B, L)))
    logprob = torch.from_numpy(g.normal(size=(B, L)))
    out = preprocess_reasoning_advantages_inputs(
        rewards, mask, values, logprob, -logprob, adv_type=adv_type, group_size=4, num_sequence=8
    )
    assert torch.equal(out.loss_mask, mask.T)
    assert out.dones.dtype == torch.bool and out.dones.shape == (L + 1, B)
    assert out.dones[-1].all() and not out.dones[:-1].any()
    assert out.values is not None and torch.equal(out.values[:L], values.T) and (out.values[L] == 0).all()
    assert out.logprob is not None and torch.equal(out.logprob, logprob.T)
    assert out.ref_logprob is not None and torch.equal(out.ref_logprob, -logprob.T)
    expected = {
        "gae": torch.cat([torch.zeros(L - 1, B, dtype=rewards.dtype), rewards[None]]),
        "grpo": rewards.reshape(2, 4),
        "grpo_dynamic": rewards.reshape(1, 8).T,
        "reinpp": rewards[None],
        "raw": rewards,
    }[adv_type]
    assert torch.equal(out.rewards, expected)


def test_reasoning_preprocess_rejects_unknown_type_and_bad_shapes() -> None:
    with pytest.raises(
        ValueError, match=r"'grpo_video' has no reasoning reward layout; supported: gae, grpo"
    ):
        preprocess_reasoning_advantages_inputs(np.zeros(4), np.ones((4, 3), bool), adv_type="grpo_video")
    with pytest.raises(ValueError, match=r"rewards shape \[3\] vs loss_mask shape \[4, 3\]"):
        preprocess_reasoning_advantages_inputs(np.zeros(3), np.ones((4, 3), bool), adv_type="raw")
    with pytest.raises(ValueError, match=r"loss_mask\[4, 3\].*values\[3, 4\]"):
        preprocess_reasoning_advantages_inputs(
            np.zeros(4), np.ones((4, 3), bool), np.zeros((3, 4)), adv_type="gae"
        )
    with pytest.raises(
        ValueError, match=r"rewards \(grpo\) has 4 entries, which is not divisible by group_size=3"
    ):
        preprocess_reasoning_advantages_inputs(
            np.zeros(4), np.ones((4, 3), bool), adv_type="grpo", group_size=3
        )


def test_reasoning_postprocess_transposes_to_contiguous() -> None:
    x = torch.randn(5, 3)
    adv, ret = postprocess_reasoning_advantages_outputs(x, 2 * x)
    assert adv.is_contiguous() and torch.equal(adv, x.T)
    assert ret is not None and ret.is_contiguous() and torch.equal(ret, 2 * x.T)
    adv_np, none = postprocess_reasoning_advantages_outputs(x.numpy())
    assert none is None and np.array_equal(adv_np, x.numpy().T)


def test_layout_helpers_work_on_a_strict_array_api_namespace() -> None:
    g = rng(4)
    T, E, C = 4, 6, 2
    rewards = g.normal(size=(T, E, C)).astype(np.float32)
    dones = g.random((T + 1, E, C)) < 0.2
    mask, mask_sum = compute_loss_mask(xs.asarray(dones))
    ref_mask, ref_sum = ref.compute_loss_mask(dones)
    np.testing.assert_array_equal(np.asarray(mask), ref_mask)
    np.testing.assert_array_equal(np.asarray(mask_sum), ref_sum)
    pre = preprocess_embodied_advantages_inputs(
        xs.asarray(rewards), xs.asarray(dones), loss_mask=mask, reward_type="action_level"
    )
    np.testing.assert_allclose(np.asarray(pre.rewards), ref.flatten_embodied(rewards, T * C))
    scores = calculate_scores(pre.rewards, pre.dones, group_size=3)
    np.testing.assert_allclose(
        np.asarray(scores), ref.calculate_scores(np.asarray(pre.rewards), np.asarray(pre.dones), 3), rtol=1e-5
    )
    adv, _ = postprocess_embodied_advantages_outputs(pre.rewards, num_chunk=T, chunk_size=C)
    np.testing.assert_allclose(np.asarray(adv), rewards)
    kept = filter_rewards(
        xs.asarray(rewards), mask, group_size=3, rewards_lower_bound=-1e9, rewards_upper_bound=1e9
    )
    np.testing.assert_array_equal(np.asarray(kept), ref_mask)
    rpre = preprocess_reasoning_advantages_inputs(
        xs.asarray(rewards[0, :, 0]), xs.asarray(dones[0]), adv_type="reinpp"
    )
    back, _ = postprocess_reasoning_advantages_outputs(rpre.loss_mask)
    np.testing.assert_array_equal(np.asarray(back), dones[0])
