"""GPU backends selected from YAML alone, checked without a GPU and without Ray.

``apps/reasoning/config/grpo_megatron_gpu.yaml`` (Megatron actor, TP = 2) loads, is validated before any worker
starts, and makes the reasoning app launch the Megatron actor worker with its layout; the agent app takes the
same ``actor.training_backend``. megatron-core is not installed here, so loading first fails with the error that
names the extra; the rest runs with the importability probe patched (the worker class itself is never built).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
from rlinf_core.config import ConfigError
from rlinf_models.llm import _backends as backends
from rlinf_models.llm import actor_worker_class
from rlinf_models.llm.megatron import MegatronConfig
from rlinf_runners.apps import AgentApp, ReasoningApp
from rlinf_runners.apps import _llm as llm_app
from rlinf_scheduler import StaticClusterView

from .test_e2e_reasoning import APP_DIR

GPU_YAML = APP_DIR / "config" / "grpo_megatron_gpu.yaml"
AGENT_YAML = APP_DIR.parent / "agent" / "config" / "smollm2_tools.yaml"
MEGATRON_INSTALLED = importlib.util.find_spec("megatron") is not None


@pytest.fixture(scope="module")
def app() -> ReasoningApp:
    return ReasoningApp(APP_DIR)


@pytest.fixture
def megatron_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backends, "_megatron_core_importable", lambda: True)


@pytest.fixture(scope="module")
def gpu_model(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """An override pointing the GPU YAML's model at a local checkpoint directory (paths are checked at load)."""
    path = tmp_path_factory.mktemp("Qwen2.5-1.5B-Instruct")
    (path / "config.json").write_text("{}")
    return [f"actor.model.model_path={path}"]


class _Recorder:
    """Stands in for a worker class: records ``create_group`` / ``launch`` and returns a ready group."""

    calls: list[dict[str, Any]]

    def __init__(self, name: str) -> None:
        self.name = name
        self.calls = []

    def create_group(self, *args: Any, **kwargs: Any) -> _Recorder:
        self.calls.append({"args": args, "kwargs": kwargs})
        return self

    def launch(self, cluster: Any, strategy: Any, *, name: str) -> _Recorder:
        self.calls[-1] |= {"strategy": strategy, "name": name}
        return self

    def wait_ready(self, timeout: float) -> None:
        assert timeout > 0


@pytest.mark.skipif(MEGATRON_INSTALLED, reason="megatron-core is installed")
def test_gpu_yaml_without_megatron_core_names_the_extra(app: ReasoningApp, gpu_model: list[str]) -> None:
    with pytest.raises(ImportError, match=r"actor.training_backend is 'megatron'.*rlinf-models\[megatron"):
        app.load_config(GPU_YAML, gpu_model)


def test_gpu_yaml_loads_and_validates(
    app: ReasoningApp, megatron_importable: None, gpu_model: list[str]
) -> None:
    cfg = app.load_config(GPU_YAML, gpu_model)
    assert cfg.actor.training_backend == "megatron"
    assert cfg.actor.megatron == MegatronConfig(
        tensor_parallel_size=2, pipeline_parallel_size=1, sequence_parallel=True
    )
    assert cfg.rollout.engine in ("vllm", "hf")
    assert app.world_sizes(cfg) is None  # real GPUs: the placement is checked again at launch
    app.check(cfg, {"actor": 4, "rollout": 4, "reward": 1})  # TP 2 x DP 2
    with pytest.raises(ConfigError) as err:
        app.check(cfg, {"actor": 3, "rollout": 3, "reward": 1})
    assert err.value.problems == [
        "the actor's 3 ranks must be a multiple of actor.megatron.tensor_parallel_size × pipeline_parallel_size (2)"
    ]
    # Batch sizes are checked against the data-parallel replicas (8 ranks / TP 2 = 4), not against the ranks.
    small = app.load_config(GPU_YAML, [*gpu_model, "actor.global_batch_size=8"])
    with pytest.raises(ConfigError) as err:
        app.check(small, {"actor": 8, "rollout": 8, "reward": 1})
    assert err.value.problems == [
        "actor.global_batch_size (8) must be a multiple of actor.micro_batch_size (4) x data-parallel actor ranks (4)"
    ]


