"""RLinf-compatible advantage entry layer: ``calculate_adv_and_returns(**kwargs)`` and the registry.

This is the only advantage module that takes ``**kwargs``: it accepts exactly the keyword names RLinf 0.4's
workers pass (``task_type``, ``adv_type``, ``rewards``, ``loss_mask``, ...), runs RLinf's pre-processing,
dispatches through the advantage registry and returns what RLinf returns. Any other keyword raises a
TypeError naming it (RLinf silently ignores typos). The math lives in ``_advantages``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, TypeAlias, TypeVar

from .._advantages import gae, grpo, grpo_dynamic, grpo_video, opd, raw, reinpp
from .._array import Array
from .._embodied import (
    calculate_scores,
    postprocess_embodied_advantages_outputs,
    preprocess_embodied_advantages_inputs,
)
from .._kl import kl_penalty
from .._reasoning import postprocess_reasoning_advantages_outputs, preprocess_reasoning_advantages_inputs
from .._registry import Registry

__all__ = [
    "ADVANTAGE_FNS",
    "ADV_ENTRY_KEYWORDS",
    "AdvantageFn",
    "advantage_registry",
    "calculate_adv_and_returns",
    "compute_gae_advantages_and_returns",
    "compute_grpo_advantages",
    "compute_grpo_dynamic_advantages",
    "compute_grpo_video_advantages",
    "compute_opd_advantages",
    "compute_raw_advantages",
    "compute_reinpp_advantages",
    "get_adv_and_returns",
    "register_advantage",
]

AdvantageFn: TypeAlias = Callable[..., tuple[Array, Array | None]]
"""An advantage estimator called with RLinf keyword arguments, returning ``(advantages, returns_or_None)``."""

F = TypeVar("F", bound=AdvantageFn)

ADV_ENTRY_KEYWORDS = frozenset(
    {
        # dispatch
        "task_type",
        "adv_type",
        # shared inputs
        "rewards",
        "loss_mask",
        "values",
        "dones",
        "group_size",
        "normalize_advantages",
        "normalize_returns",
        "gamma",
        "gae_lambda",
        "advantage_mode",
        # reasoning (FSDP / Megatron actors)
        "kl_beta",
        "kl_penalty_type",
        "logprob",
        "ref_logprob",
        "use_reinpp_baseline",
        "num_sequence",
        "idx_to_traj",
        # embodied actors
        "reward_type",
        "loss_mask_sum",
        "prev_logprobs",
        "teacher_logprobs",
        "num_action_chunks",
    }
)
"""Every keyword RLinf 0.4's workers pass to ``calculate_adv_and_returns``."""

_PIPELINE_KEYWORDS = ADV_ENTRY_KEYWORDS | {"num_chunk", "batch_size", "chunk_size", "n_steps"}
"""What an advantage function receives from the entry layer (the entry keywords plus the embodied
pre-processing's layout sizes). Registry functions accept these and ignore the ones they do not use."""


def _reject_unknown(fn_name: str, kwargs: Mapping[str, Any], allowed: frozenset[str] | set[str]) -> None:
    unknown = sorted(k for k in kwargs if k not in allowed)
    if unknown:
        raise TypeError(
            f"{fn_name}() got unexpected keyword argument(s) {', '.join(repr(k) for k in unknown)}; "
            f"accepted keywords: {', '.join(sorted(allowed))}"
        )


def compute_gae_advantages_and_returns(
    rewards: Array,
    gamma: float = 1.0,
    gae_lambda: float = 1.0,
    values: Array | None = None,
    normalize_advantages: bool = True,
    normalize_returns: bool = False,
    loss_mask: Array | None = None,
    dones: Array | None = None,
    **kwargs: Any,
) -> tuple[Array, Array]:
    """RLinf ``"gae"``: see :func:`rlinf_algos.gae` (rewards ``[T, B]``, values/dones ``[T+1, B]``)."""
    _reject_unknown("compute_gae_advantages_and_returns", kwargs, _PIPELINE_KEYWORDS)
    return gae(
        rewards,
        values,
        dones,
        gamma=gamma,
        gae_lambda=gae_lambda,
        normalize_advantages=normalize_advantages,
        normalize_returns=normalize_returns,
        loss_mask=loss_mask,
    )


def compute_grpo_advantages(
    rewards: Array, loss_mask: Array, group_size: int, **kwargs: Any
) -> tuple[Array, None]:
    """RLinf ``"grpo"``: see :func:`rlinf_algos.grpo` (rewards ``[G, group_size]``, loss_mask ``[L, B]``)."""
    _reject_unknown("compute_grpo_advantages", kwargs, _PIPELINE_KEYWORDS)
    if loss_mask is None:
        raise ValueError("grpo needs loss_mask ([L, B]); RLinf's embodied path has none with auto_reset")
    return grpo(rewards, loss_mask, group_size=group_size), None


