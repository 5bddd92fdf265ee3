"""Slow, obvious loop references for the losses, written from docs/algorithms.md#losses.

Every reference walks the entries one by one with Python floats (float64). Inputs are numpy arrays.
"""

from __future__ import annotations

import math
from itertools import product

import numpy as np


def _idx(shape):
    return product(*(range(s) for s in shape))


def _b(x, shape):
    """Read-only broadcast view (the references index entries of the loss shape)."""
    return np.broadcast_to(np.asarray(x), shape)


# ---------------------------------------------------------------------------------------- aggregators
def masked_mean_ref(values, mask):
    values = np.asarray(values, dtype=np.float64)
    if mask is None:
        return sum(values.flat) / values.size
    m = _b(mask, values.shape)
    total = 0.0
    for i in _idx(values.shape):
        total += values[i] * float(m[i])
    den = float(np.asarray(mask, dtype=np.float64).sum())  # counts MASK entries (not broadcast)
    return total if den == 0 else total / den


def seq_mean_token_sum_ref(values, mask):
    values = np.asarray(values, dtype=np.float64)
    m = _b(mask, values.shape)
    rows = list(_idx(values.shape[:-1]))
    sums = [sum(values[(*r, t)] * float(m[(*r, t)]) for t in range(values.shape[-1])) for r in rows]
    return sum(sums) / len(sums)


def seq_mean_token_mean_ref(values, mask):
    values = np.asarray(values, dtype=np.float64)
    m = _b(mask, values.shape)
    out = []
    for r in _idx(values.shape[:-1]):
        num = sum(values[(*r, t)] * float(m[(*r, t)]) for t in range(values.shape[-1]))
        den = sum(float(m[(*r, t)]) for t in range(values.shape[-1]))
        out.append(num / den if den else math.nan)
    return sum(out) / len(out)


def masked_mean_ratio_ref(values, mask, ratio):
    values = np.asarray(values, dtype=np.float64)
    shape = np.broadcast_shapes(values.shape, np.shape(mask), np.shape(ratio))
    v, m, r = _b(values, shape), _b(mask, shape), _b(ratio, shape)
    total = 0.0
    for i in _idx(shape):
        total += v[i] / float(r[i]) * float(m[i])
    return total / math.prod(shape)


AGG_REFS = {
    "token-mean": masked_mean_ref,
    "seq-mean-token-sum": seq_mean_token_sum_ref,
    "seq-mean-token-mean": seq_mean_token_mean_ref,
}


# ------------------------------------------------------------------------------------------ PPO actor
def ppo_actor_ref(
    lp,
    old,
    adv,
    mask,
    *,
    low,
    high,
    c=None,
    agg="token-mean",
    max_episode_steps=None,
    loss_mask_sum=None,
    lr_min=None,
    lr_max=None,
    critic_warmup=False,
):
    lp, old = np.asarray(lp, np.float64), np.asarray(old, np.float64)
    shape = lp.shape
    use_ratio = max_episode_steps is not None and loss_mask_sum is not None and mask is not None
    if mask is None:
        mask = np.ones(shape, bool)
    A, M = _b(adv, shape), _b(mask, shape).astype(bool)
    loss = np.zeros(shape)
    ratio = np.zeros(shape)
    clipped = np.zeros(shape)
    n_clip = n_kl = 0.0
    dual_ratio = np.zeros(shape)
    for i in _idx(shape):
        lr = lp[i] - old[i]
        if lr_min is not None:
            lr = max(lr, lr_min)
        if lr_max is not None:
            lr = min(lr, lr_max)
        r = math.exp(lr) if M[i] else 0.0
        cr = min(max(r, 1 - low), 1 + high)
        a = float(A[i])
        l1, l2 = -a * r, -a * cr
        ell = max(l1, l2)
        if c is not None:
            l3 = c * abs(a)
            if l3 < ell and M[i]:
                dual_ratio[i] = r
            ell = min(ell, l3)
        loss[i], ratio[i], clipped[i] = ell, r, cr
        if l1 < l2 and M[i]:
            n_clip += 1
        if M[i]:
            n_kl += lr
    if use_ratio:
        agg_fn = lambda v: masked_mean_ratio_ref(v, mask, np.asarray(loss_mask_sum) / max_episode_steps)  # noqa: E731
    else:
        agg_fn = lambda v: AGG_REFS[agg](v, mask)  # noqa: E731
    cnt = int(np.count_nonzero(mask)) or 1
    mshape = np.shape(mask)
    metric_mask = mask
    if len(shape) > 2 and mshape[-1] == 1 and shape[-1] > 1:
        metric_mask = np.broadcast_to(mask, shape)
    policy_loss = 0.0 if critic_warmup else agg_fn(loss)
    metrics = {
        "actor/policy_loss": policy_loss,
        "actor/policy_loss_abs": agg_fn(np.abs(loss)),
        "actor/ratio": masked_mean_ref(ratio, metric_mask),
        "actor/ratio_abs": masked_mean_ref(np.abs(ratio - 1), metric_mask),
        "actor/clipped_ratio": masked_mean_ref(clipped, metric_mask),
        "actor/dual_cliped_ratio": masked_mean_ref(dual_ratio, metric_mask),
        "actor/approx_kl": -n_kl / cnt,
        "actor/clip_fraction": n_clip / cnt,
    }
    return policy_loss, metrics


