"""rlinf-algos speed: GAE and the PPO actor loss on [T=1024, B=4096] float32 torch tensors.

Each of ours is timed against a straightforward torch implementation of the same math (RLinf 0.4's
formulation, written inline below) in the same process, interleaved run by run so background load hits
both alike. The outputs are checked to agree before timing. Target: ours <= 1.2x the baseline's median.

    uv run python bench/algos.py [--T 1024] [--B 4096] [--repeats 9] [--threads N]

- GAE: gamma 0.99, lambda 0.95, dones ~1 %, normalised advantages over a ~90 % loss mask.
- PPO loss: clip 0.2 / clip-higher 0.28, dual clip c = 3, token-mean over the mask, the RLinf metric set,
  forward and backward (gradient w.r.t. logprobs).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from rlinf_algos import compute_ppo_actor_loss, gae


# ------------------------------------------------------------------------------------------ baselines
def baseline_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    dones: torch.Tensor,
    loss_mask: torch.Tensor,
    gamma: float,
    gae_lambda: float,
    normalize: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-step loop writing into preallocated returns, then masked standardisation (RLinf's code shape)."""
    steps = rewards.shape[0]
    returns = torch.zeros_like(rewards)
    acc: torch.Tensor | float = 0.0
    for t in reversed(range(steps)):
        not_done = ~dones[t + 1]
        delta = rewards[t] + gamma * values[t + 1] * not_done - values[t]
        acc = delta + gamma * gae_lambda * not_done * acc
        returns[t] = acc + values[t]
    advantages = returns - values[:-1]
    if not normalize:
        return advantages, returns
    valid = advantages[loss_mask]
    advantages = (advantages - valid.mean()) / (valid.std() + 1e-5)
    return advantages, returns


