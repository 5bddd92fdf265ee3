"""End to end: the reasoning app through real worker groups (tiny local model), collocated and disaggregated."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rlinf_core.checkpoint import is_complete
from rlinf_core.metrics import read_metrics
from rlinf_runners.apps import ReasoningApp, ReasoningConfig, run_app
from rlinf_scheduler import ModelParallelComponentPlacement, StaticClusterView

from .conftest import assert_profiled, assert_same_actor_state

pytestmark = pytest.mark.ray

APP_DIR = Path(__file__).resolve().parents[2] / "apps" / "reasoning"


def placement_mode(cfg: ReasoningConfig) -> str:
    """``"collocated"`` or ``"disaggregated"``: how ``cfg`` places actor and rollout on its simulated slots."""
    view = StaticClusterView(
        num_nodes=cfg.cluster.num_nodes, accelerators=cfg.cluster.simulated_accelerators_per_node
    )
    return ModelParallelComponentPlacement(cfg.cluster, view).placement_mode.name.lower()


def write_tiny_task(root: Path) -> dict[str, Path]:
    """A few single-digit sums as train / eval / SFT JSONL files."""
    root.mkdir(parents=True, exist_ok=True)
    rows = [(a, b) for a in range(1, 6) for b in range(1, 6)]
    files = {}
    for name, part in (("train", rows[:16]), ("eval", rows[16:20]), ("sft", rows[20:])):
        lines = []
        for a, b in part:
            row = {"prompt": f"Compute {a} + {b}.", "answer": str(a + b)}
            if name == "sft":
                row["solution"] = f"{a} + {b} = {a + b}. The answer is \\boxed{{{a + b}}}."
            lines.append(json.dumps(row))
        files[name] = root / f"{name}.jsonl"
        files[name].write_text("\n".join(lines) + "\n")
    return files


def tiny_overrides(model_dir: Path, data: dict[str, Path], log_path: Path) -> list[str]:
    """Overrides that shrink the default config to a few seconds per step on the tiny model."""
    return [
        f"actor.model.model_path={model_dir}",
        f"data.train_path={data['train']}",
        f"data.eval_path={data['eval']}",
        f"data.sft_path={data['sft']}",
        "data.rollout_batch_size=4",
        "data.eval_size=4",
        "data.max_prompt_length=96",
        "algorithm.group_size=2",
        "algorithm.dynamic_sampling=false",  # the random tiny model's groups are all wrong (DAPO test below)
        "actor.global_batch_size=8",
        "actor.micro_batch_size=4",
        "actor.torch_num_threads=1",
        "rollout.torch_num_threads=1",
        "rollout.sampling.max_new_tokens=8",
        "sft.steps=2",
        "sft.batch_size=4",
        "runner.max_epochs=2",
        "runner.val_check_interval=1",
        "runner.save_interval=1",
        "runner.step_timeout_s=180",
        "runner.progress_bar=false",
        "runner.logger.logger_backends=[]",
        f"runner.logger.log_path={log_path}",
    ]


@pytest.fixture(scope="module")
def app() -> ReasoningApp:
    return ReasoningApp(APP_DIR)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    pytest.importorskip("transformers")
    from rlinf_models.llm.testing import make_tiny_model_dir

    root = tmp_path_factory.mktemp("reasoning_tiny")
    return {"model": make_tiny_model_dir(root / "model"), "data": write_tiny_task(root / "data")}


@pytest.fixture(scope="module")
def cluster(app: ReasoningApp) -> Iterator[Any]:
    from rlinf_scheduler import Cluster

    c = Cluster(
        num_nodes=1,
        simulated_accelerators_per_node=2,
        ray_address="local",
        num_cpus=2,
        interrupt_main_on_failure=False,
    )
    try:
        yield c
    finally:
        c.shutdown()


PLACEMENTS = {
    "collocated": ("grpo_smollm2_cpu", "collocated"),
    "disaggregated": ("grpo_smollm2_disaggregated", "disaggregated"),  # pipelined: RLinf's rule
}


@pytest.mark.parametrize("mode", list(PLACEMENTS))
def test_sft_then_grpo_trains_evaluates_checkpoints_and_resumes(
    app: ReasoningApp, tiny: dict[str, Any], cluster: Any, tmp_path: Path, mode: str
) -> None:
    name, expected_mode = PLACEMENTS[mode]
    overrides = tiny_overrides(tiny["model"], tiny["data"], tmp_path)
    cfg = app.load_config(APP_DIR / "config" / f"{name}.yaml", [*overrides, "runner.profile=true"])
    assert placement_mode(cfg) == expected_mode
    result = run_app(app, cfg, cluster=cluster)
    assert result.global_step == 2
    # disaggregated runs are pipelined (runner.pipeline null): the actor trains on streamed micro-batches
    update = "actor/run_training_stream" if mode == "disaggregated" else "actor/run_training"
    phases = {"rollout": {"generate"}, "actor": {update}, "reward": {"reward"}}
    sizes = app.world_sizes(cfg)
    assert sizes is not None
    assert_profiled(result, phases, sizes, [1, 2])
    records = read_metrics(tmp_path)
    assert [r["sft/step"] for r in records if "sft/step" in r] == [1, 2]
    assert all(r["sft/loss"] > 0 for r in records if "sft/loss" in r)
    evals = [r for r in records if "eval/accuracy" in r]
    assert [r["step"] for r in evals] == [0, 1, 2]
    assert all(0.0 <= r["eval/accuracy"] <= 1.0 and r["eval/num_samples"] == 4 for r in evals)
    # each evaluation's samples as JSONL: the generated text with its reward and the reference answers
    for step, rec in zip([0, 1, 2], evals, strict=True):
        rows = [
            json.loads(x) for x in (tmp_path / "samples" / f"eval_step{step}.jsonl").read_text().splitlines()
        ]
        assert len(rows) == 4 and all(isinstance(r["response"], str) and r["answers"] for r in rows)
        assert sum(r["correct"] for r in rows) / 4 == pytest.approx(rec["eval/accuracy"])
    train = [r for r in records if "train/actor/policy_loss" in r]
    assert [r["step"] for r in train] == [1, 2]
    for r in train:
        assert r["rollout/num_samples"] == 8 and r["train/num_sequences"] == 8
        assert 0 < r["rollout/response_len_mean"] <= 8
        assert r["train/actor/num_optimizer_steps"] == 1
    ckpts = sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if is_complete(p))
    assert ckpts[-2:] == ["global_step_1", "global_step_2"]
    # resume: two more steps from the latest checkpoint, no second warm-up
    cfg2 = app.load_config(
        APP_DIR / "config" / f"{name}.yaml", [*overrides, "runner.max_epochs=3", "runner.resume_dir=auto"]
    )
    result2 = run_app(app, cfg2, cluster=cluster)
    assert result2.global_step == 3
    records2 = read_metrics(tmp_path)
    assert [r["sft/step"] for r in records2 if "sft/step" in r] == [1, 2]
    assert [r["step"] for r in records2 if "train/actor/policy_loss" in r] == [1, 2, 3]


@pytest.mark.slow
def test_ppo_with_value_head_and_dapo_filters(
    app: ReasoningApp, tiny: dict[str, Any], cluster: Any, tmp_path: Path
) -> None:
    overrides = [
        *tiny_overrides(tiny["model"], tiny["data"], tmp_path / "ppo"),
        "runner.max_epochs=1",
        "runner.val_check_interval=-1",
        "runner.save_interval=-1",
        "sft.steps=0",
    ]
    cfg = app.load_config(APP_DIR / "config" / "ppo_smollm2_cpu.yaml", overrides)
    result = run_app(app, cfg, cluster=cluster)
    assert result.global_step == 1
    (rec,) = [r for r in read_metrics(tmp_path / "ppo") if "train/actor/policy_loss" in r]
    assert "train/critic/value_loss" in rec and rec["train/actor/num_optimizer_steps"] >= 1
    # DAPO: dynamic sampling with the tiny random model (almost always all-wrong groups) generates up to
    # max_num_gen_batches batches and skips the update when no group has varied rewards
    dapo = [
        *tiny_overrides(tiny["model"], tiny["data"], tmp_path / "dapo"),
        "runner.max_epochs=1",
        "runner.val_check_interval=-1",
        "runner.save_interval=-1",
        "sft.steps=0",
        "algorithm.dynamic_sampling=true",
        "algorithm.max_num_gen_batches=2",
        "algorithm.overlong_buffer_len=4",
    ]
    cfg = app.load_config(APP_DIR / "config" / "dapo_smollm2_cpu.yaml", dapo)
    run_app(app, cfg, cluster=cluster)
    (rec,) = [r for r in read_metrics(tmp_path / "dapo") if "dapo/num_gen_batches" in r]
    assert 1 <= rec["dapo/num_gen_batches"] <= 2
    assert rec["train/skipped"] == (1.0 if rec["dapo/kept_groups"] == 0 else 0.0)


@pytest.mark.slow
def test_lora_with_importance_sampling_fix_trains_and_exports(
    app: ReasoningApp, tiny: dict[str, Any], cluster: Any, tmp_path: Path
) -> None:
    """The app with LoRA adapters and the rollout/trainer IS correction, then rlinf-export of its checkpoint."""
    from rlinf_models.llm import LLMModelConfig, load_causal_lm
    from rlinf_models.llm._export import export_checkpoint
    from rlinf_models.llm._lora import ADAPTER_DIR

    overrides = [
        *tiny_overrides(tiny["model"], tiny["data"], tmp_path),
        "runner.max_epochs=2",
        "runner.val_check_interval=-1",
        "runner.save_interval=2",
        "actor.model.is_lora=true",
        "actor.model.lora_rank=4",
        "algorithm.importance_sampling_fix=true",
    ]
    cfg = app.load_config(APP_DIR / "config" / "grpo_smollm2_cpu.yaml", overrides)
    assert run_app(app, cfg, cluster=cluster).global_step == 2
    records = [r for r in read_metrics(tmp_path) if "train/actor/policy_loss" in r]
    assert len(records) == 2 and all("train/actor/is_weight_mean" in r for r in records)
    out = export_checkpoint(tmp_path, tmp_path / "exported")
    assert (out / ADAPTER_DIR / "adapter_model.safetensors").is_file()
    model = load_causal_lm(LLMModelConfig(model_path=str(out)))
    assert not any(".lora_" in k for k in model.state_dict())


def test_one_step_plus_resume_is_bit_identical_to_two_straight_steps(
    app: ReasoningApp, tiny: dict[str, Any], cluster: Any, tmp_path: Path
) -> None:
    """SFT warm-up + 2 GRPO steps vs SFT + 1 step, then a resume to 2 (constant LR): the actor checkpoints of
    step 2 and the metrics of step 2 are bit-identical (prompt sampler, sampled tokens and RNGs restored)."""

    def run(log_path: Path, *extra: str) -> Any:
        overrides = [
            *tiny_overrides(tiny["model"], tiny["data"], log_path),
            "actor.optim.lr_schedule=constant",
        ]
        cfg = app.load_config(APP_DIR / "config" / "grpo_smollm2_cpu.yaml", [*overrides, *extra])
        return run_app(app, cfg, cluster=cluster)

    straight, split = tmp_path / "straight", tmp_path / "split"
    assert run(straight).global_step == 2
    assert run(split, "runner.max_epochs=1").global_step == 1
    assert run(split, "runner.resume_dir=auto").global_step == 2
    assert_same_actor_state(
        straight / "checkpoints" / "global_step_2", split / "checkpoints" / "global_step_2"
    )

    def step2(path: Path) -> list[dict[str, float]]:
        keep = [r for r in read_metrics(path) if r["step"] == 2]
        return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in keep][-2:]

    assert step2(split) == step2(straight) and len(step2(straight)) == 2  # train and eval records of step 2


def test_dynamic_scaling_grows_the_actor_and_learns_the_same(
    app: ReasoningApp, tiny: dict[str, Any], cluster: Any, tmp_path: Path
) -> None:
    """The disaggregated run with ``runner.dynamic_scaling``: the actor trains on both slots (its own and the
    rollout's) and the update is the static run's, up to the order of floating-point sums."""
    import torch

    records = {}
    for mode in ("static", "dynamic"):
        overrides = [
            *tiny_overrides(tiny["model"], tiny["data"], tmp_path / mode),
            "runner.val_check_interval=-1",
            "data.eval_path=null",
            "sft.steps=0",
            "runner.max_epochs=1",
            f"runner.dynamic_scaling={mode == 'dynamic'}",
            "runner.pipeline=false",  # the static baseline runs its phases in sequence too
        ]
        cfg = app.load_config(APP_DIR / "config" / "grpo_smollm2_disaggregated.yaml", overrides)
        sizes = app.world_sizes(cfg)
        assert sizes is not None and sizes["actor"] == (2 if mode == "dynamic" else 1)
        assert run_app(app, cfg, cluster=cluster).global_step == 1
        records[mode] = [r for r in read_metrics(tmp_path / mode) if "train/actor/policy_loss" in r]
    static, dynamic = records["static"], records["dynamic"]
    assert all(r["scaling/actor_ranks"] == 2 for r in dynamic) and all(
        "scaling/grow_s" not in r for r in static
    )
    # The first step trains on identical rollouts: the same loss and gradient, summed in another order.
    for key in ("train/actor/policy_loss", "train/actor/grad_norm", "train/actor/entropy"):
        assert dynamic[0][key] == pytest.approx(static[0][key], rel=1e-4, abs=1e-6), key
    assert dynamic[0]["rollout/reward_mean"] == static[0]["rollout/reward_mean"]
    a = torch.load(
        tmp_path / "static" / "checkpoints" / "global_step_1" / "actor" / "model.pt", weights_only=True
    )
    b = torch.load(
        tmp_path / "dynamic" / "checkpoints" / "global_step_1" / "actor" / "model.pt", weights_only=True
    )
    assert a.keys() == b.keys()
    assert max(float((a[k].float() - b[k].float()).abs().max()) for k in a) < 1e-5


def test_pipelined_step_streams_micro_batches_and_learns_the_same(
    app: ReasoningApp, tiny: dict[str, Any], cluster: Any, tmp_path: Path
) -> None:
    """``runner.pipeline`` on the disaggregated placement against the same placement run in sequence.

    The rollout generates in chunks of 4 samples in both runs (``rollout.max_batch_size=4``), so they sample
    the same tokens; the pipelined actor trains on each chunk as it arrives (2 micro-batches of 4, streamed)
    and takes one optimizer step. With a sequence-mean loss the update does not depend on how sequences are
    grouped into micro-batches, so both runs make the same update up to the order of floating-point sums.
    """
    import torch

    records = {}
    for mode in ("sequential", "pipelined"):
        overrides = [
            *tiny_overrides(tiny["model"], tiny["data"], tmp_path / mode),
            "runner.val_check_interval=-1",
            "data.eval_path=null",
            "sft.steps=0",
            "runner.max_epochs=2",
            "runner.save_interval=2",
            "rollout.max_batch_size=4",
            "algorithm.loss_agg_func=seq-mean-token-mean",
            f"runner.pipeline={mode == 'pipelined'}",
            "runner.profile=true",
        ]
        cfg = app.load_config(APP_DIR / "config" / "grpo_smollm2_disaggregated.yaml", overrides)
        result = run_app(app, cfg, cluster=cluster)
        assert result.global_step == 2
        records[mode] = [r for r in read_metrics(tmp_path / mode) if "train/actor/policy_loss" in r]
    seq, pipe = records["sequential"], records["pipelined"]
    assert all(r["train/actor/num_micro_batches"] == 2 for r in pipe)
    assert all("train/actor/num_micro_batches" not in r for r in seq)
    for a, b in zip(seq, pipe, strict=True):
        assert a["rollout/reward_mean"] == b["rollout/reward_mean"]
        assert a["rollout/response_len_mean"] == b["rollout/response_len_mean"]
        assert a["train/num_sequences"] == b["train/num_sequences"] == 8
        for key in ("train/actor/policy_loss", "train/actor/grad_norm", "train/actor/entropy", "adv/mean"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), key
    x = torch.load(
        tmp_path / "sequential" / "checkpoints" / "global_step_2" / "actor" / "model.pt", weights_only=True
    )
    y = torch.load(
        tmp_path / "pipelined" / "checkpoints" / "global_step_2" / "actor" / "model.pt", weights_only=True
    )
    assert x.keys() == y.keys()
    assert max(float((x[k].float() - y[k].float()).abs().max()) for k in x) < 1e-5


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["runner.pipeline=true"], "disaggregated placement"),
        (["runner.pipeline=true", "algorithm.adv_type=reinpp"], "algorithm.adv_type 'grpo'"),
        (["runner.pipeline=true", "algorithm.update_epoch=2"], "update_epoch 1"),
        (
            ["runner.pipeline=true", "actor.global_batch_size=16", "actor.micro_batch_size=8"],
            "one optimizer step",
        ),
    ],
)
def test_pipeline_refuses_what_it_cannot_overlap(
    app: ReasoningApp, overrides: list[str], needle: str
) -> None:
    """``runner.pipeline: true`` on the collocated default config (or with an estimator it cannot stream) is a
    config error before anything starts, naming the field."""
    from rlinf_core.config import ConfigError

    with pytest.raises(ConfigError, match=r"runner\.pipeline") as err:
        app.load_config(APP_DIR / "config" / "grpo_smollm2_cpu.yaml", overrides)  # checks the config
    assert needle in str(err.value)


def test_agent_app_refuses_the_pipeline() -> None:
    """The agent runner has no pipelined mode: asking for one is a config error naming the field."""
    from rlinf_core.config import ConfigError
    from rlinf_runners.apps import AgentApp

    agent_dir = APP_DIR.parent / "agent"
    with pytest.raises(ConfigError, match=r"runner\.pipeline: the agent runner"):
        AgentApp(agent_dir).load_config(agent_dir / "config" / "smollm2_tools.yaml", ["runner.pipeline=true"])