def ppo_actor_grad_ref(lp, old, adv, mask, *, low, high, c=None):
    """d(sum over valid entries of the per-entry loss)/d logprobs, entry by entry (no aggregation)."""
    lp, old = np.asarray(lp, np.float64), np.asarray(old, np.float64)
    shape = lp.shape
    A, M = _b(adv, shape), _b(mask, shape).astype(bool)
    g = np.zeros(shape)
    for i in _idx(shape):
        if not M[i]:
            continue
        r = math.exp(lp[i] - old[i])
        a = float(A[i])
        clip_binds = -a * min(max(r, 1 - low), 1 + high) > -a * r
        ell = -a * min(max(r, 1 - low), 1 + high) if clip_binds else -a * r
        if c is not None and c * abs(a) < ell:
            continue  # dual clip: constant in logprobs
        g[i] = 0.0 if clip_binds else -a * r
    return g


# ----------------------------------------------------------------------------------------- PPO critic
def huber_ref(e, d):
    return 0.5 * e * e if abs(e) < d else d * (abs(e) - 0.5 * d)


def ppo_critic_ref(
    values, returns, prev, mask, *, value_clip, huber_delta, max_episode_steps=None, loss_mask_sum=None
):
    dt = np.asarray(values).dtype.type  # value_clip_ratio is a rounding artefact: count it in the input dtype
    v32, p32, clip = np.asarray(values), np.asarray(prev), dt(value_clip)
    values, returns, prev = (np.asarray(x, np.float64) for x in (values, returns, prev))
    shape = values.shape
    loss = np.zeros(shape)
    clipped_count = 0
    for i in _idx(shape):
        vc = prev[i] + min(max(values[i] - prev[i], -value_clip), value_clip)
        loss[i] = max(huber_ref(returns[i] - values[i], huber_delta), huber_ref(returns[i] - vc, huber_delta))
        vc_dt = dt(p32[i] + min(max(dt(v32[i] - p32[i]), -clip), clip))
        clipped_count += abs(dt(vc_dt - p32[i])) > clip
    if max_episode_steps is not None and loss_mask_sum is not None and mask is not None:
        value_loss = masked_mean_ratio_ref(loss, mask, np.asarray(loss_mask_sum) / max_episode_steps)
    else:
        value_loss = masked_mean_ref(loss, mask)
    return value_loss, clipped_count / loss.size


def explained_variance_ref(returns, values, mask):
    returns, values = np.asarray(returns, np.float64), np.asarray(values, np.float64)
    m = np.ones(returns.shape, bool) if mask is None else _b(mask, returns.shape).astype(bool)
    rs = [returns[i] for i in _idx(returns.shape) if m[i]]
    es = [returns[i] - values[i] for i in _idx(returns.shape) if m[i]]
    n = len(rs)
    if n < 2:
        return math.nan
    rm, em = sum(rs) / n, sum(es) / n
    var_r = sum((x - rm) ** 2 for x in rs) / n
    var_e = sum((x - em) ** 2 for x in es) / n
    return math.nan if var_r == 0 else 1 - var_e / var_r