def compute_grpo_video_advantages(
    rewards: Array, loss_mask: Array | None, group_size: int, advantage_mode: Any = None, **kwargs: Any
) -> tuple[Array, None]:
    """RLinf ``"grpo_video"``: see :func:`rlinf_algos.grpo_video` (``advantage_mode`` ``"frame"``/``"video"``)."""
    _reject_unknown("compute_grpo_video_advantages", kwargs, _PIPELINE_KEYWORDS)
    return grpo_video(rewards, loss_mask, group_size=group_size, advantage_mode=advantage_mode), None


def compute_grpo_dynamic_advantages(
    rewards: Array,
    loss_mask: Array,
    group_size: int,
    idx_to_traj: list[int],
    advantage_mode: Any = "turn",
    **kwargs: Any,
) -> tuple[Array, None]:
    """RLinf ``"grpo_dynamic"``: see :func:`rlinf_algos.grpo_dynamic` (multi-turn, ``"turn"``/``"trajectory"``)."""
    _reject_unknown("compute_grpo_dynamic_advantages", kwargs, _PIPELINE_KEYWORDS)
    return (
        grpo_dynamic(
            rewards, loss_mask, group_size=group_size, idx_to_traj=idx_to_traj, advantage_mode=advantage_mode
        ),
        None,
    )


def compute_reinpp_advantages(
    rewards: Array,
    loss_mask: Array,
    group_size: int,
    use_reinpp_baseline: bool = False,
    kl_beta: float = 0.0,
    logprob: Array | None = None,
    ref_logprob: Array | None = None,
    kl_penalty_type: str = "",
    **kwargs: Any,
) -> tuple[Array, None]:
    """RLinf ``"reinpp"``: see :func:`rlinf_algos.reinpp`; the per-token KL is ``kl_penalty(logprob, ref_logprob)``.

    Deliberate deviations (fixed RLinf bugs): the reward goes to each sequence's last valid token along the
    time axis, and ``use_reinpp_baseline=True`` works without mutating ``rewards``.
    """
    _reject_unknown("compute_reinpp_advantages", kwargs, _PIPELINE_KEYWORDS)
    kl = None
    if kl_beta > 0:
        if logprob is None or ref_logprob is None:
            raise ValueError("reinpp with kl_beta > 0 needs logprob and ref_logprob ([L, B])")
        kl = kl_penalty(logprob, ref_logprob, kl_penalty_type)
    return (
        reinpp(
            rewards,
            loss_mask,
            group_size=group_size,
            use_reinpp_baseline=use_reinpp_baseline,
            kl_beta=kl_beta,
            kl=kl,
        ),
        None,
    )


def compute_opd_advantages(
    prev_logprobs: Array,
    teacher_logprobs: Array,
    loss_mask: Array | None = None,
    normalize_advantages: bool = False,
    num_action_chunks: int | None = None,
    **kwargs: Any,
) -> tuple[Array, None]:
    """RLinf ``"opd"``: see :func:`rlinf_algos.opd` (``[T(+1), E, C*D]`` → ``[T, E, C, D]``)."""
    _reject_unknown("compute_opd_advantages", kwargs, _PIPELINE_KEYWORDS)
    if prev_logprobs is None or teacher_logprobs is None:
        raise ValueError(
            "opd needs prev_logprobs (student rollout) and teacher_logprobs (post-rollout teacher)"
        )
    if normalize_advantages:
        raise ValueError("opd uses raw reverse-KL rewards: normalize_advantages must be False")
    if num_action_chunks is None:
        raise ValueError("opd needs num_action_chunks")
    num_steps = None if loss_mask is None else int(loss_mask.shape[0])
    return opd(
        prev_logprobs, teacher_logprobs, num_action_chunks=num_action_chunks, num_steps=num_steps
    ), None


def compute_raw_advantages(
    rewards: Array, loss_mask: Array, normalize_advantages: bool = False, **kwargs: Any
) -> tuple[Array, None]:
    """RLinf ``"raw"``: see :func:`rlinf_algos.raw`."""
    _reject_unknown("compute_raw_advantages", kwargs, _PIPELINE_KEYWORDS)
    return raw(rewards, loss_mask, normalize_advantages=normalize_advantages), None


ADVANTAGE_FNS: Mapping[str, AdvantageFn] = MappingProxyType(
    {
        "gae": compute_gae_advantages_and_returns,
        "grpo": compute_grpo_advantages,
        "grpo_video": compute_grpo_video_advantages,
        "grpo_dynamic": compute_grpo_dynamic_advantages,
        "reinpp": compute_reinpp_advantages,
        "opd": compute_opd_advantages,
        "raw": compute_raw_advantages,
    }
)
"""The built-in advantage estimators, by RLinf ``algorithm.adv_type`` name (read-only)."""

advantage_registry: Registry[AdvantageFn] = Registry("advantage", ADVANTAGE_FNS)
"""The registry ``calculate_adv_and_returns`` dispatches through: the built-ins plus user registrations."""


