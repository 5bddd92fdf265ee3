"""RLinf-compatible entry layer: calculate_adv_and_returns(**kw), registry functions and the registry."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from rlinf_algos import (
    ADV_ENTRY_KEYWORDS,
    ADVANTAGE_FNS,
    advantage_registry,
    calculate_adv_and_returns,
    compute_gae_advantages_and_returns,
    compute_grpo_advantages,
    compute_grpo_dynamic_advantages,
    compute_loss_mask,
    compute_opd_advantages,
    compute_reinpp_advantages,
    get_adv_and_returns,
    register_advantage,
    reinpp,
)
from rlinf_algos._kl import kl_penalty

_spec = importlib.util.spec_from_file_location("_adv_refs", Path(__file__).with_name("_adv_refs.py"))
assert _spec is not None and _spec.loader is not None
ref = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ref)

TOL = {"rtol": 1e-5, "atol": 1e-5}
T, E, C = 5, 8, 3


def embodied_batch(seed: int, reward_type: str) -> dict[str, Any]:
    g = np.random.default_rng(seed)
    rewards = g.normal(size=(T, E, C)).astype(np.float32)
    dones = g.random((T + 1, E, C)) < 0.1
    mask, mask_sum = compute_loss_mask(torch.from_numpy(dones))
    if reward_type == "chunk_level":
        mask, mask_sum = mask.any(-1, keepdim=True), mask_sum[..., -1:]
    return {
        "task_type": "embodied",
        "rewards": torch.from_numpy(rewards),
        "dones": torch.from_numpy(dones),
        "values": torch.from_numpy(g.normal(size=(T + 1, E, 1)).astype(np.float32)),
        "prev_logprobs": None,
        "teacher_logprobs": None,
        "num_action_chunks": C,
        "gamma": 0.95,
        "gae_lambda": 0.9,
        "group_size": 4,
        "reward_type": reward_type,
        "loss_mask": mask,
        "loss_mask_sum": mask_sum,
        "advantage_mode": "frame",
    }


def flatten_ref(kw: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    rewards, dones, mask = kw["rewards"].numpy(), kw["dones"].numpy(), kw["loss_mask"].numpy()
    if kw["reward_type"] == "chunk_level":
        rewards, dones, mask = (
            rewards.sum(-1, keepdims=True),
            dones.any(-1, keepdims=True),
            mask.any(-1, keepdims=True),
        )
    cs = rewards.shape[-1]
    n = T * cs
    return (
        ref.flatten_embodied(rewards, n),
        ref.flatten_embodied(dones, -(n + 1)),
        ref.flatten_embodied(mask, n),
        cs,
    )


@pytest.mark.parametrize("reward_type", ["chunk_level", "action_level"])
def test_embodied_gae_matches_reference_pipeline(reward_type: str) -> None:
    kw = embodied_batch(1, reward_type)
    if reward_type == "action_level":  # GAE needs values per flattened step: one value per action
        kw["values"] = torch.randn(T + 1, E, C)
    out = calculate_adv_and_returns(adv_type="gae", **kw)
    assert isinstance(out, dict) and sorted(out) == ["advantages", "returns"]
    r, d, m, cs = flatten_ref(kw)
    v = ref.flatten_embodied(kw["values"].numpy(), T * cs + 1)
    adv, ret = ref.gae(r, v, d, 0.95, 0.9, normalize_advantages=True, loss_mask=m)
    assert out["advantages"].shape == (T, E, cs)
    np.testing.assert_allclose(out["advantages"].numpy(), ref.unflatten_embodied(adv, T, cs), **TOL)
    np.testing.assert_allclose(out["returns"].numpy(), ref.unflatten_embodied(ret, T, cs), **TOL)


@pytest.mark.parametrize("reward_type", ["chunk_level", "action_level"])
@pytest.mark.parametrize("adv_type", ["grpo", "raw"])
def test_embodied_scored_estimators_match_reference_pipeline(reward_type: str, adv_type: str) -> None:
    kw = embodied_batch(2, reward_type)
    out = calculate_adv_and_returns(adv_type=adv_type, **kw)
    assert isinstance(out, dict) and sorted(out) == ["advantages"]
    r, d, m, cs = flatten_ref(kw)
    scores = ref.calculate_scores(r, d, 4)
    flat = ref.grpo(scores, m, 4) if adv_type == "grpo" else ref.raw(scores, m, False)
    np.testing.assert_allclose(out["advantages"].numpy(), ref.unflatten_embodied(flat, T, cs), **TOL)


def test_embodied_grpo_video_skips_scoring() -> None:
    kw = embodied_batch(3, "action_level")
    out = calculate_adv_and_returns(adv_type="grpo_video", **kw)
    assert isinstance(out, dict)
    r, _, m, cs = flatten_ref(kw)
    np.testing.assert_allclose(
        out["advantages"].numpy(), ref.unflatten_embodied(ref.grpo_video(r, m, 4, "frame"), T, cs), **TOL
    )


def test_embodied_opd_skips_layouts() -> None:
    kw = embodied_batch(4, "action_level")
    kw["prev_logprobs"] = torch.randn(T + 1, E, C * 7)
    kw["teacher_logprobs"] = torch.randn(T + 1, E, C * 7)
    out = calculate_adv_and_returns(adv_type="opd", **kw)
    assert isinstance(out, dict) and sorted(out) == ["advantages"]
    expected = (kw["teacher_logprobs"] - kw["prev_logprobs"]).reshape(T + 1, E, C, 7)[:T]
    torch.testing.assert_close(out["advantages"], expected)
    with pytest.raises(ValueError, match="normalize_advantages must be False"):
        calculate_adv_and_returns(adv_type="opd", normalize_advantages=True, **kw)


def test_embodied_mismatched_mask_raises_naming_both_shapes() -> None:
    kw = embodied_batch(5, "action_level")
    kw["loss_mask"] = kw["loss_mask"][..., :1]
    with pytest.raises(ValueError, match=r"loss_mask .*\[5, 8, 3\].*got shape \[5, 8, 1\]"):
        calculate_adv_and_returns(adv_type="grpo", **kw)


def reasoning_batch(seed: int, B: int = 8, L: int = 6) -> dict[str, Any]:
    g = np.random.default_rng(seed)
    lens = g.integers(1, L + 1, size=B)
    return {
        "task_type": "reasoning",
        "rewards": torch.from_numpy(g.normal(size=(B,)).astype(np.float32)),
        "loss_mask": torch.from_numpy(np.arange(L)[None, :] < lens[:, None]),
        "group_size": 4,
        "kl_beta": 0.0,
        "kl_penalty_type": "k3",
        "logprob": torch.from_numpy(g.normal(size=(B, L)).astype(np.float32)),
        "ref_logprob": torch.from_numpy(g.normal(size=(B, L)).astype(np.float32)),
        "use_reinpp_baseline": False,
    }


@pytest.mark.parametrize("with_values", [False, True])
def test_reasoning_gae_puts_reward_on_last_position(with_values: bool) -> None:
    kw = reasoning_batch(6)
    B, L = kw["loss_mask"].shape
    if with_values:
        kw["values"] = torch.randn(B, L)
        kw["normalize_advantages"] = False
    out = calculate_adv_and_returns(adv_type="gae", **kw)
    assert isinstance(out, tuple)
    adv, ret = out
    rewards = np.zeros((L, B))
    rewards[-1] = kw["rewards"].numpy()
    values = None
    if with_values:
        values = np.concatenate([kw["values"].numpy().T, np.zeros((1, B))])
    dones = np.zeros((L + 1, B), bool)
    dones[-1] = True
    ref_adv, ref_ret = ref.gae(
        rewards, values, dones, 1.0, 1.0, not with_values, False, kw["loss_mask"].numpy().T
    )
    assert adv.shape == (B, L) and adv.is_contiguous()
    np.testing.assert_allclose(adv.numpy(), ref_adv.T, **TOL)
    assert ret is not None
    np.testing.assert_allclose(ret.numpy(), ref_ret.T, **TOL)


@pytest.mark.parametrize("adv_type", ["grpo", "raw", "reinpp"])
def test_reasoning_estimators_match_reference(adv_type: str) -> None:
    kw = reasoning_batch(7)
    adv, ret = calculate_adv_and_returns(adv_type=adv_type, **kw)
    assert ret is None
    rewards, mask = kw["rewards"].numpy(), kw["loss_mask"].numpy().T
    expected = {
        "grpo": lambda: ref.grpo(rewards, mask, 4),
        "raw": lambda: ref.raw(rewards, mask, False),
        "reinpp": lambda: ref.reinpp(rewards, mask),
    }[adv_type]()
    np.testing.assert_allclose(adv.numpy(), expected.T, **TOL)


def test_reasoning_grpo_dynamic_through_entry() -> None:
    idx = [0, 0, 1, 2, 3, 3]
    kw = reasoning_batch(8, B=6)
    kw["group_size"] = 2
    out = calculate_adv_and_returns(
        adv_type="grpo_dynamic", advantage_mode="turn", num_sequence=6, idx_to_traj=idx, **kw
    )
    mask = kw["loss_mask"].numpy().T
    expected = ref.grpo_dynamic(kw["rewards"].numpy(), mask, 2, idx, "turn")
    np.testing.assert_allclose(out[0].numpy(), expected.T, **TOL)


def test_reinpp_kl_and_baseline_through_entry() -> None:
    kw = reasoning_batch(9)
    rewards_before = kw["rewards"].clone()
    kw.update(kl_beta=0.05, use_reinpp_baseline=True)
    adv, _ = calculate_adv_and_returns(adv_type="reinpp", **kw)
    assert torch.equal(kw["rewards"], rewards_before)  # never mutated (RLinf mutates, then crashes)
    kl = kl_penalty(kw["logprob"].T, kw["ref_logprob"].T, "k3")
    expected = reinpp(
        kw["rewards"], kw["loss_mask"].T, group_size=4, use_reinpp_baseline=True, kl_beta=0.05, kl=kl
    )
    torch.testing.assert_close(adv, expected.T)
    np.testing.assert_allclose(
        adv.numpy().T,
        ref.reinpp(kw["rewards"].numpy(), kw["loss_mask"].numpy().T, 4, True, 0.05, kl.numpy()),
        **TOL,
    )


# ------------------------------------------------------------------------------ kwargs checking


def test_entry_rejects_unknown_keywords_by_name() -> None:
    kw = reasoning_batch(10)
    with pytest.raises(
        TypeError, match=r"calculate_adv_and_returns\(\) got unexpected keyword argument\(s\) 'gama'"
    ):
        calculate_adv_and_returns(adv_type="grpo", gama=0.9, **kw)
    with pytest.raises(TypeError, match="missing required keyword argument 'adv_type'"):
        calculate_adv_and_returns(**kw)
    with pytest.raises(ValueError, match=r"unknown advantage 'ppo'; valid names: .*gae.*grpo"):
        calculate_adv_and_returns(adv_type="ppo", **kw)


def test_every_keyword_rlinf_workers_pass_is_accepted() -> None:
    embodied = embodied_batch(11, "chunk_level")
    assert set(embodied) | {"adv_type"} <= ADV_ENTRY_KEYWORDS
    reasoning_extra = {"values", "normalize_advantages", "advantage_mode", "num_sequence", "idx_to_traj"}
    assert set(reasoning_batch(11)) | reasoning_extra <= ADV_ENTRY_KEYWORDS


@pytest.mark.parametrize(
    ("fn", "args"),
    [
        (compute_gae_advantages_and_returns, {"rewards": np.zeros((2, 2))}),
        (
            compute_grpo_advantages,
            {"rewards": np.zeros(2), "loss_mask": np.ones((1, 2), bool), "group_size": 2},
        ),
        (
            compute_reinpp_advantages,
            {"rewards": np.zeros(2), "loss_mask": np.ones((1, 2), bool), "group_size": 2},
        ),
    ],
)
def test_registry_functions_reject_unknown_keywords(fn: Any, args: dict[str, Any]) -> None:
    fn(**args, task_type="reasoning", num_chunk=1)  # keywords the pipeline passes are accepted and ignored
    with pytest.raises(
        TypeError, match=rf"{fn.__name__}\(\) got unexpected keyword argument\(s\) 'gae_lamda'"
    ):
        fn(**args, gae_lamda=0.9)


def test_registry_functions_take_rlinf_keyword_names() -> None:
    rewards, values = torch.randn(4, 3), torch.randn(5, 3)
    dones = torch.zeros(5, 3, dtype=torch.bool)
    adv, ret = compute_gae_advantages_and_returns(
        rewards=rewards, values=values, dones=dones, gamma=0.9, gae_lambda=0.8, normalize_advantages=False
    )
    ref_adv, ref_ret = ref.gae(rewards.numpy(), values.numpy(), dones.numpy(), 0.9, 0.8)
    np.testing.assert_allclose(adv.numpy(), ref_adv, **TOL)
    np.testing.assert_allclose(ret.numpy(), ref_ret, **TOL)
    out, none = compute_grpo_dynamic_advantages(
        rewards=torch.randn(4, 1), loss_mask=torch.ones(2, 4), group_size=2, idx_to_traj=[0, 1, 2, 3]
    )
    assert none is None and out.shape == (2, 4)
    with pytest.raises(ValueError, match="needs num_action_chunks"):
        compute_opd_advantages(prev_logprobs=torch.zeros(2, 4), teacher_logprobs=torch.zeros(2, 4))


# ------------------------------------------------------------------------------------- registry


@pytest.fixture
def scratch_names() -> Iterator[list[str]]:
    names: list[str] = []
    yield names
    for name in names:
        if name in advantage_registry:
            advantage_registry.unregister(name)


def test_builtin_names_and_case_insensitive_lookup() -> None:
    assert sorted(ADVANTAGE_FNS) == ["gae", "grpo", "grpo_dynamic", "grpo_video", "opd", "raw", "reinpp"]
    assert get_adv_and_returns("GrPo") is compute_grpo_advantages
    with pytest.raises(TypeError):
        ADVANTAGE_FNS["mine"] = compute_grpo_advantages  # type: ignore[index]


def test_upper_case_adv_type_takes_the_same_path() -> None:
    kw = embodied_batch(12, "chunk_level")
    lower = calculate_adv_and_returns(adv_type="gae", **kw)
    upper = calculate_adv_and_returns(adv_type="GAE", **kw)  # RLinf would also score rewards for "GAE"
    assert isinstance(lower, dict) and isinstance(upper, dict)
    torch.testing.assert_close(lower["advantages"], upper["advantages"])


def test_register_custom_advantage_and_dispatch(scratch_names: list[str]) -> None:
    seen: dict[str, Any] = {}

    def constant(rewards: Any, loss_mask: Any, **kwargs: Any) -> tuple[Any, None]:
        seen.update(kwargs, rewards=rewards)
        return loss_mask.float() * 2.0, None

    scratch_names.append("my_Adv")
    assert register_advantage("My_Adv")(constant) is constant
    assert get_adv_and_returns("MY_ADV") is constant
    register_advantage("my_adv")(constant)  # same function again: fine
    kw = embodied_batch(13, "chunk_level")
    out = calculate_adv_and_returns(adv_type="my_adv", **kw)
    assert isinstance(out, dict)
    torch.testing.assert_close(out["advantages"], kw["loss_mask"].float() * 2.0)
    assert seen["rewards"].shape == (E // 4, 4)  # calculate_scores ran (custom estimators are scored)
    assert {"num_chunk", "batch_size", "chunk_size", "n_steps"} <= set(seen)

    def other(**kwargs: Any) -> tuple[Any, None]:
        return kwargs["rewards"], None

    with pytest.raises(ValueError, match="'my_adv' is already registered"):
        register_advantage("MY_ADV")(other)
    with pytest.raises(ValueError, match="'gae' is already registered"):
        register_advantage("gae")(other)