def baseline_ppo(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    clip_c: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The PPO dual-clip surrogate and its metrics, op by op as in docs/algorithms.md#ppo-actor-loss."""
    count = loss_mask.count_nonzero().clamp_min(1)
    fmask = loss_mask.float()
    log_ratio = logprobs - old_logprobs
    ratio = torch.where(loss_mask, torch.exp(log_ratio), 0.0)
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss1 = -advantages * ratio
    loss2 = -advantages * clipped
    loss = torch.max(loss1, loss2)
    loss3 = torch.sign(advantages) * clip_c * advantages
    dual = loss3 < loss
    loss = torch.min(loss, loss3)

    def masked_mean(x: torch.Tensor) -> torch.Tensor:
        return (x * fmask).sum() / fmask.sum()

    policy_loss = masked_mean(loss)
    with torch.no_grad():
        metrics = {
            "actor/policy_loss": policy_loss.detach(),
            "actor/policy_loss_abs": masked_mean(loss.abs()),
            "actor/ratio": masked_mean(ratio),
            "actor/ratio_abs": masked_mean((ratio - 1).abs()),
            "actor/clipped_ratio": masked_mean(clipped),
            "actor/dual_cliped_ratio": masked_mean(torch.where(dual & loss_mask, ratio, 0.0)),
            "actor/approx_kl": -torch.where(loss_mask, log_ratio, 0.0).sum() / count,
            "actor/clip_fraction": ((loss1 < loss2) & loss_mask).sum() / count,
        }
    return policy_loss, metrics


# ------------------------------------------------------------------------------------------- timing
def median_seconds(fn: Callable[[], Any], repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def interleaved(ours: Callable[[], Any], base: Callable[[], Any], repeats: int) -> tuple[float, float]:
    ours()  # warm-up (allocator, dispatcher caches)
    base()
    t_ours: list[float] = []
    t_base: list[float] = []
    for _ in range(repeats):
        t_ours += median_seconds(ours, 1)
        t_base += median_seconds(base, 1)
    return statistics.median(t_ours), statistics.median(t_base)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--T", type=int, default=1024)
    parser.add_argument("--B", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0 = torch default)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    g = torch.Generator().manual_seed(0)
    T, B = args.T, args.B
    rewards = torch.randn(T, B, generator=g)
    values = torch.randn(T + 1, B, generator=g)
    dones = torch.rand(T + 1, B, generator=g) < 0.01
    loss_mask = torch.rand(T, B, generator=g) < 0.9
    gamma, lam = 0.99, 0.95

    ours_adv, ours_ret = gae(rewards, values, dones, gamma=gamma, gae_lambda=lam, loss_mask=loss_mask)
    base_adv, base_ret = baseline_gae(rewards, values, dones, loss_mask, gamma, lam)
    torch.testing.assert_close(ours_adv, base_adv, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours_ret, base_ret, rtol=1e-5, atol=1e-5)
    raw_ours, _ = gae(rewards, values, dones, gamma=gamma, gae_lambda=lam, normalize_advantages=False)
    raw_base, _ = baseline_gae(rewards, values, dones, loss_mask, gamma, lam, normalize=False)
    torch.testing.assert_close(raw_ours, raw_base, rtol=0, atol=0)  # same op order: bit-identical
    scan_ours, scan_base = interleaved(
        lambda: gae(rewards, values, dones, gamma=gamma, gae_lambda=lam, normalize_advantages=False),
        lambda: baseline_gae(rewards, values, dones, loss_mask, gamma, lam, normalize=False),
        args.repeats,
    )
    gae_ours, gae_base = interleaved(
        lambda: gae(rewards, values, dones, gamma=gamma, gae_lambda=lam, loss_mask=loss_mask),
        lambda: baseline_gae(rewards, values, dones, loss_mask, gamma, lam),
        args.repeats,
    )

    old_logprobs = torch.randn(T, B, generator=g) * 0.5 - 1.0
    logprobs_init = old_logprobs + 0.1 * torch.randn(T, B, generator=g)
    advantages = ours_adv.contiguous()
    clip_low, clip_high, clip_c = 0.2, 0.28, 3.0

    def run_ours() -> tuple[torch.Tensor, dict[str, Any]]:
        lp = logprobs_init.clone().requires_grad_(True)
        loss, metrics = compute_ppo_actor_loss(
            lp,
            old_logprobs,
            advantages,
            loss_mask,
            clip_ratio_low=clip_low,
            clip_ratio_high=clip_high,
            clip_ratio_c=clip_c,
        )
        loss.backward()
        return lp.grad, metrics

    def run_base() -> tuple[torch.Tensor, dict[str, Any]]:
        lp = logprobs_init.clone().requires_grad_(True)
        loss, metrics = baseline_ppo(lp, old_logprobs, advantages, loss_mask, clip_low, clip_high, clip_c)
        loss.backward()
        return lp.grad, metrics

    grad_ours, m_ours = run_ours()
    grad_base, m_base = run_base()
    torch.testing.assert_close(grad_ours, grad_base, rtol=1e-5, atol=1e-9)
    for key, val in m_base.items():
        torch.testing.assert_close(
            torch.as_tensor(m_ours[key]).float(), val.float(), rtol=1e-5, atol=1e-6, msg=key
        )
    ppo_ours, ppo_base = interleaved(run_ours, run_base, args.repeats)

    print(f"# rlinf-algos bench: T={T} B={B} float32 torch {torch.__version__}, threads={torch.get_num_threads()}, "
          f"repeats={args.repeats} (median)")  # fmt: skip
    print("| case | ours (ms) | baseline (ms) | ours / baseline |")
    print("|---|---:|---:|---:|")
    worst = 0.0
    cases = (
        ("GAE scan (normalize_advantages=False)", scan_ours, scan_base),
        ("GAE + masked normalisation", gae_ours, gae_base),
        ("PPO actor loss fwd+bwd", ppo_ours, ppo_base),
    )
    for name, ours_s, base_s in cases:
        ratio = ours_s / base_s
        worst = max(worst, ratio)
        print(f"| {name} | {ours_s * 1e3:.1f} | {base_s * 1e3:.1f} | {ratio:.2f}x |")
    print(f"worst ratio {worst:.2f}x (target <= 1.20x): {'PASS' if worst <= 1.2 else 'FAIL'}")
    return 0 if worst <= 1.2 else 1


if __name__ == "__main__":
    sys.exit(main())