def test_megatron_refuses_a_critic_before_launch(
    app: ReasoningApp, megatron_importable: None, gpu_model: list[str]
) -> None:
    with pytest.raises(ConfigError, match=r"'megatron' trains the policy only"):
        app.load_config(
            GPU_YAML,
            [
                *gpu_model,
                "algorithm.loss_type=actor_critic",
                "algorithm.adv_type=gae",
                "actor.model.add_value_head=true",
            ],
        )


def test_megatron_options_with_fsdp_are_refused(app: ReasoningApp) -> None:
    cpu = APP_DIR / "config" / "grpo_smollm2_cpu.yaml"
    with pytest.raises(ConfigError, match=r"actor.megatron is set but actor.training_backend is 'fsdp'"):
        app.load_config(cpu, ["actor.megatron.tensor_parallel_size=2"])
    with pytest.raises(
        ConfigError, match=r"actor.training_backend: 'deepspeed' is not one of 'fsdp', 'megatron'"
    ):
        app.load_config(cpu, ["actor.training_backend=deepspeed"])


def test_reasoning_launch_builds_the_megatron_worker_with_its_layout(
    app: ReasoningApp, megatron_importable: None, monkeypatch: pytest.MonkeyPatch, gpu_model: list[str]
) -> None:
    cfg = app.load_config(GPU_YAML, gpu_model)
    chosen: list[Any] = []
    actor = _Recorder("actor")

    def select(actor_cfg: Any) -> _Recorder:
        chosen.append(actor_cfg)
        return actor

    monkeypatch.setattr(llm_app, "actor_worker_class", select)
    rollout, reward = _Recorder("rollout"), _Recorder("reward")
    view = StaticClusterView(num_nodes=1, accelerators=4)
    groups = app.launch(cfg, view, worker_classes={"rollout": rollout, "reward": reward})
    assert groups == {"actor": actor, "rollout": rollout, "reward": reward}
    assert chosen == [cfg.actor]
    (call,) = actor.calls
    assert call["args"] == (cfg.actor, cfg.algorithm)
    assert call["kwargs"] == {"total_steps": cfg.runner.total_steps, "megatron": cfg.actor.megatron}
    assert call["name"] == "actor"


def test_reasoning_launch_keeps_the_fsdp_worker_by_default(
    app: ReasoningApp, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rlinf_models.llm import LLMActorWorker

    cfg = app.load_config(APP_DIR / "config" / "grpo_smollm2_cpu.yaml")
    assert actor_worker_class(cfg.actor) is LLMActorWorker
    actor = _Recorder("actor")
    monkeypatch.setattr(llm_app, "actor_worker_class", lambda _cfg: actor)
    app.launch(
        cfg,
        StaticClusterView(num_nodes=1, accelerators=1),
        worker_classes={"rollout": _Recorder("r"), "reward": _Recorder("w")},
    )
    assert actor.calls[0]["kwargs"] == {"total_steps": cfg.runner.total_steps}


def test_agent_app_takes_the_megatron_backend(
    megatron_importable: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = AgentApp(APP_DIR.parent / "agent")
    # Two pipeline stages need two actor ranks: the agent checks the layout against its placement too.
    overrides = [
        "actor.training_backend=megatron",
        "actor.megatron.pipeline_parallel_size=2",
        "cluster.simulated_accelerators_per_node=2",
        'cluster.component_placement={"actor,rollout,reward": 0-1}',
    ]
    cfg = agent.load_config(AGENT_YAML, overrides)
    assert cfg.actor.megatron == MegatronConfig(pipeline_parallel_size=2)
    monkeypatch.setattr(backends, "_megatron_core_importable", lambda: False)
    with pytest.raises(ImportError, match=r"rlinf-models\[megatron"):
        agent.load_config(AGENT_YAML, overrides)
    with pytest.raises(ConfigError, match=r"actor.megatron is set but actor.training_backend is 'fsdp'"):
        agent.load_config(AGENT_YAML, ["actor.megatron.tensor_parallel_size=2"])


def test_gpu_yaml_says_it_never_ran() -> None:
    assert Path(GPU_YAML).is_file()
    text = GPU_YAML.read_text()
    assert "NEVER RUN" in text and "tensor_parallel_size: 2" in text
