"""RLinf-compatible policy-loss entry layer: ``policy_loss(**kwargs)`` and the policy-loss registry.

This is the only loss module that takes ``**kwargs``: it accepts exactly the keyword names RLinf 0.4's
workers pass (``task_type``, ``loss_type``, ``logprob_type``, ``reward_type``, ``logprobs``, ...), runs RLinf's
embodied pre-processing, dispatches through the registry and returns what RLinf returns. Any other keyword
raises a TypeError naming it (RLinf silently ignores typos), and layouts RLinf would silently mis-broadcast
raise a ValueError naming both shapes. The math lives in ``_losses``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, MutableMapping
from types import MappingProxyType
from typing import Any, TypeAlias, TypeVar

from .._aggregation import LossAggFn, get_loss_agg_func
from .._array import Array, namespace
from .._losses import (
    compute_decoupled_ppo_actor_loss,
    compute_opd_actor_loss,
    compute_ppo_actor_loss,
    compute_ppo_critic_loss,
    stop_gradient,
)
from .._masked import masked_mean
from .._registry import Registry

__all__ = [
    "LOSS_ENTRY_KEYWORDS",
    "POLICY_LOSS_FNS",
    "PolicyLossFn",
    "compute_decoupled_ppo_actor_critic_loss",
    "compute_grpo_actor_loss_fn",
    "get_policy_loss",
    "policy_loss",
    "policy_loss_registry",
    "postprocess_loss_metric",
    "preprocess_loss_inputs",
    "register_policy_loss",
]

PolicyLossFn: TypeAlias = Callable[..., tuple[Array, dict[str, Any]]]
"""A policy loss called with RLinf keyword arguments, returning ``(loss, metrics)``."""

F = TypeVar("F", bound=PolicyLossFn)

LOSS_ENTRY_KEYWORDS = frozenset(
    {
        # dispatch
        "task_type",
        "loss_type",
        "loss_agg_func",
        # actor inputs (reasoning and embodied)
        "logprobs",
        "old_logprobs",
        "advantages",
        "loss_mask",
        "clip_ratio_low",
        "clip_ratio_high",
        "clip_ratio_c",
        "clip_log_ratio_min",
        "clip_log_ratio_max",
        "fast_path_zero_loss_mask",
        # embodied layout and critic
        "logprob_type",
        "reward_type",
        "single_action_dim",
        "loss_mask_sum",
        "max_episode_steps",
        "critic_warmup",
        "values",
        "returns",
        "prev_values",
        "value_clip",
        "huber_delta",
        # asynchronous (decoupled) PPO
        "proximal_logprobs",
        "versions",
        "current_version",
        "behave_weight_threshold",
    }
)
"""Every keyword RLinf 0.4's workers pass to ``policy_loss`` (and hence to the registered losses)."""

_LEVELS = ("token_level", "action_level", "chunk_level")


def _reject_unknown(fn_name: str, kwargs: Mapping[str, Any], allowed: frozenset[str] | set[str]) -> None:
    unknown = sorted(k for k in kwargs if k not in allowed)
    if unknown:
        raise TypeError(
            f"{fn_name}() got unexpected keyword argument(s) {', '.join(repr(k) for k in unknown)}; "
            f"accepted keywords: {', '.join(sorted(allowed))}"
        )


def _required(fn_name: str, kwargs: Mapping[str, Any], key: str, why: str) -> Any:
    if kwargs.get(key) is None:
        raise TypeError(f"{fn_name}() missing required keyword argument {key!r} ({why})")
    return kwargs[key]


def _agg(kwargs: Mapping[str, Any]) -> LossAggFn:
    agg = kwargs.get("loss_agg_func")
    if agg is None:
        return masked_mean
    if isinstance(agg, str):
        return get_loss_agg_func(agg)
    if not callable(agg):
        raise TypeError(f"loss_agg_func must be a callable or an aggregator name, got {agg!r}")
    return agg  # type: ignore[no-any-return]


# --------------------------------------------------------------------------------------- pre/post
def _reshape_logprobs(xp: Any, x: Array | None, level: str, bsz: int, dim: int) -> Array | None:
    if x is None:
        return None
    x3 = xp.reshape(x, (bsz, -1, dim))
    if level == "token_level":
        return x3
    if level == "action_level":
        return xp.sum(x3, axis=-1)
    return xp.sum(x3, axis=(1, 2))


