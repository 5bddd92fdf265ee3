"""End to end: VLM GRPO (tiny random Qwen2.5-VL, shapes VQA with images, the ``vqa`` reward) through real Ray."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import pytest
from rlinf_core.config import ConfigError
from rlinf_core.data import load_prompt_dataset
from rlinf_core.metrics import read_metrics
from rlinf_runners.apps import ReasoningApp, run_app

APP_DIR = Path(__file__).resolve().parents[2] / "apps" / "reasoning"
CLUSTER_SLOTS = 1  # simulated accelerator slots of the module's cluster (tests/e2e/conftest.py)
DATA = APP_DIR / "data" / "vqa_shapes"


@pytest.fixture(scope="module")
def app() -> ReasoningApp:
    return ReasoningApp(APP_DIR)


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("transformers")
    pytest.importorskip("PIL")
    from rlinf_models.llm.testing import make_tiny_vlm_dir

    return make_tiny_vlm_dir(tmp_path_factory.mktemp("tiny_qwen2_5_vl") / "model")


def test_shipped_vqa_data_is_held_out_and_its_demonstrations_score_full_reward() -> None:
    from rlinf_algos.rewards import VQAReward

    splits = {name: load_prompt_dataset(DATA / f"{name}.jsonl") for name in ("train", "eval", "sft")}
    assert [len(splits[n]) for n in ("train", "eval", "sft")] == [128, 32, 32]
    for rows in splits.values():
        assert all(len(e.images) == 1 and Path(e.images[0]).is_file() for e in rows)
        assert all(e.prompt_text.startswith("<image>") for e in rows)
    # No eval image in train or SFT (distinct scenes), and every demonstration earns the full reward.
    eval_images = {Path(e.images[0]).read_bytes() for e in splits["eval"]}
    assert not eval_images & {Path(e.images[0]).read_bytes() for n in ("train", "sft") for e in splits[n]}
    reward = VQAReward(reward_weights={"qa_accuracy": 1.0, "think_format": 1.0, "answer_format": 1.0})
    sft = list(splits["sft"])
    assert reward.get_reward([e.solution or "" for e in sft], [list(e.answers) for e in sft]) == [3.0] * len(
        sft
    )


def test_gpu_config_loads_and_names_a_real_checkpoint(app: ReasoningApp, vlm_dir: Path) -> None:
    """The 3B GPU config is never run here: it parses, and its checks pass once model_path is a VLM directory."""
    cfg = app.load_config(
        APP_DIR / "config" / "grpo_qwen2_5_vl_3b_gpu.yaml", [f"actor.model.model_path={vlm_dir}"]
    )
    assert (
        cfg.reward.reward_type == "vqa" and cfg.rollout.engine == "hf" and cfg.actor.model.dtype == "bfloat16"
    )
    raw = (APP_DIR / "config" / "grpo_qwen2_5_vl_3b_gpu.yaml").read_text()
    assert "model_path: /models/Qwen2.5-VL-3B-Instruct" in raw and "NEVER RUN HERE" in raw
    app.check(cfg, {"actor": 2, "rollout": 2, "reward": 1})


def test_vision_language_model_refuses_what_it_cannot_run(
    app: ReasoningApp, vlm_dir: Path, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError) as err:
        app.load_config(
            APP_DIR / "config" / "grpo_qwen2_5_vl_tiny.yaml",
            [
                f"actor.model.model_path={vlm_dir}",
                "rollout.engine=vllm",
                "actor.use_remove_padding=true",
                f"runner.logger.log_path={tmp_path}",
            ],
        )
    text = str(err.value)
    assert "only rollout.engine: hf generates from images" in text
    assert "actor.use_remove_padding is not supported" in text


class _Done:
    def __init__(self, results: list[Any]) -> None:
        self.results = results

    def wait(self, timeout: float | None = None) -> list[Any]:
        return self.results


class _InProcess:
    """A one-rank 'group' around a worker built in this process; the weight sync copies the state dict."""

    synced: ClassVar[dict[str, Any]] = {}

    def __init__(self, name: str, worker: Any) -> None:
        self.name, self.worker, self.world_size = name, worker, 1

    def call(self, fn: Any, *args: Any, **kwargs: Any) -> _Done:
        if fn.__name__ == "sync_model_to_rollout":
            _InProcess.synced = self.worker.backend.export_hf_state_dict()
            return _Done([0])
        if fn.__name__ == "sync_model_from_actor":
            self.worker.engine.update_weights(_InProcess.synced)
            return _Done([0])
        return _Done([getattr(self.worker, fn.__name__)(*args, **kwargs)])


def _local(cls: Any, name: str, *args: Any) -> Any:
    from rlinf_scheduler import PackedPlacementStrategy, StaticClusterView, WorkerContext

    placement = PackedPlacementStrategy(0, 0).get_placement(StaticClusterView(num_nodes=1, accelerators=1))[0]
    worker = cls.__new__(cls)
    worker._rlinf_context = WorkerContext(
        group_name=name,
        rank=0,
        world_size=1,
        namespace="test",
        placement=placement,
        node_ip="127.0.0.1",
        master_addr="127.0.0.1",
        env_vars={},
    )
    worker.__init__(*args)
    return worker


def test_vlm_grpo_steps_in_process(app: ReasoningApp, vlm_dir: Path, tmp_path: Path) -> None:
    """The runner with the real actor, HF rollout and vqa reward workers in this process (no Ray), 2 steps."""
    import torch
    from rlinf_core.rewards import RewardWorker
    from rlinf_models.llm import LLMActorWorker, load_tokenizer
    from rlinf_models.llm._vlm import VLMPromptEncoder, load_image_processor
    from rlinf_rollout.llm import LLMRolloutWorker
    from rlinf_runners import ReasoningRunner

    cfg = app.load_config(
        APP_DIR / "config" / "grpo_qwen2_5_vl_tiny.yaml",
        [
            f"actor.model.model_path={vlm_dir}",
            "runner.progress_bar=false",
            "runner.logger.logger_backends=[]",
            f"runner.logger.log_path={tmp_path}",
            "runner.save_interval=-1",
        ],
    )
    actor = _local(LLMActorWorker, "actor", cfg.actor, cfg.algorithm)
    rollout = _local(LLMRolloutWorker, "rollout", cfg.rollout, cfg.actor.model)
    reward = _local(RewardWorker, "reward", cfg.reward)
    encoder = VLMPromptEncoder(load_tokenizer(cfg.actor.model), load_image_processor(cfg.actor.model))
    runner = ReasoningRunner(
        cfg.runner,
        actor=_InProcess("actor", actor),
        rollout=_InProcess("rollout", rollout),
        reward=_InProcess("reward", reward),
        algorithm=cfg.algorithm,
        data=cfg.data,
        encoder=encoder,
        train_data=load_prompt_dataset(DATA / "train.jsonl"),
        eval_data=load_prompt_dataset(DATA / "eval.jsonl"),
        sampling={"temperature": 1.0, "max_new_tokens": 16},
        to_batch=lambda b: {k: torch.from_numpy(v) for k, v in b.items()},
        batch_multiple=cfg.actor.micro_batch_size,
    )
    result = runner.run()
    assert result.global_step == 2
    train = [r for r in read_metrics(tmp_path) if "train/actor/policy_loss" in r]
    assert [r["step"] for r in train] == [1, 2]
    for r in train:
        assert r["train/num_sequences"] == 8 and r["train/actor/num_optimizer_steps"] == 1
        assert r["train/actor/rollout_logprob_diff"] <= 1e-5  # the actor sees the images the rollout saw
    assert [r["step"] for r in read_metrics(tmp_path) if "eval/accuracy" in r] == [0, 1, 2]


@pytest.mark.ray
@pytest.mark.slow  # not timed here (the shared CPU's benchmark lock); the in-process test above runs the same steps
def test_vlm_grpo_two_steps_with_images(
    app: ReasoningApp, vlm_dir: Path, cluster: Any, tmp_path: Path
) -> None:
    cfg = app.load_config(
        APP_DIR / "config" / "grpo_qwen2_5_vl_tiny.yaml",
        [
            f"actor.model.model_path={vlm_dir}",
            "runner.progress_bar=false",
            "runner.logger.logger_backends=[]",
            f"runner.logger.log_path={tmp_path}",
        ],
    )
    result = run_app(app, cfg, cluster=cluster)
    assert result.global_step == 2
    records = read_metrics(tmp_path)
    train = [r for r in records if "train/actor/policy_loss" in r]
    assert [r["step"] for r in train] == [1, 2]
    for r in train:
        assert r["rollout/num_samples"] == 8 and r["train/num_sequences"] == 8
        assert r["train/actor/num_optimizer_steps"] == 1
        assert 0.0 <= r["rollout/reward_mean"] <= 1.0
        # The actor, scoring the sampled tokens with the same images, reproduces the rollout's log-probs.
        assert r["train/actor/rollout_logprob_diff"] <= 1e-4
    evals = [r for r in records if "eval/accuracy" in r]
    assert [r["step"] for r in evals] == [0, 1, 2] and all(r["eval/num_samples"] == 4 for r in evals)
    rows = [json.loads(x) for x in (tmp_path / "samples" / "eval_step2.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and all(
        r["answers"][0][1] == "." for r in rows
    )  # "C. 3": multiple-choice references
    assert (tmp_path / "checkpoints" / "global_step_2").is_dir()
