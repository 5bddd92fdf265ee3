"""Advantage estimators as pure array functions (RLinf 0.4 numerics, time-major ``[T, B]`` layout).

Every function takes explicit arrays plus keyword-only switches and works on numpy arrays, torch tensors
(autograd preserved) and any array-API namespace. Layouts are the ones RLinf uses AFTER its pre-processing:
time (or token position) first, batch second. The RLinf-named keyword entry points that accept RLinf's
``**kwargs`` live in ``rlinf_algos.compat``.

References:
    GAE: Schulman et al., "High-Dimensional Continuous Control Using Generalized Advantage Estimation",
    https://arxiv.org/abs/1506.02438. GRPO: Shao et al., "DeepSeekMath", https://arxiv.org/abs/2402.03300.
    Reinforce++: Hu, "REINFORCE++", https://arxiv.org/abs/2501.03262.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any, Literal

import array_api_compat

from ._array import Array, as_float, check_ndim, check_same_shape, namespace, to_bool
from ._masked import masked_mean, safe_normalize

__all__ = ["gae", "grpo", "grpo_dynamic", "grpo_video", "opd", "raw", "reinpp"]

GRPO_EPS = 1e-6
"""Added to the group std by every GRPO variant (RLinf)."""


def _shape(x: Array) -> tuple[int, ...]:
    return tuple(int(d) for d in x.shape)


def _size(x: Array) -> int:
    n = 1
    for d in _shape(x):
        n *= d
    return n


def _rows(xp: Any, x: Array) -> list[Array]:
    """``x`` split along axis 0 into views (one call instead of T indexing ops)."""
    unstack = getattr(xp, "unstack", None)
    if unstack is not None:
        return list(unstack(x, axis=0))
    return [x[i, ...] for i in range(int(x.shape[0]))]


def _scalar(xp: Any, value: float, like: Array) -> Array:
    """A 0-d array holding ``value`` with ``like``'s dtype and device."""
    return xp.asarray(value, dtype=like.dtype, device=array_api_compat.device(like))


def check_group_size(group_size: object, n: int, what: str, name: str = "group_size") -> int:
    """``group_size`` as an int, or ValueError unless it is a positive integer dividing ``n``.

    Integer-likes (``numpy.int64``, 0-d integer arrays) are accepted through ``operator.index``.
    """
    try:
        size = operator.index(group_size)  # type: ignore[arg-type]
    except TypeError:
        size = 0
    if isinstance(group_size, bool) or size < 1:
        raise ValueError(f"{name} must be a positive int, got {group_size!r}")
    if n % size != 0:
        raise ValueError(f"{what} has {n} entries, which is not divisible by {name}={size}")
    return size


SCAN_BLOCK_ELEMENTS = 32768
"""Target size of one time block in :func:`gae` (``rows * B``): 128 KiB of float32 stays cache-resident, and
torch runs element-wise ops this small on one thread, so no intra-op synchronisation is paid per block."""

SCAN_BLOCK_MAX_ROWS = 64
"""Upper bound on the rows of one time block (small ``B``)."""


def scan_block(
    xp: Any, x: Array, carry: Array | float | None, acc: Array | None = None, *, keep_all: bool = True
) -> tuple[Array | None, Array]:
    """Backward recursion ``acc[t] = x[t] + carry[t] * acc[t+1]`` over the rows of one block.

    The only sequential part of GAE-style estimators: each step is one multiply and one add on a ``[B]``
    row (rows are views taken once up front; the results are stacked once at the end).

    Args:
        xp: the array namespace.
        x: ``[n, B]`` per-step terms (e.g. TD errors), ``n >= 1``.
        carry: ``[n, B]`` per-step decay (e.g. ``gamma * lambda * not_done``), a constant, or ``None`` for 1.
        acc: ``[B]`` value of the step after the block, or ``None`` at the end of the data (``acc = 0``;
            the last step is then ``x[n-1]`` exactly, as RLinf's ``delta + decay * 0``).
        keep_all: also return every step's value, stacked.

    Returns:
        ``(acc[0..n-1] stacked [n, B] or None, acc[0] [B])``.
    """
    x_rows = _rows(xp, x)
    c_rows = _rows(xp, carry) if carry is not None and not isinstance(carry, int | float) else None
    n = len(x_rows)
    out: list[Array] = [None] * n
    for t in range(n - 1, -1, -1):
        if acc is None:
            acc = x_rows[t]
        elif c_rows is not None:
            acc = x_rows[t] + c_rows[t] * acc
        elif carry is None:
            acc = x_rows[t] + acc
        else:
            acc = x_rows[t] + carry * acc
        out[t] = acc
    if acc is None:
        raise ValueError(f"x must have at least one row, got shape {list(_shape(x))}")
    return (xp.stack(out, axis=0) if keep_all else None), acc


