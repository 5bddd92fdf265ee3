"""Token log-probabilities and entropy from vocabulary-sharded logits, and batch re-alignment (pure torch).

Megatron's output layer is column-parallel: with tensor parallelism each rank holds the logits of a contiguous
slice of the (padded) vocabulary, ``[B, S, V / TP]``. :func:`vocab_parallel_logprobs` computes
``log softmax(logits / T)[target]`` and the entropy of ``softmax(logits / T)`` without gathering the full
vocabulary: a max all-reduce (no gradient: the log-sum-exp does not depend on the shift), then sum
all-reduces with an identity backward (each rank holds the same loss) of the partition function, the target
logit and the expected logit. Padding rows of the vocabulary (``>= vocab_size``) are masked out.

Megatron's causal attention ignores padding masks (the local and Transformer Engine ``causal`` kernels attend to
every earlier position), so a left-padded batch is first *left-aligned* (:func:`left_align`): each row's valid
tokens are rolled to start at column 0, where causal attention never sees the right padding, and positions are
``0..len-1``; :func:`restore_alignment` rolls per-token outputs back.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "aligned_token_logprobs",
    "left_align",
    "restore_alignment",
    "shift_logprobs",
    "vocab_parallel_logprobs",
]

_MASKED = -1e30
"""Logit given to Megatron's vocabulary padding columns."""


class _AllReduceSum(torch.autograd.Function):
    """Sum over the tensor-parallel ranks; identity backward.

    Every rank computes the same loss from the reduced value, so ``d loss / d local`` is the incoming gradient
    itself (Megatron's ``reduce_from_tensor_model_parallel_region``); ``torch.distributed.nn``'s all-reduce
    would sum the identical gradients again and scale them by the group size.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
        out = x.clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def _all_reduce_sum(x: torch.Tensor, group: dist.ProcessGroup | None, world: int) -> torch.Tensor:
    if world == 1:
        return x
    return _AllReduceSum.apply(x, group)  # type: ignore[no-any-return]


def vocab_parallel_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    vocab_start: int = 0,
    vocab_size: int | None = None,
    temperature: float = 1.0,
    compute_entropy: bool = False,
    group: dist.ProcessGroup | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probability of ``targets`` (and entropy) under ``softmax(logits / temperature)``, vocab-sharded.

    Args:
        logits: ``[..., V_local]`` this rank's slice of the vocabulary, columns ``vocab_start ..
            vocab_start + V_local - 1`` (any float dtype; computed in float32).
        targets: ``[...]`` token ids in the full vocabulary.
        vocab_start: first vocabulary id of this rank's slice.
        vocab_size: true vocabulary size; columns at or beyond it (Megatron's padding) get probability 0.
            ``None``: no padding.
        temperature: softmax temperature (> 0).
        compute_entropy: also return the entropy ``[...]``.
        group: tensor-parallel process group (``None`` with a single rank, or the default group).

    Returns:
        ``(logprobs [...], entropy [...] or None)``, identical on every rank of ``group``, differentiable
        with respect to ``logits``.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    world = dist.get_world_size(group) if dist.is_available() and dist.is_initialized() else 1
    x = logits.float() / temperature
    v_local = x.shape[-1]
    if vocab_size is not None and vocab_start + v_local > vocab_size:
        cols = torch.arange(vocab_start, vocab_start + v_local, device=x.device)
        # A finite floor, not -inf: exp(.) is exactly 0 and the gradients stay finite (0 * -inf would be NaN).
        x = x.masked_fill(cols >= vocab_size, _MASKED)
    shift = x.detach().amax(dim=-1, keepdim=True)
    if world > 1:
        dist.all_reduce(shift, op=dist.ReduceOp.MAX, group=group)
    z = x - shift
    exp = torch.exp(z)
    sum_exp = _all_reduce_sum(exp.sum(dim=-1), group, world)
    log_z = torch.log(sum_exp)
    local = targets - vocab_start
    inside = (local >= 0) & (local < v_local)
    picked = torch.gather(z, -1, local.clamp(0, v_local - 1).unsqueeze(-1)).squeeze(-1)
    target_z = _all_reduce_sum(torch.where(inside, picked, torch.zeros_like(picked)), group, world)
    logprobs = target_z - log_z
    entropy = None
    if compute_entropy:
        # H = log Z - E_p[z] (padding columns have exp(z) == 0).
        entropy = log_z - _all_reduce_sum((exp * z).sum(dim=-1), group, world) / sum_exp
    return logprobs, entropy


def shift_logprobs(per_position: torch.Tensor) -> torch.Tensor:
    """Re-index next-token outputs to the repo convention: index ``t`` belongs to token ``t``.

    Args:
        per_position: ``[B, S - 1]`` where column ``s`` scores token ``s + 1`` given tokens ``<= s``.

    Returns:
        ``[B, S]`` with column 0 set to 0 (the first token has no prediction).
    """
    return torch.nn.functional.pad(per_position, (1, 0), value=0.0)


def left_align(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Roll each row so its valid tokens start at column 0.

    Args:
        input_ids: ``[B, T]``.
        attention_mask: ``[B, T]`` 0/1; the ones of each row must be contiguous (left-padded prompt, response,
            right padding), as produced by the rollout.

    Returns:
        ``(aligned_ids [B, T], shifts [B])``: ``aligned_ids[b] = input_ids[b].roll(-shifts[b])``; the tail after
        each row's length keeps the (rolled) padding ids, which causal attention never lets a valid token see.

    Raises:
        ValueError: if a row's attention mask is not one contiguous block of ones.
    """
    if input_ids.shape != attention_mask.shape or input_ids.dim() != 2:
        raise ValueError(
            f"input_ids {list(input_ids.shape)} and attention_mask {list(attention_mask.shape)} must both be [B, T]"
        )
    mask = attention_mask.bool()
    lengths = mask.sum(dim=1)
    first = torch.where(lengths > 0, mask.int().argmax(dim=1), torch.zeros_like(lengths))
    cols = torch.arange(mask.shape[1], device=mask.device)
    expected = (cols >= first[:, None]) & (cols < (first + lengths)[:, None])
    if not torch.equal(expected, mask):
        bad = (expected != mask).any(dim=1).nonzero().flatten().tolist()
        raise ValueError(f"attention_mask rows {bad[:8]} are not one contiguous block of ones")
    return _roll_rows(input_ids, -first), first


