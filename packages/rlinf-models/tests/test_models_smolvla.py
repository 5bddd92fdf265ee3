"""rlinf_models.smolvla against LeRobot's own SmolVLA (tiny checkpoints in data/), its layout and its policy."""

from __future__ import annotations

import json
import shutil
import string
from pathlib import Path

import attrs
import pytest
import torch

pytest.importorskip("transformers")

from rlinf_models.pi0 import CheckpointMismatchError, load_lerobot_norm_stats, load_tokenizer
from rlinf_models.pi0.testing import LEROBOT_TINY_SPEC, lerobot_tiny_obs, write_char_tokenizer
from rlinf_models.policies import PolicyConfig, build_inference_policy, build_policy, rollout_state_dict
from rlinf_models.smolvla import (
    SmolVLAConfig,
    SmolVLAModel,
    SmolVLAPolicy,
    apply_lora,
    load_smolvla,
    normalize,
    preprocess_image,
    save_smolvla,
    tokenize_prompts,
)
from rlinf_models.smolvla.testing import TINY_SMOLVLA, make_tiny_smolvla
from safetensors.torch import load_file, save_file

torch.set_num_threads(1)

ROOT = Path(__file__).parent / "data"
VARIANTS = ["lerobot_smolvla_tiny", "lerobot_smolvla_tiny_fewer_experts"]
NORMALIZER = "policy_preprocessor_step_5_normalizer_processor.safetensors"


