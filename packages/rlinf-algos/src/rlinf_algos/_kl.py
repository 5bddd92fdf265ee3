"""KL estimators, entropy from logits and embodied entropy reshaping (RLinf numerics).

KL estimators follow J. Schulman, "Approximating KL divergence" (http://joschu.net/blog/kl-approx.html).
"""

from __future__ import annotations

from typing import Any

from ._array import Array, namespace

__all__ = ["KL_PENALTY_TYPES", "compute_entropy_from_logits", "kl_penalty", "reshape_entropy"]

KL_PENALTY_TYPES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
"""Accepted ``kl_penalty`` names (aliases: ``kl``=``k1``, ``mse``=``k2``, ``low_var_kl``=``k3``)."""


def kl_penalty(logprob: Array, ref_logprob: Array, kl_penalty: str) -> Array:
    """Per-token KL estimate between the policy and a reference (RLinf ``kl_penalty``).

    With ``d = logprob - ref_logprob``:

    - ``"kl"`` / ``"k1"``: ``d``;
    - ``"abs"``: ``|d|``;
    - ``"mse"`` / ``"k2"``: ``0.5 d²``;
    - ``"low_var_kl"`` / ``"k3"``: ``clamp(exp(-d') + d' - 1, -10, 10)`` with ``-d' = clamp(-d, -20, 20)``.

    Note the argument order matters (k1 flips sign, k3 changes): RLinf's FSDP worker calls
    ``kl_penalty(ref_logprobs, logprobs, ...)`` while Megatron calls ``kl_penalty(logprobs, ref_logprobs, ...)``.

    Args:
        logprob: ``[...]`` log-probs of the sampled tokens under the policy.
        ref_logprob: same shape, under the reference policy.
        kl_penalty: estimator name (case-insensitive), one of :data:`KL_PENALTY_TYPES`.

    Returns:
        Same shape as the inputs.

    Raises:
        ValueError: for ``"full"`` (needs full-vocabulary logits) or an unknown name; RLinf raises
            NotImplementedError there.
    """
    xp = namespace(logprob, ref_logprob)
    kind = kl_penalty.lower() if isinstance(kl_penalty, str) else kl_penalty
    if kind in ("kl", "k1"):
        return logprob - ref_logprob
    if kind == "abs":
        return xp.abs(logprob - ref_logprob)
    if kind in ("mse", "k2"):
        diff = logprob - ref_logprob
        return 0.5 * (diff * diff)
    if kind in ("low_var_kl", "k3"):
        kl = xp.clip(ref_logprob - logprob, min=-20.0, max=20.0)
        return xp.clip(xp.exp(kl) - kl - 1, min=-10.0, max=10.0)
    detail = " ('full' needs full-vocabulary logits and is not implemented)" if kind == "full" else ""
    raise ValueError(f"unknown kl_penalty {kl_penalty!r}{detail}; valid names: {', '.join(KL_PENALTY_TYPES)}")


def compute_entropy_from_logits(logits: Array, dim: int = -1) -> Array:
    """Entropy ``-Σ p log p`` of ``softmax(logits)`` along ``dim`` via a stable log-softmax.

    Terms with ``p == 0`` (e.g. ``-inf`` logits) contribute 0 and, unlike RLinf's ``where(p > 0, p*logp, 0)``,
    give zero (not NaN) gradients.

    Args:
        logits: ``[B, L, V]`` (any shape) unnormalised scores.
        dim: the vocabulary axis.

    Returns:
        ``logits``'s shape without ``dim`` (e.g. ``[B, L]``).
    """
    xp = namespace(logits)
    shift = xp.max(logits, axis=dim, keepdims=True)
    shift = xp.where(xp.isfinite(shift), shift, 0.0)
    z = logits - _stop_gradient(shift)
    logp = z - xp.log(xp.sum(xp.exp(z), axis=dim, keepdims=True))
    p = xp.exp(logp)
    positive = p > 0
    safe_logp = xp.where(positive, logp, 0.0)
    return -xp.sum(xp.where(positive, p * safe_logp, 0.0), axis=dim)


def _stop_gradient(x: Array) -> Array:
    detach = getattr(x, "detach", None)
    return detach() if callable(detach) else x


def reshape_entropy(
    entropy: Array | None,
    entropy_type: str | None,
    action_dim: int = 7,
    batch_size: int = 1,
) -> Array | None:
    """Aggregate per-token embodied entropy to the loss granularity (RLinf ``reshape_entropy``).

    Args:
        entropy: ``[B, C*D]`` per-token entropy (or ``None``, returned as is).
        entropy_type: ``"action_level"`` → ``[B, C]`` (sum over the action dim D), ``"chunk_level"`` →
            ``[B]`` (sum over the last axis); anything else (``"token_level"``) returns ``entropy`` unchanged.
        action_dim: D.
        batch_size: B.

    Returns:
        The reshaped entropy, or ``None``.
    """
    if entropy is None:
        return None
    xp: Any = namespace(entropy)
    if entropy_type == "action_level":
        return xp.sum(xp.reshape(entropy, (batch_size, -1, action_dim)), axis=-1)
    if entropy_type == "chunk_level":
        return xp.sum(entropy, axis=-1)
    return entropy
