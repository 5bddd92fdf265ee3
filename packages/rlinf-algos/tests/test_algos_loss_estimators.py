"""KL estimators, entropy, aggregators and masked normalisation: loop references, properties, numpy == torch."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from rlinf_algos import (
    KL_PENALTY_TYPES,
    LOSS_AGG_FNS,
    compute_entropy_from_logits,
    get_loss_agg_func,
    kl_penalty,
    masked_mean,
    masked_mean_ratio,
    masked_normalization,
    masked_stats,
    normalize_from_stats,
    reshape_entropy,
    seq_mean_token_mean,
    seq_mean_token_sum,
)

_spec = importlib.util.spec_from_file_location("_loss_refs", Path(__file__).with_name("_loss_refs.py"))
assert _spec is not None and _spec.loader is not None
ref = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ref)

TOL = {"rtol": 1e-5, "atol": 1e-6}
FAST = settings(max_examples=30, deadline=None)


def t(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x))


# ------------------------------------------------------------------------------------------------- KL
@pytest.mark.parametrize("kind", KL_PENALTY_TYPES)
def test_kl_penalty_matches_loop_reference(kind):
    g = np.random.default_rng(0)
    lp = g.normal(size=(4, 7)).astype(np.float32) * 3
    rf = g.normal(size=(4, 7)).astype(np.float32) * 3
    lp[0, 0], rf[0, 0] = -40.0, 0.0  # exercises the ±20 / ±10 clamps of k3
    want = ref.kl_ref(lp, rf, kind)
    np.testing.assert_allclose(kl_penalty(lp, rf, kind), want, **TOL)
    lpt = t(lp).requires_grad_(True)
    out = kl_penalty(lpt, t(rf), kind.upper())  # case-insensitive
    np.testing.assert_allclose(out.detach().numpy(), want, **TOL)
    out.sum().backward()
    assert lpt.grad is not None and torch.isfinite(lpt.grad).all()


def test_kl_penalty_unknown_names():
    x = np.zeros(3, np.float32)
    with pytest.raises(ValueError, match=r"'full'.*valid names: kl, k1"):
        kl_penalty(x, x, "full")
    with pytest.raises(ValueError, match="unknown kl_penalty 'k4'"):
        kl_penalty(x, x, "k4")


@FAST
@given(seed=st.integers(0, 2**16))
def test_property_k2_k3_nonnegative_and_zero_on_policy(seed):
    g = np.random.default_rng(seed)
    lp, rf = g.normal(size=20), g.normal(size=20)
    for kind in ("k2", "k3", "abs"):
        assert (kl_penalty(lp, rf, kind) >= 0).all()
        assert (kl_penalty(lp, lp, kind) == 0).all()


# -------------------------------------------------------------------------------------------- entropy
def test_entropy_matches_loop_reference_and_handles_minus_inf():
    g = np.random.default_rng(1)
    logits = g.normal(size=(3, 4, 11)).astype(np.float32) * 4
    logits[0, 0, :5] = -np.inf
    want = ref.entropy_ref(logits)
    np.testing.assert_allclose(compute_entropy_from_logits(logits), want, **TOL)
    lt = t(logits).requires_grad_(True)
    ent = compute_entropy_from_logits(lt)
    np.testing.assert_allclose(ent.detach().numpy(), want, **TOL)
    ent.sum().backward()
    assert torch.isfinite(lt.grad).all()  # RLinf's where(p > 0, p*logp, 0) gives NaN here


def test_entropy_other_axis_and_bounds():
    logits = np.random.default_rng(2).normal(size=(6, 5))
    h = compute_entropy_from_logits(logits, dim=0)
    np.testing.assert_allclose(h, ref.entropy_ref(logits.T), **TOL)
    assert (h >= 0).all() and (h <= math.log(6) + 1e-9).all()
    np.testing.assert_allclose(compute_entropy_from_logits(np.zeros((2, 8))), [math.log(8)] * 2, **TOL)


def test_reshape_entropy():
    e = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 12)
    np.testing.assert_array_equal(
        reshape_entropy(e, "action_level", action_dim=4, batch_size=2), e.reshape(2, 3, 4).sum(-1)
    )
    np.testing.assert_array_equal(reshape_entropy(t(e), "chunk_level").numpy(), e.sum(-1))
    assert reshape_entropy(e, "token_level") is e
    assert reshape_entropy(None, "action_level") is None


# ---------------------------------------------------------------------------------------- aggregators
@pytest.mark.parametrize("name", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_aggregators_match_loop_references(name):
    g = np.random.default_rng(3)
    v = g.normal(size=(5, 7))
    m = g.random((5, 7)) < 0.6
    m[:, 0] = True
    fn = get_loss_agg_func(name.upper())
    want = ref.AGG_REFS[name](v, m)
    np.testing.assert_allclose(fn(v, m, None), want, **TOL)
    vt = t(v).requires_grad_(True)
    out = fn(vt, t(m), None)
    np.testing.assert_allclose(out.item(), want, **TOL)
    out.backward()
    assert (vt.grad[~t(m)] == 0).all()


def test_aggregator_edge_cases_match_rlinf():
    v = np.ones((2, 3))
    m = np.array([[True, True, False], [False, False, False]])
    assert seq_mean_token_sum(v, m) == pytest.approx(1.0)  # the empty row counts as 0
    with np.errstate(invalid="ignore"):
        assert math.isnan(seq_mean_token_mean(v, m))  # the empty row gives NaN
    assert masked_mean(v, np.zeros_like(m)) == 0.0
    np.testing.assert_allclose(
        masked_mean_ratio(v, m, np.full((2, 3), 0.5)), ref.masked_mean_ratio_ref(v, m, 0.5)
    )
    with np.errstate(invalid="ignore", divide="ignore"):
        assert math.isnan(
            masked_mean_ratio(v, m, np.zeros((2, 3)))
        )  # loss_mask_sum == 0 → NaN (RLinf pitfall)
    assert set(LOSS_AGG_FNS) == {"token-mean", "seq-mean-token-sum", "seq-mean-token-mean"}
    with pytest.raises(ValueError, match="valid names: token-mean"):
        get_loss_agg_func("mean")


# ------------------------------------------------------------------------------------ normalisation
@pytest.mark.parametrize("unbiased", [False, True])
def test_masked_normalization_matches_loop_reference(unbiased):
    g = np.random.default_rng(4)
    x = g.normal(size=(6, 5)).astype(np.float32) * 3 + 1
    m = g.random((6, 5)) < 0.7
    want = ref.masked_normalization_ref(x, m, unbiased=unbiased)
    out = masked_normalization(x, m, unbiased=unbiased)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, want, **TOL)
    np.testing.assert_allclose(masked_normalization(t(x), t(m), unbiased=unbiased).numpy(), want, **TOL)
    np.testing.assert_allclose(masked_normalization(x, None), ref.masked_normalization_ref(x, None), **TOL)


def test_masked_normalization_with_reduced_stats_equals_global():
    g = np.random.default_rng(5)
    x, m = g.normal(size=(8, 3)), g.random((8, 3)) < 0.8
    shards = [masked_stats(x[s], m[s], keepdims=True) for s in (slice(0, 5), slice(5, 8))]
    total = type(shards[0])(*(sum(getattr(s, f) for s in shards) for f in ("count", "sum", "sum_sq")))
    np.testing.assert_allclose(
        masked_normalization(x[:5], m[:5], stats=total), masked_normalization(x, m)[:5], rtol=1e-6, atol=1e-6
    )


def test_normalize_from_stats():
    g = np.random.default_rng(6)
    x = g.normal(size=(7, 4)).astype(np.float32) * 2 + 3
    st_ = masked_stats(t(x))
    out = normalize_from_stats(t(x), st_)
    assert out.dtype == torch.float32
    xs = x.astype(np.float64)
    want = (xs - xs.mean()) / np.sqrt(xs.var() + 1e-5)
    np.testing.assert_allclose(out.numpy(), want, **TOL)
    assert float(st_.count) == 28 and float(st_.mean) == pytest.approx(xs.mean())
    per_col = masked_stats(x, None, axis=0, keepdims=True)
    assert tuple(per_col.sum.shape) == (1, 4)
    np.testing.assert_allclose(per_col.var, x.astype(np.float64).var(axis=0, keepdims=True), rtol=1e-9)


@FAST
@given(seed=st.integers(0, 2**16), n=st.integers(3, 40))
def test_property_masked_normalization_standardises_valid_entries(seed, n):
    g = np.random.default_rng(seed)
    x = g.normal(size=n) * g.uniform(0.5, 5) + g.uniform(-3, 3)
    m = g.random(n) < 0.7
    m[:2] = True
    x[1] = x[0] + 1.0  # non-zero variance
    out = masked_normalization(x, m).astype(np.float64)
    valid = out[m]
    # (x - mean) / (std + eps): mean 0 exactly, population std slightly below 1
    assert abs(valid.mean()) < 1e-5
    assert 0.99 < valid.std() <= 1.0 + 1e-6
