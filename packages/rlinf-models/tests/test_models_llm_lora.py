"""LoRA on the LLM actor (peft): frozen base, merged weights out, PEFT-format adapters in and out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("peft")

from rlinf_core.checkpoint import CheckpointManager
from rlinf_core.config import AlgorithmConfig
from rlinf_models import OptimConfig
from rlinf_models.llm import (
    CausalLMPolicy,
    LLMActorConfig,
    LLMModelConfig,
    load_causal_lm,
    model_path_problems,
)
from rlinf_models.llm._export import export_checkpoint
from rlinf_models.llm._lora import ADAPTER_DIR, apply_lora, merge_lora_state
from rlinf_models.llm.testing import local_llm_actor, make_tiny_model_dir, random_grpo_batch

torch.set_num_threads(1)

GRPO = AlgorithmConfig(adv_type="grpo", loss_type="actor", update_epoch=1)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny") / "m", arch="qwen2", seed=2)


def lora_model(model_dir: Path, **kw: Any) -> LLMModelConfig:
    return LLMModelConfig(model_path=str(model_dir), is_lora=True, lora_rank=4, lora_alpha=8.0, **kw)


def lora_actor(model: LLMModelConfig, **kw: Any) -> Any:
    cfg = LLMActorConfig(
        model=model,
        optim=OptimConfig(lr=5e-2, clip_grad=1.0),
        global_batch_size=4,
        micro_batch_size=2,
        temperature=0.9,
        **kw,
    )
    return local_llm_actor(cfg, GRPO)


def make_batch(seed: int) -> dict[str, torch.Tensor]:
    batch: dict[str, torch.Tensor] = random_grpo_batch(seed)
    return batch


def score(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        out: torch.Tensor = CausalLMPolicy(model).eval()(
            batch["input_ids"], batch["attention_mask"], temperature=0.9
        )["logprobs"]
    return out


def test_merged_state_reproduces_peft_forward(model_dir: Path) -> None:
    """Our merge (W + s·BA) against peft's own LoRA forward on the same weights."""
    cfg = lora_model(model_dir)
    wrapped = apply_lora(load_causal_lm(cfg), cfg)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # non-zero B: the adapters change the model
        for name, p in wrapped.named_parameters():
            if ".lora_B." in name:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
    plain = load_causal_lm(LLMModelConfig(model_path=str(model_dir)))
    merged = merge_lora_state(wrapped.state_dict(), cfg.lora_scaling)
    assert set(merged) == set(plain.state_dict())
    plain.load_state_dict(merged)
    batch = make_batch(0)
    got, want, base = score(plain, batch), score(wrapped, batch), score(load_causal_lm(cfg), batch)
    assert (got - want).abs().max() < 1e-5 < (base - want).abs().max()