# -------------------------------------------------------------------------------------- decoupled PPO
def decoupled_ref(
    lp, old, adv, mask, *, low, high, prox=None, versions=None, current_version=None, c=None, threshold=None
):
    lp, old = np.asarray(lp, np.float64), np.asarray(old, np.float64)
    shape = lp.shape
    M = np.ones(shape, bool) if mask is None else _b(mask, shape).astype(bool)
    A = _b(adv, shape)
    if prox is None:
        if versions is None or current_version is None:
            prox = old
        else:
            prox = np.zeros(shape)
            V = _b(versions, shape)
            for i in _idx(shape):
                vb, vt = float(V[i]), float(current_version)
                alpha = (vt - 1 - vb) / (vt - vb) if (vt - vb > 0 and V[i] >= 0) else 0.0
                alpha = min(max(alpha, 0.0), 1.0)
                prox[i] = old[i] + alpha * (lp[i] - old[i])
    prox = np.asarray(prox, np.float64)
    num = den_b = 0.0
    n_clip = n_dual = 0
    pr_sum = cpr_sum = kl_p = kl_b = 0.0
    cnt = int(M.sum()) or 1
    for i in _idx(shape):
        r = math.exp(lp[i] - prox[i]) if M[i] else 0.0
        cr = min(max(r, 1 - low), 1 + high)
        a = float(A[i])
        l1, l2 = -a * r, -a * cr
        pg = max(l1, l2)
        if c is not None:
            l3 = c * abs(a)
            if l3 < pg and M[i]:
                n_dual += 1
            pg = min(pg, l3)
        w = math.exp(prox[i] - old[i])
        keep = M[i] and (threshold is None or w <= threshold)
        if keep:
            num += pg * w
            den_b += 1
            kl_b += prox[i] - old[i]
        if M[i]:
            n_clip += l1 < l2
            pr_sum += r
            cpr_sum += cr
            kl_p += lp[i] - prox[i]
    bc = int(den_b) or 1
    m_count = int(M.sum())
    metrics = {
        "actor/policy_loss": num / den_b if den_b else num,
        "actor/proximal_ratio": pr_sum / m_count if m_count else 0.0,
        "actor/clipped_proximal_ratio": cpr_sum / m_count if m_count else 0.0,
        "actor/clip_fraction": n_clip / cnt,
        "actor/dual_clip_fraction": n_dual / cnt,
        "actor/behav_clip_fraction": 1.0 - bc / cnt,
        "actor/proximal_approx_kl": -kl_p / cnt,
        "actor/behav_approx_kl": -kl_b / bc,
    }
    if versions is not None and current_version is not None and np.shape(versions) == M.shape and M.any():
        vs = [float(np.asarray(versions)[i]) for i in _idx(shape) if M[i]]
        metrics["actor/average_version"] = sum(vs) / len(vs)
        metrics["actor/current_version"] = float(current_version)
    return metrics["actor/policy_loss"], metrics


# ---------------------------------------------------------------------------------------- KL, entropy
def kl_ref(lp, ref, kind):
    out = np.zeros(np.shape(lp))
    for i in _idx(out.shape):
        d = float(lp[i]) - float(ref[i])
        if kind in ("kl", "k1"):
            out[i] = d
        elif kind == "abs":
            out[i] = abs(d)
        elif kind in ("mse", "k2"):
            out[i] = 0.5 * d * d
        else:
            k = min(max(-d, -20.0), 20.0)
            out[i] = min(max(math.exp(k) - k - 1, -10.0), 10.0)
    return out


def entropy_ref(logits):
    logits = np.asarray(logits, np.float64)
    out = np.zeros(logits.shape[:-1])
    for i in _idx(out.shape):
        row = [float(x) for x in logits[i]]
        mx = max(row)
        z = sum(math.exp(x - mx) for x in row)
        h = 0.0
        for x in row:
            p = math.exp(x - mx) / z
            if p > 0:
                h -= p * math.log(p)
        out[i] = h
    return out


def masked_normalization_ref(x, mask, unbiased=False, eps=1e-5):
    x = np.asarray(x, np.float64)
    m = np.ones(x.shape) if mask is None else np.asarray(mask, np.float64)
    xs = [x[i] * m[i] for i in _idx(x.shape)]
    n = sum(m.flat)
    mean = sum(xs) / n
    var = sum(v * v for v in xs) / n - mean * mean
    if unbiased:
        var *= n / (n - 1)
    out = np.zeros(x.shape)
    for i in _idx(x.shape):
        out[i] = (x[i] * m[i] - mean) / (math.sqrt(var) + eps)
    return out
