"""Slow, obvious loop references for the advantage tests, written from docs/algorithms.md (layouts, advantages).

Everything here works on nested Python loops over float64 numpy arrays, one element at a time, so it
shares no code path with the vectorised implementations under test.
"""

from __future__ import annotations

import math

import numpy as np


def _std(xs: list[float]) -> float:
    n = len(xs)
    if n < 2:
        return math.nan
    m = sum(xs) / n
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))


def safe_normalize(a: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    flat = a.reshape(-1)
    sel = [
        float(x)
        for x, keep in zip(flat, np.ones_like(flat, bool) if mask is None else mask.reshape(-1), strict=True)
        if keep
    ]
    if not sel:
        return a.copy()
    m = sum(sel) / len(sel)
    return (a - m) / (_std(sel) + 1e-5)


def gae(r, v, d, gamma, lam, normalize_advantages=False, normalize_returns=False, loss_mask=None):
    r = np.asarray(r, np.float64)
    T, B = r.shape
    adv = np.zeros((T, B))
    ret = np.zeros((T, B))
    critic_free = v is None
    if critic_free:
        gamma = lam = 1.0
    for b in range(B):
        acc = 0.0
        for t in reversed(range(T)):
            nd = 1.0 if d is None else float(not d[t + 1, b])
            delta = r[t, b] if critic_free else r[t, b] + gamma * v[t + 1, b] * nd - v[t, b]
            acc = delta + gamma * lam * nd * acc
            adv[t, b] = acc
            ret[t, b] = acc if critic_free else acc + v[t, b]
    if normalize_advantages:
        adv = safe_normalize(adv, loss_mask)
    if normalize_returns:
        ret = safe_normalize(ret, loss_mask)
    return adv, ret


def grpo(rewards, mask, group_size):
    flat = [float(x) for x in np.asarray(rewards, np.float64).reshape(-1)]
    per_seq = []
    for g in range(len(flat) // group_size):
        grp = flat[g * group_size : (g + 1) * group_size]
        m, s = sum(grp) / len(grp), _std(grp)
        per_seq += [(x - m) / (s + 1e-6) for x in grp]
    L, B = mask.shape
    return np.array([[per_seq[b] * float(mask[t, b]) for b in range(B)] for t in range(L)])


def grpo_video(rewards, mask, group_size, mode):
    r = np.asarray(rewards, np.float64)
    S, B = r.shape
    out = np.zeros((S, B))
    for g in range(B // group_size):
        cols = range(g * group_size, (g + 1) * group_size)
        if mode == "video":
            vals = [r[s, c] for s in range(S) for c in cols]
            m, sd = sum(vals) / len(vals), _std(vals)
            for s in range(S):
                for c in cols:
                    out[s, c] = (r[s, c] - m) / (sd + 1e-6)
        else:
            for s in range(S):
                vals = [r[s, c] for c in cols]
                m, sd = sum(vals) / len(vals), _std(vals)
                for c in cols:
                    out[s, c] = (r[s, c] - m) / (sd + 1e-6)
    return out * np.asarray(mask, np.float64)


def grpo_dynamic(rewards, mask, group_size, idx_to_traj, mode):
    r = [float(x) for x in np.asarray(rewards, np.float64).reshape(-1)]
    n = len(idx_to_traj)
    num_traj = max(idx_to_traj) + 1
    turn_adv = [0.0] * n
    if mode == "trajectory":
        traj_mean = []
        for tr in range(num_traj):
            vals = [r[i] for i in range(n) if idx_to_traj[i] == tr]
            traj_mean.append(sum(vals) / len(vals) if vals else 0.0)
        norm = [0.0] * num_traj
        for q in range(num_traj // group_size):
            grp = traj_mean[q * group_size : (q + 1) * group_size]
            m, s = sum(grp) / len(grp), _std(grp)
            for k, x in enumerate(grp):
                norm[q * group_size + k] = (x - m) / (s + 1e-6)
        turn_adv = [norm[idx_to_traj[i]] for i in range(n)]
    else:
        for q in range(num_traj // group_size):
            members = [i for i in range(n) if idx_to_traj[i] // group_size == q]
            vals = [r[i] for i in members]
            if not vals:
                continue
            m, s = sum(vals) / len(vals), _std(vals)
            for i in members:
                turn_adv[i] = (r[i] - m) / (s + 1e-6)
    L = mask.shape[0]
    return np.array([[turn_adv[b] * float(mask[t, b]) for b in range(n)] for t in range(L)])


def reinpp(rewards, mask, group_size=None, baseline=False, kl_beta=0.0, kl=None):
    r = [float(x) for x in np.asarray(rewards, np.float64).reshape(-1)]
    L, B = mask.shape
    if baseline:
        out = []
        for g in range(B // group_size):
            grp = r[g * group_size : (g + 1) * group_size]
            out += [x - sum(grp) / len(grp) for x in grp]
        r = out
    rm = np.zeros((L, B))
    for b in range(B):
        valid = [t for t in range(L) if mask[t, b]]
        rm[valid[-1] if valid else L - 1, b] = r[b]
    if kl_beta > 0:
        rm = rm - kl_beta * np.asarray(kl, np.float64)
    ret = np.zeros((L, B))
    for b in range(B):
        acc = 0.0
        for t in reversed(range(L)):
            acc += rm[t, b]
            ret[t, b] = acc
    sel = [ret[t, b] for t in range(L) for b in range(B) if mask[t, b]]
    m = sum(sel) / len(sel)
    var = sum((x - m) ** 2 for x in sel) / len(sel)
    return (ret - m) / math.sqrt(max(var, 1e-8))


def raw(rewards, mask, normalize):
    r = np.asarray(rewards, np.float64).reshape(-1)
    L, B = mask.shape
    adv = np.array([[r[b] * float(mask[t, b]) for b in range(B)] for t in range(L)])
    return safe_normalize(adv, mask) if normalize else adv


def compute_loss_mask(dones):
    """Per env: walk the flat step sequence; valid until and including the first raised done."""
    d = np.asarray(dones, bool)
    T1, E, C = d.shape
    T = T1 - 1
    mask = np.zeros((T, E, C), bool)
    for e in range(E):
        ended = False
        for t in range(T):
            for k in range(C):
                # The done flag that closes step (t, k) is dones[t + 1, e, k]; an episode that ended before
                # the first step (the last flag of row 0) masks everything.
                if t == 0 and k == 0 and d[0, e, C - 1]:
                    ended = True
                mask[t, e, k] = not ended
                if d[t + 1, e, k]:
                    ended = True
    counts = mask.sum(axis=(0, 2))
    return mask, np.broadcast_to(counts[None, :, None], mask.shape)


def calculate_scores(rewards, dones, group_size):
    """First-episode undiscounted return: sum rewards from step 0 until (incl.) the first done."""
    r = np.asarray(rewards, np.float64)
    n, E = r.shape
    out = []
    for e in range(E):
        s = 0.0
        for t in range(n):
            s += r[t, e]
            if dones[t + 1, e]:
                break
        out.append(s)
    return np.array(out).reshape(-1, group_size)


def flatten_embodied(x, rows):
    """[N, E, c] -> [N*c, E] with step index n*c + k, element by element."""
    N, E, c = x.shape
    out = np.zeros((N * c, E), dtype=x.dtype)
    for n in range(N):
        for k in range(c):
            for e in range(E):
                out[n * c + k, e] = x[n, e, k]
    return out[:rows] if rows >= 0 else out[rows:]


def unflatten_embodied(x, num_chunk, chunk):
    _, E = x.shape
    out = np.zeros((num_chunk, E, chunk), dtype=x.dtype)
    for t in range(num_chunk):
        for k in range(chunk):
            for e in range(E):
                out[t, e, k] = x[t * chunk + k, e]
    return out
