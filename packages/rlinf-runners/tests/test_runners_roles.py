"""Each worker class plays its role: every method of the role protocol, with the same parameters.

The runners call workers only through the role protocols of ``rlinf_core.protocols`` (mypy checks those call
sites); this test closes the loop from the protocols to the worker classes the apps launch.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import pytest
from rlinf_core.protocols import (
    AgentRollout,
    EmbodiedActor,
    EmbodiedRollout,
    EnvRole,
    LLMActor,
    LLMRollout,
    OffPolicyActor,
    RewardRole,
    TimedRole,
    TracedRole,
)

_MEGATRON = "rlinf_models.llm.megatron"


def _megatron_worker() -> type[Any]:
    """``MegatronLLMActorWorker``, importable without megatron-core: its methods only forward to the backend."""
    try:
        return importlib.import_module(f"{_MEGATRON}._worker").MegatronLLMActorWorker  # type: ignore[no-any-return]
    except ImportError:
        pass
    backend = types.ModuleType(f"{_MEGATRON}._backend")
    backend.MegatronActorBackend = object  # type: ignore[attr-defined]
    saved = {name: sys.modules.get(name) for name in (f"{_MEGATRON}._backend", f"{_MEGATRON}._worker")}
    sys.modules[f"{_MEGATRON}._backend"] = backend
    sys.modules.pop(f"{_MEGATRON}._worker", None)
    try:
        return importlib.import_module(f"{_MEGATRON}._worker").MegatronLLMActorWorker  # type: ignore[no-any-return]
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def _load(module: str, name: str) -> type[Any]:
    if name == "MegatronLLMActorWorker":
        return _megatron_worker()
    return getattr(importlib.import_module(module), name)  # type: ignore[no-any-return]


PLAYERS = [
    ("rlinf_models", "EmbodiedActorWorker", EmbodiedActor),
    ("rlinf_models.offpolicy", "OffPolicyActorWorker", OffPolicyActor),
    ("rlinf_rollout", "EmbodiedRolloutWorker", EmbodiedRollout),
    ("rlinf_envs", "EnvWorker", EnvRole),
    ("rlinf_models.llm", "LLMActorWorker", LLMActor),
    (_MEGATRON, "MegatronLLMActorWorker", LLMActor),
    ("rlinf_rollout.llm", "LLMRolloutWorker", LLMRollout),
    ("rlinf_rollout.agent", "AgentRolloutWorker", AgentRollout),
    ("rlinf_core.rewards", "RewardWorker", RewardRole),
]


def _role_methods(role: type[Any]) -> dict[str, Callable[..., Any]]:
    """The methods a role protocol declares, its base roles' included."""
    out: dict[str, Callable[..., Any]] = {}
    for klass in reversed(role.__mro__):
        if klass is Protocol or not getattr(klass, "_is_protocol", False):
            continue
        out.update({n: f for n, f in vars(klass).items() if inspect.isfunction(f) and not n.startswith("_")})
    return out


def _params(fn: Callable[..., Any]) -> list[tuple[str, Any, Any]]:
    # Ray's tracing hook adds ``_ray_trace_ctx`` to the signatures of a class it has made an actor of (another
    # test in the same process may have launched the worker): not part of the role.
    params = inspect.signature(fn).parameters.values()
    return [(p.name, p.kind, p.default) for p in params if p.name != "_ray_trace_ctx"]


@pytest.fixture(params=PLAYERS, ids=[name for _, name, _ in PLAYERS])
def player(request: pytest.FixtureRequest) -> Iterator[tuple[type[Any], type[Any]]]:
    module, name, role = request.param
    yield _load(module, name), role


def test_worker_class_satisfies_its_role(player: tuple[type[Any], type[Any]]) -> None:
    worker_cls, role = player
    methods = _role_methods(role)
    assert methods, f"{role.__name__} declares no methods"
    for name, fn in methods.items():
        impl = inspect.getattr_static(worker_cls, name, None)
        assert inspect.isfunction(impl), (
            f"{worker_cls.__name__}.{name} is not a public method (role {role.__name__})"
        )
        assert _params(getattr(worker_cls, name)) == _params(fn), (
            f"{worker_cls.__name__}.{name}{inspect.signature(getattr(worker_cls, name))} does not match "
            f"{role.__name__}.{name}{inspect.signature(fn)}"
        )


def test_role_methods_are_found_with_their_bases() -> None:
    embodied = _role_methods(EmbodiedActor)
    assert {"run_training", "sync_model_to_rollout", "save_checkpoint", "pop_timings"} <= set(embodied)
    assert set(_role_methods(TimedRole)) == {"pop_timings"}
    assert {"generate", "run_episodes", "offload", "sync_model_from_actor"} <= set(
        _role_methods(AgentRollout)
    )


def test_a_mismatched_signature_is_caught() -> None:
    class Wrong:
        def pop_timings(self, reset: bool = True) -> dict[str, float]:
            return {}

    assert _params(Wrong.pop_timings) != _params(_role_methods(TimedRole)["pop_timings"])


def test_every_worker_class_plays_the_traced_role(player: tuple[type[Any], type[Any]]) -> None:
    """``runner.profile`` calls ``set_tracing`` / ``pop_trace`` on every group, whatever its role."""
    worker_cls, _ = player
    for name, fn in _role_methods(TracedRole).items():
        assert _params(getattr(worker_cls, name)) == _params(fn), f"{worker_cls.__name__}.{name}"