def _concat_reversed(xp: Any, blocks: list[Array]) -> Array:
    """Blocks collected newest-first, joined in time order (no copy for a single block)."""
    if len(blocks) == 1:
        return blocks[0]
    return xp.concat(blocks[::-1], axis=0)


def masked_standardize(values: Array, mask: Array | None, eps: float = 1e-5) -> Array:
    """:func:`safe_normalize` computed with masked reductions instead of gathering the masked entries.

    Same statistics (masked mean, unbiased masked std, ``+eps``), applied to every entry; unchanged when the
    mask selects nothing. Gathering ``values[mask]`` dominates the cost on large ``[T, B]`` arrays, while
    two masked sums stream the data; results agree with :func:`safe_normalize` to float rounding.

    Args:
        values: ``[...]``.
        mask: bool (or 0/1) array of ``values``'s shape, or ``None`` for global statistics.
        eps: added to the std.

    Returns:
        ``(values - mean) / (std + eps)``.
    """
    xp = namespace(values, mask)
    if mask is None:
        return safe_normalize(values, None)
    bmask = to_bool(xp, mask)
    if _shape(bmask) != _shape(values):
        bmask = xp.broadcast_to(bmask, _shape(values))
    count = int(xp.sum(xp.astype(bmask, xp.int64)))
    if count == 0:
        return values
    zero = _scalar(xp, 0.0, values)
    mean = xp.sum(xp.where(bmask, values, zero)) / count
    centered = values - mean
    var = xp.sum(xp.where(bmask, centered * centered, zero)) / (count - 1)
    return centered / (xp.sqrt(var) + eps)