def _expand_to_target_dim(xp: Any, x: Array | None, target_ndim: int) -> Array | None:
    """Append trailing unit axes until ``x`` has ``target_ndim`` dims (never reshapes or expands)."""
    if x is None:
        return None
    while x.ndim < target_ndim:
        x = xp.expand_dims(x, axis=-1)
    return x


def preprocess_loss_inputs(**kwargs: Any) -> dict[str, Any]:
    """Reshape embodied loss inputs to the ``logprob_type`` granularity (RLinf ``preprocess_loss_inputs``).

    - ``reward_type="chunk_level"``: ``advantages``, ``loss_mask``, ``loss_mask_sum``, ``values``,
      ``prev_values``, ``returns`` ``[N, 1]`` are flattened to ``[N]``.
    - ``logprob_type="token_level"``: log-prob tensors (and ``versions``) ``[N, C*D]`` → ``[N, C, D]``
      (``D = single_action_dim``); ``advantages`` (unless ``loss_type="opd"``), ``loss_mask`` and
      ``loss_mask_sum`` get a trailing unit axis.
    - ``"action_level"``: log-probs summed over D → ``[N, C]``; ``versions`` take the first action dim.
    - ``"chunk_level"``: log-probs summed over C and D → ``[N]``; ``versions`` take ``[:, 0, 0]``.
    - Finally the per-entry tensors get trailing unit axes up to ``logprobs.ndim``.

    Returns:
        A new kwargs dict with the reshaped entries (the input dict is not modified).

    Raises:
        TypeError: for an unknown keyword or a missing ``single_action_dim`` where one is needed.
        ValueError: for an unknown ``logprob_type``, or (``loss_type="opd"``, token level) advantages whose
            shape differs from the log-probs'.
    """
    _reject_unknown("preprocess_loss_inputs", kwargs, LOSS_ENTRY_KEYWORDS)
    kw = dict(kwargs)
    logprobs = _required("preprocess_loss_inputs", kw, "logprobs", "current log-probs")
    xp = namespace(logprobs)
    flat_keys = ("advantages", "loss_mask", "loss_mask_sum", "values", "prev_values", "returns")
    if kw.get("reward_type") == "chunk_level":
        for key in flat_keys:
            if kw.get(key) is not None:
                kw[key] = xp.reshape(kw[key], (-1,))

    level = kw.get("logprob_type")
    if level is not None and level not in _LEVELS:
        raise ValueError(f"unknown logprob_type {level!r}; valid: {', '.join(_LEVELS)} (or None)")
    if level is not None:
        dim = _required(
            "preprocess_loss_inputs", kw, "single_action_dim", f"needed for logprob_type={level!r}"
        )
        bsz = int(logprobs.shape[0])
        for key in ("logprobs", "old_logprobs", "proximal_logprobs"):
            kw[key] = _reshape_logprobs(xp, kw.get(key), level, bsz, int(dim))
        versions = kw.get("versions")
        if versions is not None:
            v3 = xp.reshape(versions, (bsz, -1, int(dim)))
            kw["versions"] = (
                v3 if level == "token_level" else (v3[..., 0] if level == "action_level" else v3[:, 0, 0])
            )
        if level == "token_level":
            if str(kw.get("loss_type", "")).lower() == "opd":
                adv, lp = kw.get("advantages"), kw["logprobs"]
                if adv is not None and tuple(adv.shape) != tuple(lp.shape):
                    raise ValueError(
                        f"OPD advantages shape {list(adv.shape)} must match logprobs shape {list(lp.shape)}"
                    )
            elif kw.get("advantages") is not None:
                kw["advantages"] = xp.expand_dims(kw["advantages"], axis=-1)
            for key in ("loss_mask", "loss_mask_sum"):
                if kw.get(key) is not None:
                    kw[key] = xp.expand_dims(kw[key], axis=-1)

    target_ndim = int(kw["logprobs"].ndim)
    for key in (*flat_keys, "versions"):
        kw[key] = _expand_to_target_dim(xp, kw.get(key), target_ndim)
    return {k: v for k, v in kw.items() if v is not None or k in kwargs}


