"""Denoising chains of a flow-matching action expert: ODE and SDE sampling, chain log-probabilities, the SFT loss.

See the package docstring (:mod:`rlinf_models.flow`) for the conventions and the math.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

import torch
from torch import Tensor

__all__ = [
    "NOISE_METHODS",
    "FlowSample",
    "NoiseMethod",
    "VelocityField",
    "chain_log_prob",
    "flow_matching_loss",
    "gaussian_entropy",
    "gaussian_log_prob",
    "rsample_chain",
    "sample_chain",
    "sample_flow_times",
    "sde_sigmas",
    "select_denoise_steps",
    "step_mean_std",
    "timesteps",
]

NoiseMethod: TypeAlias = Literal["flow_ode", "flow_sde", "flow_noise"]
NOISE_METHODS: tuple[str, ...] = ("flow_ode", "flow_sde", "flow_noise")
"""``flow_ode``: deterministic Euler steps; ``flow_sde``: πRL's Flow-SDE; ``flow_noise``: πRL's Flow-Noise."""

VelocityField: TypeAlias = Callable[[Tensor, Tensor, Any], tuple[Tensor, Tensor | None]]
"""``field(x_t [B, C, D], t [B], cond) -> (velocity [B, C, D], noise_std [B, C, D] or None)``.