def gae(
    rewards: Array,
    values: Array | None = None,
    dones: Array | None = None,
    *,
    gamma: float = 1.0,
    gae_lambda: float = 1.0,
    normalize_advantages: bool = True,
    normalize_returns: bool = False,
    loss_mask: Array | None = None,
) -> tuple[Array, Array]:
    """Generalized Advantage Estimation (RLinf ``compute_gae_advantages_and_returns``).

    ``delta[t] = r[t] + γ·V[t+1]·(1-done[t+1]) - V[t]``, ``A[t] = delta[t] + γλ·(1-done[t+1])·A[t+1]``,
    ``returns = A + V[:-1]``. Without ``values`` (critic-free) ``γ = λ = 1``, ``delta = r`` and
    ``returns = advantages`` = the undiscounted reward-to-go within the episode.

    Args:
        rewards: ``[T, B]`` per-step rewards.
        values: ``[T+1, B]`` value estimates including the bootstrap row, or ``None`` (critic-free).
        dones: ``[T+1, B]`` bool; ``dones[t+1]`` is true when the episode ended with step ``t``. Row 0 is
            ignored. ``None`` means no step ends an episode.
        gamma: discount factor.
        gae_lambda: GAE smoothing factor.
        normalize_advantages: standardise advantages with the masked mean and unbiased std (RLinf
            ``safe_normalize(·, loss_mask)``, see :func:`masked_standardize`).
        normalize_returns: standardise returns the same way.
        loss_mask: ``[T, B]`` bool; selects the entries the normalisation statistics come from.

    Returns:
        ``(advantages [T, B], returns [T, B])``.

    Raises:
        ValueError: if an argument does not have the layout above.
    """
    xp = namespace(rewards, values, dones, loss_mask)
    check_ndim("rewards", rewards, 2, "[T, B]")
    n_steps, batch = _shape(rewards)
    if n_steps == 0:
        raise ValueError(f"rewards must have at least one step, got shape {_shape(rewards)}")
    for name, arr, expected in (
        ("values", values, (n_steps + 1, batch)),
        ("dones", dones, (n_steps + 1, batch)),
    ):
        if arr is not None and _shape(arr) != expected:
            raise ValueError(
                f"{name} must have layout [T+1, B] = {list(expected)} for rewards of shape {list(_shape(rewards))}, "
                f"got shape {list(_shape(arr))}"
            )
    if loss_mask is not None:
        check_same_shape(rewards=rewards, loss_mask=loss_mask)

    critic_free = values is None
    if critic_free:
        gamma = gae_lambda = 1.0
    rewards = as_float(xp, rewards)
    decay = gamma * gae_lambda
    # The time axis is processed in blocks of ~SCAN_BLOCK_ELEMENTS entries, newest first: every whole-block term
    # (TD errors, decays, returns) is computed while the block is cache-resident, so each input is read
    # once and each output written once, and the per-step loop is one multiply-add on a [B] row.
    adv_blocks: list[Array] = []
    ret_blocks: list[Array] = []
    acc: Array | None = None
    block = max(1, min(SCAN_BLOCK_MAX_ROWS, SCAN_BLOCK_ELEMENTS // max(batch, 1)))
    for stop in range(n_steps, 0, -block):
        start = max(0, stop - block)
        not_done = (
            None
            if dones is None
            else as_float(xp, ~to_bool(xp, dones[start + 1 : stop + 1, ...]), like=rewards)
        )
        carry: Array | float | None = (
            decay * not_done if not_done is not None else (None if decay == 1.0 else decay)
        )
        if values is None:
            acc_blk, acc = scan_block(xp, rewards[start:stop, ...], carry, acc)
            ret_blocks.append(acc_blk)
            continue
        v_blk = values[start:stop, ...]
        next_values = gamma * values[start + 1 : stop + 1, ...]
        if not_done is not None:
            next_values = next_values * not_done
        # Same operation order as RLinf: (r + γ·V'·(1-d)) - V, then A + γλ·(1-d)·A'.
        acc_blk, acc = scan_block(xp, (rewards[start:stop, ...] + next_values) - v_blk, carry, acc)
        ret_blk = acc_blk + v_blk
        ret_blocks.append(ret_blk)
        # Recomputed as RLinf does (returns - V), which is not bit-identical to ``acc`` in floating point.
        adv_blocks.append(ret_blk - v_blk)
    returns = _concat_reversed(xp, ret_blocks)
    advantages = returns if critic_free else _concat_reversed(xp, adv_blocks)
    if normalize_advantages:
        advantages = masked_standardize(advantages, loss_mask)
    if normalize_returns:
        returns = masked_standardize(returns, loss_mask)
    return advantages, returns


def _broadcast_rows(xp: Any, row: Array, loss_mask: Array) -> Array:
    """RLinf's ``(zeros_like(loss_mask) + row) * loss_mask`` for a ``[1, B]`` row and an ``[L, B]`` mask."""
    return row * as_float(xp, loss_mask, like=row)


def _check_mask_columns(name: str, loss_mask: Array, n: int, rewards: Array) -> None:
    if loss_mask.ndim < 1 or int(loss_mask.shape[-1]) != n:
        raise ValueError(
            f"{name} must have layout [L, B] with B = rewards.size = {n}; got {name} shape "
            f"{list(_shape(loss_mask))} and rewards shape {list(_shape(rewards))}"
        )


def grpo(rewards: Array, loss_mask: Array, *, group_size: int) -> Array:
    """Group-relative advantages (RLinf ``compute_grpo_advantages``).

    Rewards are grouped in consecutive blocks of ``group_size`` (one block per prompt) and standardised
    within their group with the unbiased std: ``(r - mean) / (std + 1e-6)``. A constant group gives 0, a
    group of one gives NaN (as in RLinf). Each sequence's advantage is broadcast over its valid positions.

    Args:
        rewards: ``[B]`` or ``[B / group_size, group_size]`` one scalar per sequence, groups contiguous.
        loss_mask: ``[L, B]`` bool (time-major).
        group_size: number of sequences per group.

    Returns:
        ``[L, B]`` advantages, zero where ``loss_mask`` is false.
    """
    xp = namespace(rewards, loss_mask)
    n = _size(rewards)
    group_size = check_group_size(group_size, n, "rewards")
    check_ndim("loss_mask", loss_mask, 2, "[L, B]")
    _check_mask_columns("loss_mask", loss_mask, n, rewards)
    grouped = xp.reshape(as_float(xp, rewards), (-1, group_size))
    mean = xp.mean(grouped, axis=-1, keepdims=True)
    std = xp.std(grouped, axis=-1, correction=1, keepdims=True)
    adv = (grouped - mean) / (std + GRPO_EPS)
    return _broadcast_rows(xp, xp.reshape(adv, (1, -1)), loss_mask)


def grpo_video(
    rewards: Array,
    loss_mask: Array | None,
    *,
    group_size: int,
    advantage_mode: Literal["frame", "video"],
) -> Array:
    """Per-frame GRPO for video/frame-level rewards (RLinf ``compute_grpo_video_advantages``).

    Rewards are viewed as ``[S, B / group_size, group_size]``. ``"frame"`` standardises each frame over the
    group's members; ``"video"`` uses one mean/std per group over all its frames and members (masked frames
    included in the statistics, as in RLinf). Unbiased std, ``+1e-6``.

    Args:
        rewards: ``[S, B]`` per-frame (per-step) rewards; ``B`` ordered as ``[prompts * group_size]``.
        loss_mask: ``[S, B]`` bool, or ``None`` for no masking.
        group_size: group members per prompt.
        advantage_mode: ``"frame"`` or ``"video"``.

    Returns:
        ``[S, B]`` advantages multiplied by ``loss_mask``.
    """
    xp = namespace(rewards, loss_mask)
    check_ndim("rewards", rewards, 2, "[S, B]")
    n_frames, batch = _shape(rewards)
    group_size = check_group_size(group_size, batch, "rewards' batch axis")
    if loss_mask is not None:
        check_same_shape(rewards=rewards, loss_mask=loss_mask)
    if advantage_mode == "frame":
        axes: int | tuple[int, ...] = -1
    elif advantage_mode == "video":
        axes = (0, 2)
    else:
        raise ValueError(f"advantage_mode must be 'frame' or 'video' for grpo_video, got {advantage_mode!r}")
    grouped = xp.reshape(as_float(xp, rewards), (n_frames, -1, group_size))
    mean = xp.mean(grouped, axis=axes, keepdims=True)
    std = xp.std(grouped, axis=axes, correction=1, keepdims=True)
    adv = xp.reshape((grouped - mean) / (std + GRPO_EPS), (n_frames, batch))
    if loss_mask is None:
        return adv
    return adv * as_float(xp, loss_mask, like=adv)


def grpo_dynamic(
    rewards: Array,
    loss_mask: Array,
    *,
    group_size: int,
    idx_to_traj: Sequence[int],
    advantage_mode: Literal["turn", "trajectory"] = "turn",
) -> Array:
    """Multi-turn GRPO (RLinf ``compute_grpo_dynamic_advantages``).

    Each turn (sequence) belongs to trajectory ``idx_to_traj[i]``; consecutive blocks of ``group_size``
    trajectories answer the same question. ``"turn"`` standardises all turn rewards of a question jointly;
    ``"trajectory"`` averages each trajectory's turn rewards, standardises those over the question's
    ``group_size`` trajectories and gives every turn its trajectory's value. Unbiased std, ``+1e-6``.

    Args:
        rewards: ``[num_sequence]`` or ``[num_sequence, 1]`` one reward per turn.
        loss_mask: ``[L, num_sequence]`` bool.
        group_size: trajectories per question.
        idx_to_traj: ``num_sequence`` global trajectory ids (``max + 1`` divisible by ``group_size``).
        advantage_mode: ``"turn"`` or ``"trajectory"``.

    Returns:
        ``[L, num_sequence]`` advantages, zero where ``loss_mask`` is false.
    """
    xp = namespace(rewards, loss_mask)
    n_seq = len(idx_to_traj)
    if _size(rewards) != n_seq:
        raise ValueError(
            f"rewards must hold one value per turn (len(idx_to_traj) = {n_seq}), got shape {list(_shape(rewards))}"
        )
    if n_seq == 0:
        raise ValueError("idx_to_traj must not be empty")
    if min(idx_to_traj) < 0:
        raise ValueError(f"idx_to_traj must hold non-negative trajectory ids, got min {min(idx_to_traj)}")
    check_ndim("loss_mask", loss_mask, 2, "[L, num_sequence]")
    _check_mask_columns("loss_mask", loss_mask, n_seq, rewards)
    num_traj = max(idx_to_traj) + 1
    group_size = check_group_size(group_size, num_traj, "the trajectory ids (max(idx_to_traj) + 1)")
    if advantage_mode not in ("turn", "trajectory"):
        raise ValueError(
            f"advantage_mode must be 'turn' or 'trajectory' for grpo_dynamic, got {advantage_mode!r}"
        )

    flat = xp.reshape(as_float(xp, rewards), (-1,))
    dev = array_api_compat.device(flat)
    zero = _scalar(xp, 0.0, flat)
    traj = xp.asarray(list(idx_to_traj), dtype=xp.int64, device=dev)
    if advantage_mode == "trajectory":
        # [num_traj, n_seq] membership: per-trajectory mean turn reward (0 for a trajectory without turns).
        member = traj[None, :] == xp.arange(num_traj, dtype=xp.int64, device=dev)[:, None]
        sums = xp.sum(xp.where(member, flat[None, :], zero), axis=1)
        counts = xp.sum(xp.astype(member, flat.dtype), axis=1)
        per_traj = xp.reshape(sums / xp.clip(counts, min=1.0), (-1, group_size))
        mean = xp.mean(per_traj, axis=-1, keepdims=True)
        std = xp.std(per_traj, axis=-1, correction=1, keepdims=True)
        normalized = xp.reshape((per_traj - mean) / (std + GRPO_EPS), (-1,))
        turn_adv = xp.take(normalized, traj, axis=0)
    else:
        question = traj // group_size
        num_q = num_traj // group_size
        member = question[None, :] == xp.arange(num_q, dtype=xp.int64, device=dev)[:, None]  # [Q, n_seq]
        counts = xp.sum(xp.astype(member, flat.dtype), axis=1)
        mean_q = xp.sum(xp.where(member, flat[None, :], zero), axis=1) / counts
        centered = flat - xp.take(mean_q, question, axis=0)
        var_q = xp.sum(xp.where(member, (centered * centered)[None, :], zero), axis=1) / (counts - 1.0)
        std_turn = xp.take(xp.sqrt(var_q), question, axis=0)
        turn_adv = centered / (std_turn + GRPO_EPS)
    return _broadcast_rows(xp, xp.reshape(turn_adv, (1, -1)), loss_mask)


def reinpp(
    rewards: Array,
    loss_mask: Array,
    *,
    group_size: int | None = None,
    use_reinpp_baseline: bool = False,
    kl_beta: float = 0.0,
    kl: Array | None = None,
) -> Array:
    """Reinforce++ advantages (RLinf ``compute_reinpp_advantages``, with two fixes).

    Each sequence's reward is placed on its LAST VALID position along the time axis, ``kl_beta * kl`` is
    subtracted per token, the undiscounted reward-to-go is taken, and the result is standardised with the
    masked mean and masked population variance (``rsqrt(max(var, 1e-8))``; padding is not re-masked).
    With ``use_reinpp_baseline`` the group mean reward is subtracted first (Reinforce++-baseline).

    Deliberate deviations from RLinf 0.4: RLinf finds the last valid token with ``fliplr`` on ``[L, B]``,
    which flips the batch axis; here the time axis is searched. RLinf's baseline path raises ``IndexError``
    and mutates the caller's rewards in place; here it works and never mutates its input.

    Args:
        rewards: ``[B]`` or ``[1, B]`` one scalar per sequence.
        loss_mask: ``[L, B]`` bool (time-major).
        group_size: sequences per prompt (required with ``use_reinpp_baseline``).
        use_reinpp_baseline: subtract the per-group mean reward.
        kl_beta: coefficient of the per-token KL penalty.
        kl: ``[L, B]`` per-token KL estimate (e.g. ``kl_penalty(logprob, ref_logprob, "k3")``); required
            when ``kl_beta > 0``.

    Returns:
        ``[L, B]`` advantages.
    """
    xp = namespace(rewards, loss_mask, kl)
    check_ndim("loss_mask", loss_mask, 2, "[L, B]")
    length, batch = _shape(loss_mask)
    if (
        rewards.ndim not in (1, 2)
        or _size(rewards) != batch
        or (rewards.ndim == 2 and int(rewards.shape[0]) != 1)
    ):
        raise ValueError(
            f"rewards must have layout [B] or [1, B] with B = loss_mask.shape[1] = {batch}; got rewards shape "
            f"{list(_shape(rewards))} and loss_mask shape {list(_shape(loss_mask))}"
        )
    flat = xp.reshape(as_float(xp, rewards), (-1,))
    if use_reinpp_baseline:
        if group_size is None:
            raise ValueError("group_size is required when use_reinpp_baseline=True")
        group_size = check_group_size(group_size, batch, "rewards")
        grouped = xp.reshape(flat, (-1, group_size))
        flat = xp.reshape(
            grouped - xp.mean(grouped, axis=1, keepdims=True), (-1,)
        )  # new array: input untouched
    mask = to_bool(xp, loss_mask)
    dev = array_api_compat.device(flat)
    # Last valid row per column (row L-1 for an all-false column, as RLinf's formula gives).
    last_from_end = xp.argmax(xp.astype(xp.flip(mask, axis=0), xp.int32), axis=0)
    eos = (length - 1) - last_from_end
    rows = xp.arange(length, dtype=eos.dtype, device=dev)[:, None]
    r_matrix = xp.where(rows == eos[None, :], flat[None, :], _scalar(xp, 0.0, flat))
    if kl_beta > 0:
        if kl is None:
            raise ValueError("kl ([L, B] per-token KL estimate) is required when kl_beta > 0")
        check_same_shape(loss_mask=loss_mask, kl=kl)
        r_matrix = r_matrix - kl_beta * kl
    ret = xp.flip(xp.cumulative_sum(xp.flip(r_matrix, axis=0), axis=0), axis=0)
    mean = masked_mean(ret, mask)
    centered = ret - mean
    var = masked_mean(centered**2, mask)
    return centered * (1.0 / xp.sqrt(xp.clip(var, min=1e-8)))


def opd(
    prev_logprobs: Array,
    teacher_logprobs: Array,
    *,
    num_action_chunks: int,
    num_steps: int | None = None,
) -> Array:
    """On-policy distillation advantages: the per-token reverse-KL reward ``teacher - student``.

    RLinf ``compute_opd_advantages``: both inputs are cast to float32, subtracted, and the last axis is
    split into ``[num_action_chunks, -1]``. No GAE, no normalisation.

    Args:
        prev_logprobs: ``[T(+1), E, C*D]`` student (rollout) log-probs.
        teacher_logprobs: same shape, teacher log-probs.
        num_action_chunks: ``C``; the last axis must be divisible by it.
        num_steps: if given, keep only the first ``num_steps`` rows (``loss_mask.shape[0]``); the input may
            have exactly ``num_steps`` or ``num_steps + 1`` (bootstrap) rows.

    Returns:
        ``[T, E, C, D]`` float32 advantages.
    """
    xp = namespace(prev_logprobs, teacher_logprobs)
    check_same_shape(prev_logprobs=prev_logprobs, teacher_logprobs=teacher_logprobs)
    check_ndim("prev_logprobs", prev_logprobs, (1, 2, 3, 4, 5, 6), "[T, E, C*D]")
    last = int(prev_logprobs.shape[-1])
    if not isinstance(num_action_chunks, int) or num_action_chunks < 1 or last % num_action_chunks != 0:
        raise ValueError(
            f"num_action_chunks must be a positive int dividing the last axis of prev_logprobs "
            f"{list(_shape(prev_logprobs))}, got {num_action_chunks!r}"
        )
    teacher = (
        teacher_logprobs if teacher_logprobs.dtype == xp.float32 else xp.astype(teacher_logprobs, xp.float32)
    )
    student = prev_logprobs if prev_logprobs.dtype == xp.float32 else xp.astype(prev_logprobs, xp.float32)
    adv = xp.reshape(teacher - student, (*_shape(prev_logprobs)[:-1], num_action_chunks, -1))
    if num_steps is not None:
        if int(adv.shape[0]) not in (num_steps, num_steps + 1):
            raise ValueError(
                f"prev_logprobs has {int(adv.shape[0])} steps (shape {list(_shape(prev_logprobs))}); expected "
                f"loss_mask's {num_steps} steps or {num_steps + 1} with the bootstrap step"
            )
        adv = adv[:num_steps, ...]
    return adv


def raw(rewards: Array, loss_mask: Array, *, normalize_advantages: bool = False) -> Array:
    """Raw rewards broadcast over valid positions (RLinf ``compute_raw_advantages``).

    Optionally standardised with the token-weighted mean and unbiased std of the valid entries
    (``+1e-5``); padding is not re-masked after normalisation (RLinf).

    Args:
        rewards: ``[B]`` or ``[G, group_size]`` (flattened to ``[B]``).
        loss_mask: ``[L, B]`` bool.
        normalize_advantages: standardise over the valid entries.

    Returns:
        ``[L, B]`` advantages.
    """
    xp = namespace(rewards, loss_mask)
    check_ndim("rewards", rewards, (1, 2), "[B] or [G, group_size]")
    flat = xp.reshape(rewards, (-1,)) if rewards.ndim == 2 else rewards
    check_ndim("loss_mask", loss_mask, 2, "[L, B]")
    _check_mask_columns("loss_mask", loss_mask, int(flat.shape[0]), rewards)
    flat = as_float(xp, flat)
    adv = _broadcast_rows(xp, flat[None, :], loss_mask)
    if normalize_advantages:
        adv = masked_standardize(adv, loss_mask)
    return adv
