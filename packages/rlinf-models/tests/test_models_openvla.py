"""rlinf_models.openvla: the published checkpoint layout, action tokens as OpenVLA's, RL log-probabilities, LoRA."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("peft")

from rlinf_models.openvla import (
    ActionTokenizer,
    OpenVLAConfig,
    OpenVLAModel,
    action_stats,
    apply_lora,
    format_prompt,
    load_openvla,
    pad_prompts,
    preprocess_images,
    read_weights,
    reduce_log_probs,
    save_openvla,
    unnormalize_actions,
)
from rlinf_models.openvla.testing import TINY_OPENVLA, make_tiny_openvla
from rlinf_models.vla import CheckpointMismatchError
from safetensors.torch import save_file

torch.set_num_threads(1)

B = 3


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_openvla(tmp_path_factory.mktemp("openvla") / "ckpt", value_head_sizes=(16, 8))


def _batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (B, 64, 48, 3), dtype=torch.uint8, generator=g)
    pixel_values = preprocess_images(images, TINY_OPENVLA.image_sizes)
    prompts = [[1, *torch.randint(3, 500, (n,), generator=g).tolist()] for n in (5, 9, 7)]
    input_ids, mask = pad_prompts(prompts, pad_token_id=TINY_OPENVLA.pad_token_id, empty_token_id=29)
    return pixel_values, input_ids, mask


# --- the checkpoint layout ---


def test_tiny_checkpoint_has_the_published_layout_and_loads_strictly(tiny_dir: Path) -> None:
    config = json.loads((tiny_dir / "config.json").read_text())
    assert config["model_type"] == "openvla" and config["vision_backbone_id"] == "dinosiglip-vit-so-224px"
    assert config["image_sizes"] == [224, 224] and config["use_fused_vision_backbone"] is True
    assert config["n_action_bins"] == 256 and config["text_config"]["vocab_size"] == 576
    index = json.loads((tiny_dir / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1  # sharded, as the published three files
    keys = set(index["weight_map"])
    for name in (
        "vision_backbone.featurizer.cls_token",
        "vision_backbone.featurizer.reg_token",
        "vision_backbone.featurizer.pos_embed",
        "vision_backbone.featurizer.patch_embed.proj.weight",
        "vision_backbone.featurizer.blocks.0.attn.qkv.weight",
        "vision_backbone.featurizer.blocks.0.ls1.scale_factor",
        "vision_backbone.featurizer.blocks.2.mlp.fc2.bias",
        "vision_backbone.featurizer.norm.weight",
        "vision_backbone.fused_featurizer.attn_pool.latent",
        "vision_backbone.fused_featurizer.attn_pool.kv.weight",
        "vision_backbone.fused_featurizer.attn_pool.mlp.fc1.weight",
        "projector.fc1.weight",
        "projector.fc3.bias",
        "language_model.model.embed_tokens.weight",
        "language_model.model.layers.1.self_attn.q_proj.weight",
        "language_model.model.layers.1.mlp.gate_proj.weight",
        "language_model.model.norm.weight",
        "language_model.lm_head.weight",
    ):
        assert name in keys, name
    assert not any("gamma" in k or k.startswith("value_head.") for k in keys)
    assert not any(k.startswith("vision_backbone.fused_featurizer.") and "cls_token" in k for k in keys)
    model, report = load_openvla(tiny_dir)
    assert not report.initialised and len(report.files) == len(set(index["weight_map"].values()))
    assert model.value_head is not None
    tensors, _ = read_weights(tiny_dir)
    for name, tensor in tensors.items():
        torch.testing.assert_close(model.state_dict()[name], tensor, rtol=0, atol=0)


def test_without_value_head_file_the_head_starts_fresh(tiny_dir: Path, tmp_path: Path) -> None:
    for file in tiny_dir.iterdir():
        if file.name != "value_head.safetensors":
            (tmp_path / file.name).write_bytes(file.read_bytes())
    model, report = load_openvla(tmp_path, value_head_sizes=(4,))
    assert report.initialised and all(k.startswith("value_head.") for k in report.initialised)
    assert model.value_head is not None and all(
        torch.isfinite(p).all() for p in model.value_head.parameters()
    )


def test_mismatches_are_listed(tiny_dir: Path, tmp_path: Path) -> None:
    tensors, _ = read_weights(tiny_dir)
    del tensors["projector.fc3.weight"]
    tensors["vision_backbone.featurizer.blocks.0.ls1.gamma"] = torch.zeros(16)
    tensors["language_model.model.norm.weight"] = torch.zeros(31)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text((tiny_dir / "config.json").read_text())
    with pytest.raises(CheckpointMismatchError) as err:
        load_openvla(tmp_path)
    message = str(err.value)
    assert "1 missing [projector.fc3.weight]" in message
    assert "1 unexpected [vision_backbone.featurizer.blocks.0.ls1.gamma]" in message
    assert "language_model.model.norm.weight: file [31] vs model [32]" in message


def test_save_and_load_round_trip(tiny_dir: Path, tmp_path: Path) -> None:
    model, _ = load_openvla(tiny_dir)
    save_openvla(model, tmp_path)
    again, _ = load_openvla(tmp_path)
    assert again.config == model.config
    for (name, a), (other, b) in zip(model.state_dict().items(), again.state_dict().items(), strict=True):
        assert name == other
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    batch = _batch()
    tokens = torch.full((B, 7), 500)
    with torch.no_grad():
        first = model.evaluate_actions(*batch, tokens)
        second = again.evaluate_actions(*batch, tokens)
    torch.testing.assert_close(first.log_probs, second.log_probs, rtol=0, atol=0)


def test_published_size_model_on_meta_device_has_openvla_7b_shapes() -> None:
    config = OpenVLAConfig()
    with torch.device("meta"):
        model = OpenVLAModel(config)
    shapes = {k: list(v.shape) for k, v in model.state_dict().items()}
    assert shapes["vision_backbone.featurizer.pos_embed"] == [1, 256, 1024]
    assert shapes["vision_backbone.featurizer.reg_token"] == [1, 4, 1024]
    assert shapes["vision_backbone.featurizer.blocks.23.mlp.fc1.weight"] == [4096, 1024]
    assert shapes["vision_backbone.fused_featurizer.pos_embed"] == [1, 256, 1152]
    assert shapes["vision_backbone.fused_featurizer.blocks.26.mlp.fc1.weight"] == [4304, 1152]
    assert shapes["vision_backbone.fused_featurizer.attn_pool.kv.weight"] == [2304, 1152]
    assert shapes["projector.fc1.weight"] == [8704, 2176]
    assert shapes["projector.fc2.weight"] == [4096, 8704]
    assert shapes["projector.fc3.weight"] == [4096, 4096]
    assert shapes["language_model.model.embed_tokens.weight"] == [32064, 4096]
    assert shapes["language_model.lm_head.weight"] == [32064, 4096]
    assert shapes["language_model.model.layers.31.mlp.down_proj.weight"] == [4096, 11008]
    assert "language_model.model.layers.32.mlp.down_proj.weight" not in shapes
    assert config.tokenizer_vocab_size == 32000 and model.action_tokenizer.first_token == 31744
    total = sum(p.numel() for p in model.parameters())
    assert total == 7_541_237_184  # openvla/openvla-7b's parameter count


# --- actions ---


def test_action_tokens_match_openvlas_formulas() -> None:
    vocab, bins = 32000, 256
    tokenizer = ActionTokenizer(vocab, bins)
    actions = np.concatenate([np.linspace(-1.2, 1.2, 997), [-1.0, 1.0, 0.0]]).reshape(-1, 1)
    # OpenVLA's ActionTokenizer.__call__ and decode_token_ids_to_actions, written out with numpy.
    edges = np.linspace(-1, 1, bins)
    centers = (edges[:-1] + edges[1:]) / 2.0
    expected_tokens = vocab - np.digitize(np.clip(actions, -1.0, 1.0), edges)
    expected_actions = centers[np.clip(vocab - expected_tokens - 1, 0, centers.shape[0] - 1)]
    tokens = tokenizer.encode(torch.from_numpy(actions))
    np.testing.assert_array_equal(tokens.numpy(), expected_tokens)
    np.testing.assert_array_equal(tokenizer.decode(tokens).numpy(), expected_actions)
    assert int(tokens.min()) == vocab - bins and int(tokens.max()) == vocab - 1
    # Decoding then encoding a bin centre gives back its token (but for the shared top centre).
    centre_tokens = tokenizer.encode(torch.from_numpy(centers))
    torch.testing.assert_close(tokenizer.decode(centre_tokens), torch.from_numpy(centers))


def test_unnormalisation_is_openvlas_quantile_map_with_mask() -> None:
    stats = action_stats(TINY_OPENVLA)
    normalized = torch.linspace(-1, 1, 14, dtype=torch.float64).reshape(2, 7)
    q01, q99, mask = (np.array(stats[k]) for k in ("q01", "q99", "mask"))
    expected = np.where(mask, 0.5 * (normalized.numpy() + 1) * (q99 - q01) + q01, normalized.numpy())
    np.testing.assert_allclose(unnormalize_actions(normalized, stats).numpy(), expected, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="not in the checkpoint's norm_stats"):
        action_stats(TINY_OPENVLA, "bridge_orig")


def test_prompt_and_batch_layout() -> None:
    assert (
        format_prompt("Pick Up the bowl")
        == "In: What action should the robot take to pick up the bowl?\nOut:"
    )
    ids, mask = pad_prompts([[1, 5, 6], [1, 7, 8, 9, 29871]], pad_token_id=0)
    assert ids.tolist() == [[1, 0, 5, 6, 29871], [1, 7, 8, 9, 29871]]
    assert mask.tolist() == [[1, 0, 1, 1, 1], [1, 1, 1, 1, 1]]
    pixels = preprocess_images(torch.zeros(2, 40, 30, 3, dtype=torch.uint8), (224, 224))
    assert pixels.shape == (2, 6, 224, 224)
    torch.testing.assert_close(pixels[:, 0], torch.full((2, 224, 224), -0.485 / 0.229))
    torch.testing.assert_close(pixels[:, 3], torch.full((2, 224, 224), -1.0))


# --- RL log-probabilities ---


@pytest.mark.parametrize(
    ("greedy", "temperature", "top_k"), [(False, 1.0, 0), (True, 1.0, 0), (False, 0.7, 50)]
)
def test_rollout_and_teacher_forced_log_probs_agree(
    tiny_dir: Path, greedy: bool, temperature: float, top_k: int
) -> None:
    model, _ = load_openvla(tiny_dir)
    model.eval()
    batch = _batch(1)
    with torch.no_grad():
        rollout = model.sample_actions(
            *batch,
            temperature=temperature,
            top_k=top_k,
            greedy=greedy,
            generator=torch.Generator().manual_seed(3),
        )
    train = model.evaluate_actions(*batch, rollout.tokens, temperature=temperature, top_k=top_k)
    assert rollout.tokens.shape == (B, 7) and rollout.log_probs.shape == (B, 7)
    assert bool(((rollout.tokens >= 512 - 256) & (rollout.tokens < 512)).all())
    torch.testing.assert_close(train.log_probs.detach(), rollout.log_probs, rtol=0, atol=1e-5)
    torch.testing.assert_close(train.entropy.detach(), rollout.entropy, rtol=0, atol=1e-5)
    assert rollout.values is not None and train.values is not None and rollout.values.shape == (B,)
    torch.testing.assert_close(train.values.detach(), rollout.values, rtol=0, atol=1e-5)
    if greedy:
        # The greedy token is the most likely one: its log-probability is the largest, at least -entropy.
        assert bool((rollout.log_probs >= -rollout.entropy - 1e-6).all())
    action_level = reduce_log_probs(train.log_probs, "action_level", 7)
    chunk_level = reduce_log_probs(train.log_probs, "chunk_level", 7)
    assert action_level.shape == (B, 1) and chunk_level.shape == (B,)
    torch.testing.assert_close(chunk_level, train.log_probs.sum(-1))
    (chunk_level.sum() + train.values.sum()).backward()  # type: ignore[no-untyped-call]
    assert model.get_parameter("vision_backbone.featurizer.blocks.0.attn.qkv.weight").grad is not None
    assert model.get_parameter("language_model.model.layers.0.self_attn.q_proj.weight").grad is not None


def test_each_observation_is_decoded_independently_of_the_batch(tiny_dir: Path) -> None:
    model, _ = load_openvla(tiny_dir)
    pixels, ids, mask = _batch(2)
    with torch.no_grad():
        both = model.evaluate_actions(pixels, ids, mask, torch.full((B, 7), 300))
        # The second prompt is the longest: alone it has no padding.
        alone = model.evaluate_actions(pixels[1:2], ids[1:2], mask[1:2], torch.full((1, 7), 300))
    torch.testing.assert_close(both.log_probs[1:2], alone.log_probs, rtol=0, atol=1e-5)


def test_non_action_tokens_are_refused(tiny_dir: Path) -> None:
    model, _ = load_openvla(tiny_dir)
    with pytest.raises(ValueError, match="action tokens must lie in"):
        model.evaluate_actions(*_batch(), torch.full((B, 7), 10))


# --- LoRA ---


def test_lora_trains_only_the_adapters_and_the_value_head(tiny_dir: Path) -> None:
    model, _ = load_openvla(tiny_dir)
    apply_lora(model, rank=4)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_" in n or n.startswith("value_head.") for n in trainable)
    assert any("q_proj.lora_A" in n for n in trainable) and any("down_proj.lora_B" in n for n in trainable)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    for _ in range(2):
        out = model.evaluate_actions(*_batch(), torch.full((B, 7), 400))
        assert out.values is not None
        (out.log_probs.sum() + out.values.sum()).backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        optimizer.zero_grad()
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and changed <= set(trainable)
    assert any(".lora_" in n for n in changed)
    with pytest.raises(ValueError, match="match no Llama layer"):
        apply_lora(load_openvla(tiny_dir)[0], rank=2, target_modules=("nope",))


@pytest.mark.parametrize(
    "timm_id", ["vit_large_patch14_reg4_dinov2.lvd142m", "vit_so400m_patch14_siglip_224"]
)
def test_featurizers_match_timm(timm_id: str) -> None:
    """Against timm 0.9.x itself (not a dependency: skipped without it), small widths, OpenVLA's LayerScale patch."""
    timm = pytest.importorskip("timm")
    import attrs
    from rlinf_models.openvla import TIMM_VIT_SPECS, TimmViT

    torch.manual_seed(0)
    real = timm.create_model(
        timm_id, pretrained=False, num_classes=0, img_size=56, embed_dim=64, depth=4, num_heads=4
    )
    for module in real.modules():  # OpenVLA's ls_apply_patch: gamma -> scale_factor
        if hasattr(module, "gamma") and module.__class__.__name__ == "LayerScale":
            module.scale_factor = torch.nn.Parameter(module.gamma.detach().clone())
            del module.gamma
            module.forward = lambda x, m=module: x * m.scale_factor
    with torch.no_grad():
        for param in real.parameters():
            param.add_(0.05 * torch.randn_like(param))
    spec = attrs.evolve(
        TIMM_VIT_SPECS[timm_id],
        embed_dim=64,
        depth=4,
        num_heads=4,
        mlp_hidden=real.blocks[0].mlp.fc1.out_features,
    )
    ours = TimmViT(spec, 56)
    ours.load_state_dict(real.state_dict(), strict=True)
    images = torch.randn(2, 3, 56, 56)
    with torch.no_grad():
        expected = real.get_intermediate_layers(images, n={len(real.blocks) - 2})[0]
        torch.testing.assert_close(ours(images), expected, rtol=0, atol=1e-6)


def test_bfloat16_model_decodes_and_values_come_back_in_float32(tiny_dir: Path) -> None:
    model, _ = load_openvla(tiny_dir, dtype=torch.bfloat16)
    with torch.no_grad():
        out = model.sample_actions(*_batch(), greedy=True)
    assert out.values is not None and out.values.dtype == torch.float32
    assert out.log_probs.dtype == torch.float32 and bool(torch.isfinite(out.log_probs).all())
