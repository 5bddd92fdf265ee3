"""``actor.training_backend``: config validation, the import check and the worker class it selects (no GPU).

megatron-core is not installed in the shared environment: the Megatron worker class is imported here under a
stand-in ``megatron`` package (every ``megatron.*`` module exists and every attribute is a placeholder), which is
enough to import and inspect the class without constructing it.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest
from rlinf_core.config import AlgorithmConfig
from rlinf_models.llm import (
    TRAINING_BACKENDS,
    LLMActorConfig,
    LLMModelConfig,
    actor_data_parallel_size,
    actor_worker_class,
    actor_worker_kwargs,
    check_training_backend,
    training_backend_problems,
)
from rlinf_models.llm import _backends as backends
from rlinf_models.llm.megatron import MegatronConfig

MEGATRON_INSTALLED = importlib.util.find_spec("megatron") is not None


def _actor(**kwargs: Any) -> LLMActorConfig:
    return LLMActorConfig(**{"model": LLMModelConfig(model_path="/ckpt/model"), **kwargs})


class _PlaceholderModule(types.ModuleType):
    """A ``megatron.*`` module whose every public attribute is a fresh placeholder class."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (), {})


class _FakeMegatronFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves ``megatron`` and every ``megatron.*`` submodule as a :class:`_PlaceholderModule` package."""

    def find_spec(
        self, fullname: str, path: Any, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == "megatron" or fullname.startswith("megatron."):
            return importlib.util.spec_from_loader(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _PlaceholderModule(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__path__ = []


@pytest.fixture
def fake_megatron() -> Iterator[None]:
    """``megatron.core`` importable for one test; every module it let in is removed afterwards."""
    if MEGATRON_INSTALLED:
        pytest.skip("megatron-core is installed: the stand-in would shadow it")
    package = importlib.import_module("rlinf_models.llm.megatron")
    modules_before, attrs_before = set(sys.modules), set(vars(package))
    finder = _FakeMegatronFinder()
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        for name in set(sys.modules) - modules_before:
            if name.split(".")[0] == "megatron" or name.startswith("rlinf_models.llm.megatron."):
                del sys.modules[name]
        for attr in set(vars(package)) - attrs_before:
            delattr(package, attr)


# ------------------------------------------------------------------------------------------------ config
def test_backend_field_names_the_allowed_values() -> None:
    assert TRAINING_BACKENDS == ("fsdp", "megatron")
    assert _actor().training_backend == "fsdp" and _actor().megatron is None
    with pytest.raises(
        ValueError, match=r"'training_backend' must be one of 'fsdp', 'megatron', got 'deepspeed'"
    ):
        _actor(training_backend="deepspeed")


def test_megatron_block_is_refused_with_fsdp() -> None:
    with pytest.raises(ValueError, match=r"actor.megatron is set but actor.training_backend is 'fsdp'"):
        _actor(megatron=MegatronConfig(tensor_parallel_size=2))
    cfg = _actor(training_backend="megatron", megatron=MegatronConfig(tensor_parallel_size=2))
    assert cfg.megatron is not None and cfg.megatron.tensor_parallel_size == 2


# ------------------------------------------------------------------------------------------ import check
@pytest.mark.skipif(MEGATRON_INSTALLED, reason="megatron-core is installed")
def test_megatron_without_megatron_core_names_the_extra() -> None:
    cfg = _actor(training_backend="megatron")
    with pytest.raises(ImportError, match=r"actor.training_backend is 'megatron'.*rlinf-models\[megatron"):
        check_training_backend(cfg)
    with pytest.raises(ImportError, match=r"rlinf-models\[megatron"):
        actor_worker_class(cfg)
    check_training_backend(_actor())  # fsdp needs nothing beyond the package


def test_import_check_follows_the_importability_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = _actor(training_backend="megatron")
    monkeypatch.setattr(backends, "_megatron_core_importable", lambda: True)
    check_training_backend(cfg)
    monkeypatch.setattr(backends, "_megatron_core_importable", lambda: False)
    with pytest.raises(ImportError, match=r"uv sync --extra megatron --package rlinf-models"):
        check_training_backend(cfg)


# ------------------------------------------------------------------------------------------ layout checks
def test_data_parallel_size_per_backend() -> None:
    assert actor_data_parallel_size(_actor(), 6) == 6
    tp2pp2 = _actor(
        training_backend="megatron", megatron=MegatronConfig(tensor_parallel_size=2, pipeline_parallel_size=2)
    )
    assert actor_data_parallel_size(tp2pp2, 8) == 2
    assert actor_data_parallel_size(_actor(training_backend="megatron"), 3) == 3  # no block: TP = PP = 1
    with pytest.raises(ValueError, match=r"6 ranks must be a multiple of .*tensor_parallel_size .* \(4\)"):
        actor_data_parallel_size(tp2pp2, 6)


def test_backend_problems() -> None:
    assert training_backend_problems(_actor(), loss_type="actor_critic", world_size=3) == []
    cfg = _actor(training_backend="megatron", megatron=MegatronConfig(tensor_parallel_size=2))
    assert training_backend_problems(cfg, loss_type="actor", world_size=4) == []
    assert training_backend_problems(cfg, loss_type="actor") == []
    critic = training_backend_problems(cfg, loss_type="actor_critic", world_size=3)
    assert len(critic) == 2
    assert "trains the policy only" in critic[0] and "'actor_critic'" in critic[0]
    assert "3 ranks must be a multiple" in critic[1]
    head = _actor(
        training_backend="megatron", model=LLMModelConfig(model_path="/ckpt/model", add_value_head=True)
    )
    assert "add_value_head must be false" in training_backend_problems(head, loss_type="actor")[0]


# ------------------------------------------------------------------------------------------ worker class
def test_fsdp_selects_the_llm_actor_worker() -> None:
    from rlinf_models.llm import LLMActorWorker

    cfg = _actor()
    assert actor_worker_class(cfg) is LLMActorWorker
    assert actor_worker_kwargs(cfg) == {}


def test_megatron_selects_the_megatron_worker_whose_signature_takes_the_app_arguments(
    fake_megatron: None,
) -> None:
    layout = MegatronConfig(tensor_parallel_size=2)
    cfg = _actor(training_backend="megatron", megatron=layout)
    cls = actor_worker_class(cfg)
    from rlinf_models.llm.megatron import MegatronLLMActorWorker

    assert cls is MegatronLLMActorWorker and cls.__name__ == "MegatronLLMActorWorker"
    kwargs = actor_worker_kwargs(cfg)
    assert kwargs == {"megatron": layout}
    # What the apps pass to create_group binds to the constructor without a leftover or a missing argument.
    bound = inspect.signature(cls).bind(cfg, AlgorithmConfig(), total_steps=10, **kwargs)
    assert bound.arguments["megatron"] is layout and bound.arguments["total_steps"] == 10
    # Without a block the worker gets the default layout explicitly.
    assert actor_worker_kwargs(_actor(training_backend="megatron")) == {"megatron": MegatronConfig()}


def test_fake_megatron_is_gone_after_the_fixture() -> None:
    if MEGATRON_INSTALLED:
        pytest.skip("megatron-core is installed")
    assert "megatron" not in sys.modules
    assert not backends._megatron_core_importable()


# ------------------------------------------------------------------------------------------ backend protocol
def _protocol_methods() -> list[str]:
    from rlinf_models.llm import LLMActorBackend

    return sorted(n for n, f in vars(LLMActorBackend).items() if callable(f) and not n.startswith("_"))


def test_both_backends_implement_the_backend_protocol(fake_megatron: None) -> None:
    from rlinf_models.llm import FSDPActorBackend, LLMActorBackend
    from rlinf_models.llm.megatron import MegatronActorBackend

    names = _protocol_methods()
    assert "run_training" in names and "export_hf_state_dict" in names
    for backend in (FSDPActorBackend, MegatronActorBackend):
        for name in names:
            ours = inspect.signature(getattr(backend, name))
            theirs = inspect.signature(getattr(LLMActorBackend, name))
            assert list(ours.parameters) == list(theirs.parameters), (backend.__name__, name)


def test_the_worker_is_a_thin_host_of_every_protocol_method() -> None:
    """Each backend method is reachable through the worker (the weight sync reaches export_hf_state_dict)."""
    from rlinf_models.llm import LLMActorWorker

    hosted = set(_protocol_methods()) - {"export_hf_state_dict"}
    assert hosted <= set(vars(LLMActorWorker))
    assert "sync_model_to_rollout" in vars(LLMActorWorker)