def restore_alignment(values: torch.Tensor, shifts: torch.Tensor) -> torch.Tensor:
    """Undo :func:`left_align` on a per-token output ``[B, T]`` (e.g. logprobs of the aligned batch)."""
    return _roll_rows(values, shifts)


def _roll_rows(x: torch.Tensor, shifts: torch.Tensor) -> torch.Tensor:
    t = x.shape[1]
    idx = (torch.arange(t, device=x.device)[None, :] - shifts[:, None].to(x.device)) % t
    return torch.gather(x, 1, idx)


def aligned_token_logprobs(
    logits: torch.Tensor,
    aligned_ids: torch.Tensor,
    shifts: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    vocab_start: int = 0,
    vocab_size: int | None = None,
    temperature: float = 1.0,
    compute_entropy: bool = False,
    group: dist.ProcessGroup | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs (and entropy) of a left-aligned batch, back in the batch's original layout.

    Args:
        logits: ``[B, T', V_local]`` next-token logits of the left-aligned batch (``T' >= T``: extra columns,
            e.g. sequence-parallel padding, are ignored); this rank's vocabulary slice.
        aligned_ids: ``[B, T'']`` (``T'' >= T``) the left-aligned ids the logits were computed from.
        shifts: ``[B]`` from :func:`left_align`.
        attention_mask: ``[B, T]`` the ORIGINAL mask (its width ``T`` is the batch width).
        vocab_start: first vocabulary id of this rank's slice.
        vocab_size: true vocabulary size (padding columns masked).
        temperature: softmax temperature.
        compute_entropy: also return the entropy.
        group: tensor-parallel group.

    Returns:
        ``(logprobs [B, T], entropy [B, T] or None)``: column ``t`` scores ``input_ids[:, t]`` given the tokens
        before it; 0 at each row's first token and on padding.
    """
    t = attention_mask.shape[1]
    lp, ent = vocab_parallel_logprobs(
        logits[:, : t - 1],
        aligned_ids[:, 1:t],
        vocab_start=vocab_start,
        vocab_size=vocab_size,
        temperature=temperature,
        compute_entropy=compute_entropy,
        group=group,
    )
    mask = attention_mask.to(lp.dtype)
    lp = restore_alignment(shift_logprobs(lp), shifts) * mask
    if ent is not None:
        ent = restore_alignment(shift_logprobs(ent), shifts) * mask
    return lp, ent