def postprocess_loss_metric(metrics_data: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Turn every 0-d array metric into a Python number, in place (RLinf ``postprocess_loss_metric``).

    Returns:
        ``metrics_data`` itself.
    """
    for key, value in metrics_data.items():
        item = getattr(value, "item", None)
        if callable(item) and not isinstance(value, int | float):
            metrics_data[key] = stop_gradient(value).item()
    return metrics_data


# ------------------------------------------------------------------------------- registered losses
def _actor_loss(fn_name: str, kw: Mapping[str, Any]) -> tuple[Array, dict[str, Any]]:
    return compute_ppo_actor_loss(
        _required(fn_name, kw, "logprobs", "current log-probs"),
        _required(fn_name, kw, "old_logprobs", "behaviour log-probs"),
        _required(fn_name, kw, "advantages", "advantages"),
        kw.get("loss_mask"),
        clip_ratio_low=_required(fn_name, kw, "clip_ratio_low", "PPO lower clip ε_low"),
        clip_ratio_high=_required(fn_name, kw, "clip_ratio_high", "PPO upper clip ε_high"),
        clip_ratio_c=kw.get("clip_ratio_c"),
        loss_agg_func=_agg(kw),
        max_episode_steps=kw.get("max_episode_steps"),
        loss_mask_sum=kw.get("loss_mask_sum"),
        critic_warmup=bool(kw.get("critic_warmup", False)),
        clip_log_ratio_min=kw.get("clip_log_ratio_min"),
        clip_log_ratio_max=kw.get("clip_log_ratio_max"),
        fast_path_zero_loss_mask=bool(kw.get("fast_path_zero_loss_mask", False)),
    )


def _critic_loss(fn_name: str, kw: Mapping[str, Any]) -> tuple[Array, dict[str, Any]]:
    return compute_ppo_critic_loss(
        _required(fn_name, kw, "values", "current value predictions"),
        _required(fn_name, kw, "returns", "value targets"),
        _required(fn_name, kw, "prev_values", "rollout-time values"),
        kw.get("loss_mask"),
        value_clip=_required(fn_name, kw, "value_clip", "critic clip range"),
        huber_delta=_required(fn_name, kw, "huber_delta", "Huber switch point"),
        max_episode_steps=kw.get("max_episode_steps"),
        loss_mask_sum=kw.get("loss_mask_sum"),
    )


def compute_grpo_actor_loss_fn(**kwargs: Any) -> tuple[Array, dict[str, Any]]:
    """RLinf ``"actor"``: the PPO/GRPO actor loss, see :func:`rlinf_algos.compute_ppo_actor_loss`."""
    _reject_unknown("compute_grpo_actor_loss_fn", kwargs, LOSS_ENTRY_KEYWORDS)
    return _actor_loss("compute_grpo_actor_loss_fn", kwargs)


def _ppo_actor_critic_entry(**kwargs: Any) -> tuple[Array, dict[str, Any]]:
    """RLinf ``"actor_critic"``: PPO actor loss + clipped Huber critic loss (no value coefficient)."""
    _reject_unknown("compute_ppo_actor_critic_loss", kwargs, LOSS_ENTRY_KEYWORDS)
    actor_loss, metrics = _actor_loss("compute_ppo_actor_critic_loss", kwargs)
    critic_loss, critic_metrics = _critic_loss("compute_ppo_actor_critic_loss", kwargs)
    metrics.update(critic_metrics)
    return actor_loss + critic_loss, metrics


def compute_decoupled_ppo_actor_critic_loss(**kwargs: Any) -> tuple[Array, dict[str, Any]]:
    """RLinf ``"decoupled_actor_critic"``: decoupled (async) PPO actor loss + clipped Huber critic loss."""
    name = "compute_decoupled_ppo_actor_critic_loss"
    _reject_unknown(name, kwargs, LOSS_ENTRY_KEYWORDS)
    actor_loss, metrics = compute_decoupled_ppo_actor_loss(
        _required(name, kwargs, "logprobs", "current log-probs"),
        _required(name, kwargs, "old_logprobs", "behaviour log-probs"),
        _required(name, kwargs, "advantages", "advantages"),
        kwargs.get("loss_mask"),
        clip_ratio_low=_required(name, kwargs, "clip_ratio_low", "PPO lower clip ε_low"),
        clip_ratio_high=_required(name, kwargs, "clip_ratio_high", "PPO upper clip ε_high"),
        proximal_logprobs=kwargs.get("proximal_logprobs"),
        versions=kwargs.get("versions"),
        current_version=kwargs.get("current_version"),
        clip_ratio_c=kwargs.get("clip_ratio_c"),
        loss_agg_func=_agg(kwargs),
        max_episode_steps=kwargs.get("max_episode_steps"),
        loss_mask_sum=kwargs.get("loss_mask_sum"),
        critic_warmup=bool(kwargs.get("critic_warmup", False)),
        behave_weight_threshold=kwargs.get("behave_weight_threshold"),
    )
    critic_loss, critic_metrics = _critic_loss(name, kwargs)
    metrics.update(critic_metrics)
    return actor_loss + critic_loss, metrics


def _opd_entry(**kwargs: Any) -> tuple[Array, dict[str, Any]]:
    """RLinf ``"opd"``: on-policy distillation loss, see :func:`rlinf_algos.compute_opd_actor_loss`."""
    name = "compute_opd_actor_loss"
    _reject_unknown(name, kwargs, LOSS_ENTRY_KEYWORDS)
    return compute_opd_actor_loss(
        _required(name, kwargs, "logprobs", "student log-probs"),
        _required(name, kwargs, "advantages", "teacher - student log-prob rewards"),
        _required(name, kwargs, "loss_mask", "OPD needs a loss mask"),
        _required(name, kwargs, "loss_mask_sum", "OPD needs per-trajectory valid lengths"),
        loss_agg_func=_agg(kwargs),
        max_episode_steps=kwargs.get("max_episode_steps"),
    )


POLICY_LOSS_FNS: Mapping[str, PolicyLossFn] = MappingProxyType(
    {
        "actor": compute_grpo_actor_loss_fn,
        "actor_critic": _ppo_actor_critic_entry,
        "decoupled_actor_critic": compute_decoupled_ppo_actor_critic_loss,
        "opd": _opd_entry,
    }
)
"""The built-in policy losses, by RLinf ``algorithm.loss_type`` name (read-only)."""

policy_loss_registry: Registry[PolicyLossFn] = Registry("policy loss", POLICY_LOSS_FNS)
"""The registry ``policy_loss`` dispatches through: the built-ins plus user registrations."""


def register_policy_loss(name: str) -> Callable[[F], F]:
    """Decorator registering a policy loss under ``name`` (case-insensitive), RLinf's extension API.

    The function is called with keyword arguments only: the :data:`LOSS_ENTRY_KEYWORDS` the caller passed
    (after embodied pre-processing) plus any keyword the function names explicitly in its signature. It must
    return ``(loss, metrics)``.

    Raises:
        ValueError: if ``name`` is taken by a different function (built-ins cannot be replaced).
    """
    register = policy_loss_registry.register(name)

    def decorator(fn: F) -> F:
        register(fn)
        return fn

    return decorator


def get_policy_loss(name: str) -> PolicyLossFn:
    """The policy loss registered as ``name`` — case-insensitive (RLinf's lookup is case-sensitive).

    Raises:
        ValueError: naming ``name`` and listing the valid names.
    """
    return policy_loss_registry.get_fn(name)


def _declared_keywords(fn: Callable[..., Any]) -> set[str]:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return set()
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {p.name for p in params if p.kind in kinds}


def policy_loss(**kwargs: Any) -> tuple[Array, dict[str, Any]]:
    """Unified policy-loss entry with RLinf's keyword names (RLinf ``policy_loss``).

    Looks up ``loss_type`` (``actor``, ``actor_critic``, ``decoupled_actor_critic``, ``opd`` or a registered
    name, case-insensitive). For ``task_type="embodied"`` the inputs first go through
    :func:`preprocess_loss_inputs` and the returned metrics through :func:`postprocess_loss_metric` (Python
    floats); other task types keep 0-d array metrics. ``loss_agg_func`` may be a callable or a name
    (``"token-mean"``, ``"seq-mean-token-sum"``, ``"seq-mean-token-mean"``).

    Returns:
        ``(loss, metrics)``.

    Raises:
        TypeError: for a keyword outside :data:`LOSS_ENTRY_KEYWORDS` (and the selected loss's own named
            parameters), or a missing ``loss_type`` / required input.
        ValueError: for an unknown ``loss_type`` (listing the valid ones) or shapes that do not fit, e.g.
            ``logprob_type="chunk_level"`` with ``reward_type="action_level"`` (logprobs ``[N]`` vs advantages
            ``[N, 1]``, which RLinf silently broadcasts to ``[N, N]``).
    """
    loss_type = _required("policy_loss", kwargs, "loss_type", "the registered loss name")
    fn = get_policy_loss(loss_type)
    _reject_unknown("policy_loss", kwargs, LOSS_ENTRY_KEYWORDS | _declared_keywords(fn))
    kw: dict[str, Any] = dict(kwargs)
    embodied = kw.get("task_type") == "embodied"
    if embodied:
        extra = {k: kw.pop(k) for k in list(kw) if k not in LOSS_ENTRY_KEYWORDS}
        kw = preprocess_loss_inputs(**kw)
        kw.update(extra)
    loss, metrics = fn(**kw)
    if embodied:
        postprocess_loss_metric(metrics)
    return loss, metrics
