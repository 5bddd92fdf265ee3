"""Multi-agent loss scales and DAPO filters: loop references, order checks, numpy == torch, bad shapes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from rlinf_algos import (
    LOSS_SCALE_FNS,
    dynamic_sampling_filter,
    get_loss_scales,
    loss_scale_registry,
    overlong_filter,
    overlong_reward_penalty,
    register_loss_scale,
)

FAST = settings(max_examples=30, deadline=None)


def t(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x))


def batch(seed: int = 0):
    g = np.random.default_rng(seed)
    # 2 trajectories; trajectory 0 has agents {0: 2 turns, 1: 1 turn}, trajectory 1 has agent {0: 3 turns}
    idx_to_traj = [0, 0, 0, 1, 1, 1]
    idx_to_sub = np.array([0, 1, 0, 0, 0, 0])
    mask = g.random((6, 5)) < 0.7
    mask[:, 0] = True
    adv = g.normal(size=(6, 5)).astype(np.float32)
    return {
        "advantages": adv,
        "loss_scales": np.where(mask, 1.0, 0.0).astype(np.float32),
        "response_mask": mask,
        "idx_to_traj": idx_to_traj,
        "extra:idx_to_sub_traj": idx_to_sub,
    }


def scales_ref(b, gbs, dp):
    """Loop reference of group → agent → turn (docs/algorithms.md#loss-scales)."""
    adv = b["advantages"].astype(np.float64) * (len(b["idx_to_traj"]) * dp / gbs)
    ls = b["loss_scales"].astype(np.float64).copy()
    turns: dict = {}
    for i, (tr, sub) in enumerate(zip(b["idx_to_traj"], b["extra:idx_to_sub_traj"], strict=True)):
        turns.setdefault(tr, {}).setdefault(int(sub), []).append(i)
    for agents in turns.values():
        for idxs in agents.values():
            for i in idxs:
                ls[i] *= 1 / len(agents) / len(idxs)
    for agents in turns.values():
        for idxs in agents.values():
            counts = [int(b["response_mask"][i].sum()) for i in idxs]
            for i, n in zip(idxs, counts, strict=True):
                ls[i] *= len(idxs) * n / sum(counts)
    return adv, ls


@pytest.mark.parametrize("conv", [np.asarray, t])
def test_loss_scales_match_loop_reference(conv):
    b = batch(1)
    want_adv, want_ls = scales_ref(b, gbs=12, dp=2)
    arrays = {k: conv(v) if isinstance(v, np.ndarray) else v for k, v in b.items()}
    context = {"folding_scale": [], "actor_global_batch_size": 12, "data_parallel_world_size": 2}
    out = arrays
    for fn in get_loss_scales(["group_level", "AGENT_LEVEL", "turn_level"]):
        out = fn(context, out)
    np.testing.assert_allclose(np.asarray(out["advantages"]), want_adv, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(out["loss_scales"]), want_ls, rtol=1e-6)
    assert context["folding_scale"] == ["group_level", "agent_level", "turn_level"]
    # inputs are not modified
    np.testing.assert_array_equal(np.asarray(arrays["advantages"]), b["advantages"])
    np.testing.assert_array_equal(np.asarray(arrays["loss_scales"]), b["loss_scales"])


def test_loss_scales_order_is_enforced():
    b = batch()
    with pytest.raises(ValueError, match="'agent_level' must run once, after \\['group_level'\\]"):
        LOSS_SCALE_FNS["agent_level"]({"folding_scale": [], "actor_global_batch_size": 6}, b)
    ctx = {"folding_scale": [], "actor_global_batch_size": 6}
    b = LOSS_SCALE_FNS["group_level"](ctx, b)
    with pytest.raises(ValueError, match="already applied"):
        LOSS_SCALE_FNS["group_level"](ctx, b)
    with pytest.raises(ValueError, match="folding_scale"):
        LOSS_SCALE_FNS["group_level"]({"actor_global_batch_size": 6}, b)


def test_loss_scale_registry():
    with pytest.raises(ValueError, match="valid names: agent_level, group_level, turn_level"):
        get_loss_scales(["token_level"])
    with pytest.raises(ValueError, match="list of names"):
        get_loss_scales("group_level")  # type: ignore[arg-type]

    def double(context, b):
        return {**b, "advantages": b["advantages"] * 2}

    register_loss_scale("Double")(double)
    try:
        assert get_loss_scales(["double"]) == [double]
        with pytest.raises(ValueError, match="already registered"):
            register_loss_scale("group_level")(double)
    finally:
        loss_scale_registry.unregister("double")


# ----------------------------------------------------------------------------------------------- DAPO
def test_dynamic_sampling_filter_loop_reference():
    rewards = np.array([1, 1, 1, 0, 1, 0, 0, 0, 0.5, 0.5, 0.5, 0.5], dtype=np.float32)
    want = []
    for gi in range(3):
        grp = rewards[gi * 4 : (gi + 1) * 4]
        want += [bool(any(x != grp[0] for x in grp))] * 4
    np.testing.assert_array_equal(dynamic_sampling_filter(rewards, group_size=4), want)
    np.testing.assert_array_equal(dynamic_sampling_filter(t(rewards), group_size=4).numpy(), want)
    with pytest.raises(ValueError, match="not a multiple of group_size=5"):
        dynamic_sampling_filter(rewards, group_size=5)
    with pytest.raises(ValueError, match=r"rewards must have layout \[B\].*\(3, 4\)"):
        dynamic_sampling_filter(rewards.reshape(3, 4), group_size=4)


@FAST
@given(seed=st.integers(0, 2**16), groups=st.integers(1, 6), gs=st.integers(1, 5))
def test_property_kept_groups_have_nonzero_spread(seed, groups, gs):
    g = np.random.default_rng(seed)
    r = g.integers(0, 2, size=groups * gs).astype(np.float64)
    keep = dynamic_sampling_filter(r, group_size=gs)
    for gi in range(groups):
        sl = slice(gi * gs, (gi + 1) * gs)
        assert keep[sl].all() == (r[sl].std() > 0)
        assert keep[sl].all() or not keep[sl].any()


def test_overlong_filter():
    mask = np.array([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]], dtype=bool)
    want = mask.copy()
    want[0] = False
    np.testing.assert_array_equal(overlong_filter(mask, max_response_length=4), want)
    trunc = t(np.array([False, True, False]))
    out = overlong_filter(t(mask), truncated=trunc).numpy()
    np.testing.assert_array_equal(out, mask & ~np.array([False, True, False])[:, None])
    with pytest.raises(ValueError, match="truncated"):
        overlong_filter(mask)
    with pytest.raises(ValueError, match=r"truncated has shape \[2\]"):
        overlong_filter(mask, truncated=np.array([True, False]))


def test_overlong_reward_penalty_loop_reference():
    lengths = np.array([0, 10, 12, 13, 15, 16, 30])
    want = []
    for n in lengths:
        if n <= 12:
            want.append(0.0)
        elif n <= 16:
            want.append((12 - n) / 4)
        else:
            want.append(-1.0)
    np.testing.assert_allclose(
        overlong_reward_penalty(lengths, max_length=16, cache_length=4), want, rtol=1e-6
    )
    np.testing.assert_allclose(
        overlong_reward_penalty(t(lengths), max_length=16, cache_length=4).numpy(), want, rtol=1e-6
    )
    with pytest.raises(ValueError, match="cache_length"):
        overlong_reward_penalty(lengths, max_length=4, cache_length=8)