``cond`` is whatever the network conditions on (observation features, a VLM's key/value cache); the functions
here only pass it through. ``noise_std`` is the learned per-step standard deviation of Flow-Noise (positive);
fields used with ``flow_ode`` / ``flow_sde`` may return ``None``.
"""


def timesteps(num_steps: int, *, dtype: torch.dtype = torch.float32, device: Any = None) -> Tensor:
    """The ``K + 1`` times ``1, (K-1)/K, ..., 1/K, 0`` of ``K = num_steps`` Euler steps (noise at 1, actions at 0)."""
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    t = torch.linspace(1.0, 1.0 / num_steps, num_steps, dtype=dtype, device=device)
    return torch.cat([t, torch.zeros(1, dtype=dtype, device=device)])


def sde_sigmas(
    num_steps: int, noise_level: float, *, dtype: torch.dtype = torch.float32, device: Any = None
) -> Tensor:
    """Flow-SDE's diffusion coefficients ``σ_k = a · sqrt(t_k / (1 - t_k))`` of the ``K`` steps, ``a = noise_level``.

    At ``t_0 = 1`` the ratio is infinite; πRL (and RLinf) take ``1 - t_1`` as its denominator instead.
    Returns ``[K]``.
    """
    t = timesteps(num_steps, dtype=dtype, device=device)[:-1]
    denom = 1 - torch.where(t == 1, t[1] if num_steps > 1 else torch.zeros_like(t[0]), t)
    return noise_level * torch.sqrt(t / denom)


def step_mean_std(
    x_t: Tensor,
    velocity: Tensor,
    noise_std: Tensor | None,
    step: Tensor,
    num_steps: int,
    *,
    noise_method: NoiseMethod,
    noise_level: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """Mean and standard deviation of the Gaussian transition ``x_{k+1} | x_k`` of denoising step ``k``.

    With ``t = t_k``, ``δ = t_k - t_{k+1}``, ``â = x - t·v`` (the predicted action) and ``ε̂ = x + (1 - t)·v``
    (the predicted noise), the mean is ``â·(1 - t + δ) + ε̂·w`` with

    - ``flow_ode`` / ``flow_noise``: ``w = t - δ`` (the Euler step ``x - δ·v``); std 0 (ODE) or the field's
      ``noise_std`` (Flow-Noise);
    - ``flow_sde``: ``w = t - δ - σ_k²·δ / (2t)`` and std ``σ_k·sqrt(δ)`` (:func:`sde_sigmas`): the Euler-Maruyama
      step of the SDE whose marginals equal the ODE's.

    Args:
        x_t: ``[B, C, D]`` the chain at step ``k``.
        velocity: ``[B, C, D]`` the field's velocity there.
        noise_std: ``[B, C, D]`` the field's learned std (``flow_noise`` only).
        step: ``[B]`` int64 step index ``k`` of each row, in ``[0, K)``.
        num_steps: ``K``.
        noise_method: see :data:`NOISE_METHODS`.
        noise_level: Flow-SDE's ``a``.

    Returns:
        ``(mean, std)``, both ``[B, C, D]``.
    """
    times = timesteps(num_steps, dtype=x_t.dtype, device=x_t.device)
    shape = (-1,) + (1,) * (x_t.ndim - 1)
    t = times[step].view(shape)
    delta = (times[step] - times[step + 1]).view(shape)
    action_pred = x_t - velocity * t
    noise_pred = x_t + velocity * (1 - t)
    if noise_method == "flow_sde":
        sigma = sde_sigmas(num_steps, noise_level, dtype=x_t.dtype, device=x_t.device)[step].view(shape)
        weight = t - delta - sigma**2 * delta / (2 * t)
        std = (torch.sqrt(delta) * sigma).expand_as(x_t)
    elif noise_method == "flow_noise":
        if noise_std is None:
            raise ValueError("noise_method 'flow_noise' needs a field that returns noise_std")
        weight = t - delta
        std = noise_std
    elif noise_method == "flow_ode":
        weight = t - delta
        std = torch.zeros_like(x_t)
    else:
        raise ValueError(f"noise_method must be one of {', '.join(NOISE_METHODS)}, got {noise_method!r}")
    return action_pred * (1 - t + delta) + noise_pred * weight, std


def gaussian_log_prob(x: Tensor, mean: Tensor, std: Tensor) -> Tensor:
    """Element-wise ``log N(x; mean, std²)``; 0 where ``std == 0`` (a deterministic step has no density)."""
    zero = std == 0
    safe = torch.where(zero, torch.ones_like(std), std)
    logp = -0.5 * ((x - mean) / safe) ** 2 - torch.log(safe) - 0.5 * math.log(2 * math.pi)
    return torch.where(zero, torch.zeros_like(logp), logp)


def gaussian_entropy(std: Tensor) -> Tensor:
    """Element-wise entropy ``0.5·log(2πe·std²)`` of a Gaussian; 0 where ``std == 0``."""
    zero = std == 0
    safe = torch.where(zero, torch.ones_like(std), std)
    ent = 0.5 * math.log(2 * math.pi * math.e) + torch.log(safe)
    return torch.where(zero, torch.zeros_like(ent), ent)


def select_denoise_steps(
    batch: int, num_steps: int, *, joint: bool, device: Any = None, generator: torch.Generator | None = None
) -> Tensor:
    """Which denoising steps of each chain are stochastic: ``[B, K]`` bool.

    ``joint``: all of them (the log-probability is the joint one of the whole chain). Otherwise one step per
    row, uniform in ``[0, K)``, and the others are ODE steps: πRL's hybrid ODE-SDE sampling for Flow-SDE, which
    makes the chain a one-step Gaussian policy whose step is drawn at random.
    """
    if joint:
        return torch.ones(batch, num_steps, dtype=torch.bool, device=device)
    pick = torch.randint(0, num_steps, (batch,), generator=generator, device=device)
    return torch.nn.functional.one_hot(pick, num_steps).bool()


@dataclass(frozen=True)
class FlowSample:
    """One sampled denoising chain per row.

    Attributes:
        actions: ``[B, C, D]`` the chain's end ``x_K`` (time 0).
        chain: ``[B, K + 1, C, D]`` ``x_0`` (the initial noise, time 1) to ``x_K``; with ``denoise_mask`` it is
            all :func:`chain_log_prob` needs to recompute the log-probability at train time.
        denoise_mask: ``[B, K]`` bool, the steps that were stochastic.
        logprobs: ``[B, C, D]`` sum over the stochastic steps of the per-element transition log-densities.
    """

    actions: Tensor
    chain: Tensor
    denoise_mask: Tensor
    logprobs: Tensor


def sample_chain(
    field: VelocityField,
    cond: Any,
    noise: Tensor,
    *,
    num_steps: int,
    noise_method: NoiseMethod,
    noise_level: float = 0.0,
    denoise_mask: Tensor | None = None,
    generator: torch.Generator | None = None,
) -> FlowSample:
    """Integrate from ``noise`` (time 1) to actions (time 0) in ``K`` Euler steps, recording the chain.

    Args:
        field: the velocity field (see :data:`VelocityField`).
        cond: passed to ``field`` unchanged.
        noise: ``[B, C, D]`` the initial point ``x_0``.
        num_steps: ``K``.
        noise_method: ``flow_ode`` ignores ``denoise_mask``: every step is deterministic, the log-probs are 0 and
            the returned mask is all false.
        noise_level: Flow-SDE's ``a``.
        denoise_mask: ``[B, K]`` the stochastic steps (:func:`select_denoise_steps`; default: all). A row's
            other steps take the ODE mean.
        generator: for the Gaussian draws (on ``noise``'s device).

    Returns:
        The chain, its end and its log-probability.
    """
    b = noise.shape[0]
    if noise_method == "flow_ode":
        denoise_mask = torch.zeros(b, num_steps, dtype=torch.bool, device=noise.device)
    elif denoise_mask is None:
        denoise_mask = torch.ones(b, num_steps, dtype=torch.bool, device=noise.device)
    times = timesteps(num_steps, dtype=noise.dtype, device=noise.device)
    x = noise
    chain = [x]
    logprobs = torch.zeros_like(noise)
    keep_shape = (-1,) + (1,) * (noise.ndim - 1)
    for k in range(num_steps):
        step = torch.full((b,), k, dtype=torch.long, device=noise.device)
        velocity, noise_std = field(x, times[k].expand(b), cond)
        mean, _ = step_mean_std(x, velocity, None, step, num_steps, noise_method="flow_ode")
        std = torch.zeros_like(x)
        stochastic = denoise_mask[:, k].view(keep_shape)
        if noise_method != "flow_ode" and bool(stochastic.any()):
            # A row's deterministic steps keep the ODE mean (Flow-SDE's mean differs from it).
            sde_mean, sde_std = step_mean_std(
                x, velocity, noise_std, step, num_steps, noise_method=noise_method, noise_level=noise_level
            )
            mean = torch.where(stochastic, sde_mean, mean)
            std = torch.where(stochastic, sde_std, std)
        x = mean + std * torch.randn(x.shape, generator=generator, dtype=x.dtype, device=x.device)
        logprobs = logprobs + gaussian_log_prob(x, mean, std)
        chain.append(x)
    return FlowSample(
        actions=x, chain=torch.stack(chain, dim=1), denoise_mask=denoise_mask, logprobs=logprobs
    )


def rsample_chain(
    field: VelocityField,
    cond: Any,
    noise: Tensor,
    *,
    noise_method: NoiseMethod,
    noise_level: float = 0.0,
) -> FlowSample:
    """The reparameterised chain of given standard-normal draws, every step stochastic (SAC-Flow's actor).

    ``x_0 = noise[:, 0]`` and ``x_{k+1} = μ_k(x_k) + std_k(x_k)·noise[:, k + 1]`` (:func:`step_mean_std`), so
    the actions are a differentiable function of the field's weights given the draws: the K-step sampler is
    back-propagated through as a recurrent network (SAC Flow, arXiv 2509.25756, section 4). ``flow_ode`` ignores
    the step draws (the ODE from ``x_0``; log-probs 0).

    Args:
        field: the velocity field.
        cond: passed to ``field`` unchanged.
        noise: ``[B, K + 1, C, D]`` standard-normal draws: the initial point, then one per step.
        noise_method: ``flow_sde``, ``flow_noise`` or ``flow_ode``.
        noise_level: Flow-SDE's ``a``.

    Returns:
        The chain (with autograd), an all-true ``denoise_mask`` (none for ``flow_ode``) and the per-element
        sum of the step log-densities ``[B, C, D]`` (the initial draw's density is not included).
    """
    b, k_plus_1 = noise.shape[:2]
    num_steps = k_plus_1 - 1
    stochastic = noise_method != "flow_ode"
    times = timesteps(num_steps, dtype=noise.dtype, device=noise.device)
    x = noise[:, 0]
    chain = [x]
    logprobs = torch.zeros_like(x)
    for k in range(num_steps):
        step = torch.full((b,), k, dtype=torch.long, device=noise.device)
        velocity, noise_std = field(x, times[k].expand(b), cond)
        mean, std = step_mean_std(
            x, velocity, noise_std, step, num_steps, noise_method=noise_method, noise_level=noise_level
        )
        x = mean + std * noise[:, k + 1] if stochastic else mean
        logprobs = logprobs + gaussian_log_prob(x, mean, std)
        chain.append(x)
    mask = torch.full((b, num_steps), stochastic, dtype=torch.bool, device=noise.device)
    return FlowSample(actions=x, chain=torch.stack(chain, dim=1), denoise_mask=mask, logprobs=logprobs)


def chain_log_prob(
    field: VelocityField,
    cond: Any,
    chain: Tensor,
    denoise_mask: Tensor,
    *,
    noise_method: NoiseMethod,
    noise_level: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """Log-probability and entropy of stored chains under the current field (the train-time recomputation).

    The field is evaluated only where needed: once on the selected rows' step when every row has exactly one
    stochastic step (Flow-SDE's hybrid sampling), else once per step that is stochastic in some row.

    Args:
        field: the velocity field.
        cond: passed to ``field`` unchanged (one row per chain).
        chain: ``[B, K + 1, C, D]`` from :class:`FlowSample`.
        denoise_mask: ``[B, K]`` from :class:`FlowSample`.
        noise_method: ``flow_sde`` or ``flow_noise``.
        noise_level: Flow-SDE's ``a``.

    Returns:
        ``(logprobs, entropy)``, both ``[B, C, D]``: the sum over the stochastic steps of the transition
        log-densities of ``chain[:, k + 1]``, and the mean over them of the transition entropies (both 0 for a
        row without stochastic steps, e.g. a chain sampled deterministically).
    """
    if noise_method == "flow_ode":
        raise ValueError("the ODE has no density: use noise_method 'flow_sde' or 'flow_noise'")
    b, k_plus_1 = chain.shape[:2]
    num_steps = k_plus_1 - 1
    mask = denoise_mask.bool()
    rows = torch.arange(b, device=chain.device)
    times = timesteps(num_steps, dtype=chain.dtype, device=chain.device)
    counts = mask.sum(dim=1)
    if bool((counts == 1).all()):
        step = mask.float().argmax(dim=1)
        x = chain[rows, step]
        velocity, noise_std = field(x, times[step], cond)
        mean, std = step_mean_std(
            x, velocity, noise_std, step, num_steps, noise_method=noise_method, noise_level=noise_level
        )
        return gaussian_log_prob(chain[rows, step + 1], mean, std), gaussian_entropy(std)
    logprobs = torch.zeros_like(chain[:, 0])
    entropy = torch.zeros_like(chain[:, 0])
    expand = (-1,) + (1,) * (chain.ndim - 2)
    for k in range(num_steps):
        if not bool(mask[:, k].any()):
            continue
        step = torch.full((b,), k, dtype=torch.long, device=chain.device)
        velocity, noise_std = field(chain[:, k], times[k].expand(b), cond)
        mean, std = step_mean_std(
            chain[:, k],
            velocity,
            noise_std,
            step,
            num_steps,
            noise_method=noise_method,
            noise_level=noise_level,
        )
        keep = mask[:, k].view(expand)
        logprobs = logprobs + torch.where(keep, gaussian_log_prob(chain[:, k + 1], mean, std), 0.0)
        entropy = entropy + torch.where(keep, gaussian_entropy(std), 0.0)
    return logprobs, entropy / counts.clamp(min=1).view(expand).to(entropy.dtype)


def sample_flow_times(batch: int, *, device: Any = None, generator: torch.Generator | None = None) -> Tensor:
    """Training times ``[B]`` of the flow-matching loss: ``0.001 + 0.999·Beta(1.5, 1)``, as openpi draws them.

    The Beta(1.5, 1) density grows towards ``t = 1``: more weight on the noisy end, where the velocity
    decides which mode the chain heads for.
    """
    u = torch.rand(batch, generator=generator, device=device)
    # Beta(1.5, 1) by inversion: its CDF is t^1.5.
    return 0.001 + 0.999 * u ** (1 / 1.5)


def flow_matching_loss(
    field: VelocityField,
    cond: Any,
    actions: Tensor,
    mask: Tensor | None = None,
    *,
    generator: torch.Generator | None = None,
) -> Tensor:
    """The conditional flow-matching loss of ``actions`` (SFT): ``E ||v(x_t, t) - (ε - a)||²``.

    ``x_t = t·ε + (1 - t)·a`` with ``ε ~ N(0, I)`` and ``t`` from :func:`sample_flow_times`; the target is the
    velocity of that straight path (towards the noise, as time runs from 0 to 1).

    Args:
        field: the velocity field.
        cond: passed to ``field`` unchanged.
        actions: ``[B, C, D]`` demonstrated action chunks.
        mask: ``[B, C]`` valid chunk entries (bool or 0/1); ``None``: all.
        generator: for ``t`` and ``ε``.

    Returns:
        Scalar: the squared error averaged over the action dims and the valid ``(row, chunk)`` entries.
    """
    b = actions.shape[0]
    t = sample_flow_times(b, device=actions.device, generator=generator).to(actions.dtype)
    eps = torch.randn(actions.shape, generator=generator, dtype=actions.dtype, device=actions.device)
    tt = t.view(-1, *([1] * (actions.ndim - 1)))
    x_t = tt * eps + (1 - tt) * actions
    velocity, _ = field(x_t, t, cond)
    err = ((velocity - (eps - actions)) ** 2).mean(dim=-1)
    if mask is None:
        return err.mean()
    m = mask.to(err.dtype)
    return (err * m).sum() / m.sum().clamp(min=1.0)