def test_lora_actor_trains_only_adapters_and_syncs_merged_weights(model_dir: Path, tmp_path: Path) -> None:
    actor = lora_actor(lora_model(model_dir))
    policy = actor.backend.policy
    trainable = {n for n, p in policy.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    per_layer = 7  # q, k, v, o, gate, up, down: A and B each
    assert len(trainable) == 2 * per_layer * policy.config.num_hidden_layers
    optimized = {id(p) for group in actor.backend.optimizer.param_groups for p in group["params"]}
    assert optimized == {id(p) for p in policy.parameters() if p.requires_grad}  # no state for frozen weights
    base_before = {n: p.detach().clone() for n, p in policy.named_parameters() if not p.requires_grad}
    batch = make_batch(1)
    before = actor.compute_logprobs(batch)["logprobs"]
    actor.run_training(batch)
    actor.run_training(make_batch(2))
    after = actor.compute_logprobs(batch)["logprobs"]
    scored = batch["loss_mask"].bool()
    assert (after - before)[scored].abs().max() > 1e-3  # the adapters learned
    for n, p in policy.named_parameters():
        if n in base_before:
            assert torch.equal(p, base_before[n]), n  # the base stayed frozen
    # What the rollout gets: the plain model's keys, merged weights that score like the actor.
    synced = actor.backend.export_hf_state_dict()
    plain = load_causal_lm(LLMModelConfig(model_path=str(model_dir)))
    assert set(synced) == set(plain.state_dict())
    plain.load_state_dict(synced)
    assert (score(plain, batch) - after)[scored].abs().max() <= 1e-5


def test_save_hf_and_export_write_merged_weights_and_a_peft_adapter(model_dir: Path, tmp_path: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = lora_model(model_dir)
    actor = lora_actor(model)
    batch = make_batch(3)
    actor.run_training(batch)
    want = actor.compute_logprobs(batch)["logprobs"]
    scored = batch["loss_mask"].bool()
    out = Path(actor.save_hf(str(tmp_path / "hf")))
    assert (out / ADAPTER_DIR / "adapter_config.json").is_file() and not (
        out / "adapter_config.json"
    ).exists()
    merged = load_causal_lm(LLMModelConfig(model_path=str(out)))  # a plain HF directory
    assert (score(merged, batch) - want)[scored].abs().max() <= 1e-5
    # The adapters alone, read by peft itself onto the base model.
    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir), out / ADAPTER_DIR)
    assert (score(peft_model.base_model.model, batch) - want)[scored].abs().max() <= 1e-5
    # ... and by a new actor through actor.model.lora_path: it starts where this one stopped.
    resumed = lora_actor(lora_model(model_dir, lora_path=str(out / ADAPTER_DIR)))
    assert (resumed.compute_logprobs(batch)["logprobs"] - want)[scored].abs().max() <= 1e-6
    with pytest.raises(ValueError, match="lora_rank"):
        lora_actor(
            LLMModelConfig(
                model_path=str(model_dir), is_lora=True, lora_rank=8, lora_path=str(out / ADAPTER_DIR)
            )
        )
    # rlinf-export of a LoRA run's checkpoint: the same merged model and adapter.
    manager = CheckpointManager(tmp_path / "run")
    staging = manager.begin(1)
    actor.save_checkpoint(str(staging))
    block = {"model_path": str(model_dir), "is_lora": True, "lora_rank": 4, "lora_alpha": 8.0}
    manager.commit(1, staging, {"config": {"actor": {"model": block}}})
    exported = export_checkpoint(tmp_path / "run", tmp_path / "exported")
    assert (score(load_causal_lm(LLMModelConfig(model_path=str(exported))), batch) - want)[
        scored
    ].abs().max() <= 1e-5
    assert json.loads((exported / ADAPTER_DIR / "adapter_config.json").read_text())["r"] == 4


def test_lora_reference_model_is_the_base_then_the_merged_policy(model_dir: Path) -> None:
    kl = AlgorithmConfig(adv_type="grpo", loss_type="actor", update_epoch=1, kl_beta=0.1)
    cfg = LLMActorConfig(
        model=lora_model(model_dir),
        optim=OptimConfig(lr=5e-2, clip_grad=1.0),
        global_batch_size=4,
        micro_batch_size=2,
        temperature=0.9,
    )
    actor = local_llm_actor(cfg, kl)
    assert actor.backend.ref_policy is not None
    assert not any(".lora_" in k for k in actor.backend.ref_policy.state_dict())  # a plain model
    batch = make_batch(6)
    actor.run_training(batch)
    out = actor.compute_logprobs(batch)
    scored = batch["loss_mask"].bool()
    assert (out["logprobs"] - out["ref_logprobs"])[scored].abs().max() > 1e-3
    actor.update_reference_model()
    out = actor.compute_logprobs(batch)
    assert (out["logprobs"] - out["ref_logprobs"])[scored].abs().max() <= 1e-5


def test_lora_checkpoint_round_trip_continues_exactly(model_dir: Path, tmp_path: Path) -> None:
    a = lora_actor(lora_model(model_dir))
    a.run_training(make_batch(4))
    a.save_checkpoint(str(tmp_path / "ck"))
    ma = a.run_training(make_batch(5))
    b = lora_actor(lora_model(model_dir), seed=99)
    b.load_checkpoint(str(tmp_path / "ck"))
    assert b.run_training(make_batch(5)) == ma
    sa, sb = a.backend.policy.state_dict(), b.backend.policy.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


def test_lora_config_is_checked_before_anything_loads(model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="is_lora applies to training_backend: fsdp"):
        LLMActorConfig(model=lora_model(model_dir), training_backend="megatron")
    bad = lora_model(model_dir, lora_path=str(tmp_path))
    assert any("lora_path" in p and "adapter_config.json" in p for p in model_path_problems(bad))
    with pytest.raises(ValueError, match="lora_target_modules"):
        lora_actor(lora_model(model_dir, lora_target_modules=["no_such_proj"]))
    assert lora_model(model_dir).lora_scaling == 2.0
    assert LLMModelConfig(model_path=str(model_dir), lora_rank=16).lora_scaling == 1.0