def register_advantage(name: str) -> Callable[[F], F]:
    """Decorator registering an advantage estimator under ``name`` (case-insensitive), RLinf's extension API.

    The function is called with the keyword arguments the entry layer passes (see
    :data:`ADV_ENTRY_KEYWORDS`, plus ``num_chunk``/``batch_size``/``chunk_size``/``n_steps`` on the embodied
    path), so it should accept ``**kwargs``, and must return ``(advantages, returns_or_None)``.

    Raises:
        ValueError: if ``name`` is taken by a different function (built-ins cannot be replaced).
    """
    register = advantage_registry.register(name)

    def decorator(fn: F) -> F:
        register(fn)
        return fn

    return decorator


def get_adv_and_returns(name: str) -> AdvantageFn:
    """The advantage estimator registered as ``name`` (case-insensitive).

    Raises:
        ValueError: naming ``name`` and listing the valid names.
    """
    return advantage_registry.get_fn(name)


def _require(kwargs: Mapping[str, Any], key: str, why: str) -> Any:
    if key not in kwargs:
        raise TypeError(f"calculate_adv_and_returns() missing required keyword argument {key!r} ({why})")
    return kwargs[key]


def calculate_adv_and_returns(**kwargs: Any) -> dict[str, Array] | tuple[Array, Array | None]:
    """Unified advantage entry with RLinf's keyword names (RLinf ``calculate_adv_and_returns``).

    ``task_type="embodied"``: ``rewards [T, E, C]``, ``dones [T+1, E, C]``, ``values [T+1, E, 1]`` (GAE),
    ``loss_mask``/``loss_mask_sum [T, E, C]`` are flattened by :func:`preprocess_embodied_advantages_inputs`
    (per ``reward_type``), scored by :func:`calculate_scores` for every estimator but ``gae`` and
    ``grpo_video``, and the result is unflattened: returns ``{"advantages": [T, E, chunk], "returns": ...}``
    (``"returns"`` only for GAE). ``adv_type="opd"`` skips the layout steps and returns
    ``{"advantages": [T, E, C, D]}``.

    Any other ``task_type`` is a reasoning batch: ``rewards [B]``, ``loss_mask [B, L]`` (+ ``values``,
    ``logprob``, ``ref_logprob`` ``[B, L]``) go through :func:`preprocess_reasoning_advantages_inputs`; returns
    the tuple ``(advantages [B, L], returns [B, L] | None)``.

    Raises:
        TypeError: for a keyword outside :data:`ADV_ENTRY_KEYWORDS` or a missing ``adv_type``/``task_type``.
        ValueError: for an unknown ``adv_type`` (listing the valid ones) or mis-shaped inputs.
    """
    _reject_unknown("calculate_adv_and_returns", kwargs, ADV_ENTRY_KEYWORDS)
    adv_type = _require(kwargs, "adv_type", "the advantage estimator name")
    task_type = _require(kwargs, "task_type", "'embodied' or 'reasoning'")
    fn = get_adv_and_returns(adv_type)
    key = str(adv_type).lower()  # lookups are case-insensitive, so the branches below are too
    kw: dict[str, Any] = dict(kwargs)

    if task_type == "embodied":
        if key == "opd":
            adv, ret = fn(**kw)
            return {"advantages": adv} if ret is None else {"advantages": adv, "returns": ret}
        pre = preprocess_embodied_advantages_inputs(
            _require(kw, "rewards", "[T, E, C] embodied rewards"),
            _require(kw, "dones", "[T+1, E, C] embodied dones"),
            kw.get("values") if key == "gae" else None,
            kw.get("loss_mask"),
            kw.get("loss_mask_sum"),
            reward_type=_require(kw, "reward_type", "'chunk_level' or 'action_level' for embodied tasks"),
        )
        kw.update(
            rewards=pre.rewards,
            dones=pre.dones,
            loss_mask=pre.loss_mask,
            loss_mask_sum=pre.loss_mask_sum,
            num_chunk=pre.num_chunk,
            batch_size=pre.batch_size,
            chunk_size=pre.chunk_size,
            n_steps=pre.n_steps,
        )
        if key == "gae":
            kw["values"] = pre.values
        if key not in ("gae", "grpo_video"):
            kw["rewards"] = calculate_scores(
                pre.rewards, pre.dones, group_size=_require(kw, "group_size", "envs per group for scoring")
            )
        adv, ret = fn(**kw)
        adv, ret = postprocess_embodied_advantages_outputs(
            adv, num_chunk=pre.num_chunk, chunk_size=pre.chunk_size, returns=ret
        )
        return {"advantages": adv} if ret is None else {"advantages": adv, "returns": ret}

    rpre = preprocess_reasoning_advantages_inputs(
        _require(kw, "rewards", "[B] one reward per response"),
        _require(kw, "loss_mask", "[B, L] response mask"),
        kw.get("values"),
        kw.get("logprob"),
        kw.get("ref_logprob"),
        adv_type=key,
        group_size=kw.get("group_size"),
        num_sequence=kw.get("num_sequence"),
    )
    kw.update(rewards=rpre.rewards, loss_mask=rpre.loss_mask, dones=rpre.dones)
    for name in ("values", "logprob", "ref_logprob"):
        if kw.get(name) is not None:
            kw[name] = getattr(rpre, name)
    adv, ret = fn(**kw)
    return postprocess_reasoning_advantages_outputs(adv, ret)