def _reference(variant: str) -> tuple[dict[str, torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    ref = load_file(str(ROOT / variant / "reference.safetensors"))
    return ref, list(ref["images"].unbind(1)), list(ref["image_masks"].unbind(1))


def _outputs(model: SmolVLAModel, variant: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    ref, images, masks = _reference(variant)
    with torch.no_grad():
        prefix = model.eval().encode_prefix(images, masks, ref["tokens"], ref["token_mask"], ref["state"])
        # LeRobot computes the loss in one joint pass over prefix + suffix; ours goes through the KV cache.
        losses = model.flow_matching_loss(prefix, None, ref["actions"], ref["noise"], ref["time"])
        sampled = model.sample_actions(prefix, None, ref["noise"])
        return losses, sampled, model.value(prefix)


# --- against LeRobot ---


@pytest.mark.parametrize("variant", VARIANTS)
def test_lerobot_checkpoint_loads_strictly_and_reproduces_lerobot_outputs(variant: str) -> None:
    model, report = load_smolvla(ROOT / variant / "ckpt")
    assert report.prefixed and not report.tied_from
    assert report.initialised and all(name.startswith("value_head.") for name in report.initialised)
    assert model.config.vlm_layers == 4 and model.config.expert_width == 24
    ref, _, _ = _reference(variant)
    losses, sampled, _ = _outputs(model, variant)
    torch.testing.assert_close(losses, ref["losses"], atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(sampled, ref["sampled"], atol=2e-5, rtol=1e-5)


def test_preprocess_image_pads_left_and_top_as_lerobot() -> None:
    data = load_file(str(ROOT / VARIANTS[0] / "images.safetensors"))
    torch.testing.assert_close(preprocess_image(data["raw"], 32), data["base"], atol=1e-6, rtol=0)
    channels_last = (data["raw"].flip(-1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1)
    torch.testing.assert_close(preprocess_image(channels_last, 32), data["wrist"], atol=1e-2, rtol=0)


def test_normalisation_matches_lerobots_normalizer() -> None:
    stats = load_lerobot_norm_stats(ROOT / VARIANTS[0] / "ckpt" / NORMALIZER)
    data = load_file(str(ROOT / VARIANTS[0] / "normalized.safetensors"))
    torch.testing.assert_close(normalize(data["raw_state"], stats["observation.state"]), data["state"])
    torch.testing.assert_close(normalize(data["raw_action"], stats["action"]), data["action"])


# --- checkpoint layout ---


def test_saved_keys_shapes_and_outputs_round_trip(tmp_path: Path) -> None:
    model, _ = load_smolvla(ROOT / VARIANTS[0] / "ckpt")
    save_smolvla(model, tmp_path, state_dim=5, action_dim=7, camera_names=("base", "wrist"))
    ours = load_file(str(tmp_path / "model.safetensors"))
    theirs = load_file(str(ROOT / VARIANTS[0] / "ckpt" / "model.safetensors"))
    assert {k: v.shape for k, v in ours.items()} == {k: v.shape for k, v in theirs.items()}
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["type"] == "smolvla" and config["num_vlm_layers"] == 4 and "rlinf_architecture" in config
    again, report = load_smolvla(tmp_path)
    assert not report.initialised  # the value head came back from value_head.safetensors
    for a, b in zip(_outputs(model, VARIANTS[0]), _outputs(again, VARIANTS[0]), strict=True):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


@pytest.mark.parametrize("change", ["missing", "unexpected", "reshaped"])
def test_strict_load_names_the_offending_keys(tmp_path: Path, change: str) -> None:
    shutil.copytree(ROOT / VARIANTS[0] / "ckpt", tmp_path / "ckpt")
    file = tmp_path / "ckpt" / "model.safetensors"
    tensors = load_file(str(file))
    name = "model.vlm_with_expert.lm_expert.layers.1.self_attn.k_proj.weight"
    if change == "missing":
        del tensors[name]
    elif change == "unexpected":
        tensors["model.extra.weight"] = torch.zeros(1)
        name = "extra.weight"
    else:
        tensors[name] = torch.zeros(16, 24)  # a self-attention layer's shape in a cross-attention layer
    save_file(tensors, str(file))
    with pytest.raises(CheckpointMismatchError, match=rf"1 {change if change != 'reshaped' else 'shape'}.*"):
        load_smolvla(tmp_path / "ckpt")
    with pytest.raises(CheckpointMismatchError, match=name.removeprefix("model.").replace(".", r"\.")):
        load_smolvla(tmp_path / "ckpt")


def test_tied_output_head_is_filled_from_the_embedding(tmp_path: Path) -> None:
    shutil.copytree(ROOT / VARIANTS[0] / "ckpt", tmp_path / "ckpt")
    file = tmp_path / "ckpt" / "model.safetensors"
    tensors = load_file(str(file))
    del tensors["model.vlm_with_expert.vlm.lm_head.weight"]
    save_file(tensors, str(file))
    _, report = load_smolvla(tmp_path / "ckpt")
    assert report.tied_from == {
        "vlm_with_expert.vlm.lm_head.weight": "vlm_with_expert.vlm.model.text_model.embed_tokens.weight"
    }


def test_config_json_errors_name_the_field() -> None:
    data = json.loads((ROOT / VARIANTS[0] / "ckpt" / "config.json").read_text())
    with pytest.raises(ValueError, match="'attention_mode' = 'self_attn' is not supported"):
        SmolVLAConfig.from_lerobot_dict({**data, "attention_mode": "self_attn"})
    with pytest.raises(ValueError, match="'type' must be 'smolvla'"):
        SmolVLAConfig.from_lerobot_dict({**data, "type": "pi0"})
    bare = {k: v for k, v in data.items() if k != "rlinf_architecture"}
    with pytest.raises(ValueError, match="vlm_model_name' 'tiny-smolvlm' is neither a local directory"):
        SmolVLAConfig.from_lerobot_dict(bare)
    with pytest.raises(ValueError, match="num_expert_layers"):
        attrs.evolve(TINY_SMOLVLA, num_expert_layers=3)


def test_a_local_vlm_directory_gives_the_sizes(tmp_path: Path) -> None:
    data = json.loads((ROOT / VARIANTS[0] / "ckpt" / "config.json").read_text())
    (tmp_path / "vlm").mkdir()
    (tmp_path / "vlm" / "config.json").write_text(json.dumps(data.pop("rlinf_architecture")["vlm_config"]))
    config = SmolVLAConfig.from_lerobot_dict({**data, "vlm_model_name": "vlm"}, base_dir=tmp_path)
    assert config.vlm == load_smolvla(ROOT / VARIANTS[0] / "ckpt")[0].config.vlm


# --- published size ---

SMOLVLA_BASE = {  # the architecture fields of lerobot/smolvla_base's config.json
    "type": "smolvla",
    "chunk_size": 50,
    "max_state_dim": 32,
    "max_action_dim": 32,
    "resize_imgs_with_padding": [512, 512],
    "tokenizer_max_length": 48,
    "num_steps": 10,
    "vlm_model_name": "HuggingFaceTB/SmolVLM2-500M-Video-Instruct",
    "attention_mode": "cross_attn",
    "num_expert_layers": 0,
    "num_vlm_layers": 16,
    "self_attn_every_n_layers": 2,
    "expert_width_multiplier": 0.75,
}


def test_published_size_builds_on_the_meta_device_with_published_shapes() -> None:
    config = SmolVLAConfig.from_lerobot_dict(SMOLVLA_BASE)
    with torch.device("meta"):
        model = SmolVLAModel(config)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    expert = "vlm_with_expert.lm_expert.layers"
    text = "vlm_with_expert.vlm.model.text_model"
    assert shapes["state_proj.weight"] == (960, 32)
    assert shapes["action_in_proj.weight"] == (720, 32) and shapes["action_time_mlp_in.weight"] == (720, 1440)
    assert shapes[f"{expert}.0.self_attn.q_proj.weight"] == (960, 720)
    assert shapes[f"{expert}.0.self_attn.k_proj.weight"] == (320, 720)  # self-attention layer
    assert shapes[f"{expert}.1.self_attn.k_proj.weight"] == (320, 320)  # cross-attention layer
    assert shapes[f"{expert}.15.mlp.gate_proj.weight"] == (2048, 720)
    assert f"{expert}.16.input_layernorm.weight" not in shapes
    assert shapes[f"{text}.embed_tokens.weight"] == (49_280, 960)
    assert (
        f"{text}.layers.15.mlp.down_proj.weight" in shapes
        and f"{text}.layers.16.mlp.down_proj.weight" not in shapes
    )
    assert shapes["vlm_with_expert.vlm.model.connector.modality_projection.proj.weight"] == (960, 12_288)
    vision = "vlm_with_expert.vlm.model.vision_model.embeddings"
    assert shapes[f"{vision}.position_embedding.weight"] == (1024, 768)
    assert config.image_tokens == 64
    assert not any(k.startswith("vlm_with_expert.lm_expert.embed_tokens") for k in shapes)


def test_lora_on_the_published_size_adapts_only_the_towers_linear_layers() -> None:
    config = SmolVLAConfig.from_lerobot_dict(SMOLVLA_BASE)
    with torch.device("meta"):
        model = SmolVLAModel(config)
        apply_lora(model, PolicyConfig(model_type="mlp", lora_rank=8))
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    backbone = {n for n in trainable if n.startswith("vlm_with_expert.")}
    assert backbone and all(".lora_" in n for n in backbone)
    assert not any("vision_model" in n for n in backbone)
    assert {n.split(".")[1] for n in backbone} == {"vlm", "lm_expert"}
    assert {"state_proj.weight", "action_out_proj.weight"} <= trainable


# --- the RL policy ---

SPEC = LEROBOT_TINY_SPEC


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # 3 specials + 28 characters: within the fixtures' 64-token vocabulary.
    return write_char_tokenizer(tmp_path_factory.mktemp("tok"), string.ascii_lowercase + " \n")


def _policy(tokenizer_dir: Path, seed: int = 0, **changes: object) -> SmolVLAPolicy:
    ckpt = ROOT / VARIANTS[0] / "ckpt"
    config = PolicyConfig(
        model_type="smolvla",
        model_path=str(ckpt),
        tokenizer_path=str(tokenizer_dir),
        norm_stats_path=str(ckpt / NORMALIZER),
        image_keys=("base", "wrist"),
        num_action_chunks=3,
        denoising_steps=4,
    )
    torch.manual_seed(seed)
    policy = build_policy(SPEC, attrs.evolve(config, **changes))
    assert isinstance(policy, SmolVLAPolicy)
    return policy


def _obs(n: int = 4, seed: int = 0) -> dict[str, torch.Tensor]:
    return lerobot_tiny_obs(n, torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(("method", "joint"), [("flow_sde", False), ("flow_sde", True), ("flow_noise", None)])
def test_evaluate_recomputes_the_rollouts_log_probs(
    tokenizer_dir: Path, method: str, joint: bool | None
) -> None:
    policy = _policy(tokenizer_dir, noise_method=method, joint_logprob=joint)
    obs = _obs()
    out = policy.act(obs, generator=torch.Generator().manual_seed(1))
    assert out.actions.shape == out.logprobs.shape == (4, 3, 7) and out.values.shape == (4, 1)
    assert out.forward_inputs is not None and out.forward_inputs["chains"].shape == (4, 5, 4, 8)
    assert bool((out.logprobs != 0).all())
    logprobs, entropy, values = policy.evaluate(obs, out.actions, out.forward_inputs)
    # Same weights, same chain: the rollout's and the trainer's log-probs agree (float32 forward passes).
    torch.testing.assert_close(logprobs, out.logprobs, atol=1e-5, rtol=0)
    torch.testing.assert_close(values, out.values)
    assert entropy.shape == (4, 3, 7)
    logprobs.sum().backward()  # type: ignore[no-untyped-call]
    grad = policy.model.action_out_proj.weight.grad
    assert grad is not None and bool(grad.abs().sum() > 0)


def test_each_env_is_prompted_with_its_own_instruction(tokenizer_dir: Path) -> None:
    policy = _policy(tokenizer_dir)
    tokens, _ = tokenize_prompts(load_tokenizer(tokenizer_dir), list(SPEC.task_descriptions), 6)
    torch.testing.assert_close(policy.task_tokens, tokens)
    obs = _obs()
    a = policy.act(obs, deterministic=True).actions
    obs["task_index"] = 1 - obs["task_index"]
    assert not torch.allclose(a, policy.act(obs, deterministic=True).actions)


def test_lora_trains_only_adapters_and_reaches_the_rollout_merged(tokenizer_dir: Path) -> None:
    actor = _policy(tokenizer_dir, is_lora=True, lora_rank=4, lora_alpha=8.0)
    trainable = {n for n, p in actor.named_parameters() if p.requires_grad}
    backbone = {n for n in trainable if n.startswith("model.vlm_with_expert.")}
    assert backbone and backbone == {n for n, _ in actor.named_parameters() if ".lora_" in n}
    frozen = {n: p.detach().clone() for n, p in actor.named_parameters() if not p.requires_grad}
    optim = torch.optim.Adam([p for p in actor.parameters() if p.requires_grad], lr=1e-2)
    obs = _obs()
    actions = torch.rand(4, 3, 7) * 2 - 1
    for _ in range(3):
        loss = actor.imitation_loss(obs, actions, torch.ones(4, 3))
        optim.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        optim.step()
    assert all(torch.equal(p, frozen[n]) for n, p in actor.named_parameters() if n in frozen)
    assert any(float(p.detach().abs().sum()) > 0 for n, p in actor.named_parameters() if ".lora_B." in n)
    rollout = build_inference_policy(SPEC, actor.config)
    rollout.load_state_dict(rollout_state_dict(actor.config, actor.state_dict()))  # strict: keys match
    torch.testing.assert_close(
        actor.act(obs, deterministic=True).actions,
        rollout.act(obs, deterministic=True).actions,
        atol=1e-4,
        rtol=1e-4,
    )


def test_make_tiny_smolvla_writes_a_libero_sized_model(tmp_path: Path) -> None:
    paths = make_tiny_smolvla(tmp_path)
    model, _ = load_smolvla(paths["model_path"])
    assert model.config == TINY_SMOLVLA
    stats = load_lerobot_norm_stats(paths["norm_stats_path"])
    assert stats["observation.state"].mean.shape == (8,) and stats["action"].std.shape == (7,)
