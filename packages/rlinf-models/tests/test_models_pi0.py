"""rlinf_models.pi0: the π0 adapter on tiny random configs, checked against LeRobot's own π0.

``data/lerobot_pi0_tiny`` was written by LeRobot 0.6.1's ``PI0Policy`` (see its ``make_reference.py``): a
checkpoint in LeRobot's layout and LeRobot's outputs on fixed inputs. Matching them checks the key names and
shapes, the attention pattern, the embeddings, the time embedding and the sampler of the real implementation.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import attrs
import pytest
import torch

pytest.importorskip("transformers")

from rlinf_models.pi0 import (
    GEMMA_VARIANTS,
    CheckpointMismatchError,
    GemmaSize,
    NormStats,
    Pi0Config,
    Pi0Model,
    SiglipSize,
    attention_pattern,
    discretize_state,
    format_prompts,
    load_lerobot_norm_stats,
    load_openpi_norm_stats,
    load_pi0,
    load_tokenizer,
    preprocess_image,
    save_pi0,
    tokenize_prompts,
)
from safetensors.torch import load_file, save_file

torch.set_num_threads(1)

ROOT = Path(__file__).parent / "data"
DATA = ROOT / "lerobot_pi0_tiny"
VARIANTS = ["pi0", "pi05"]
TINY = Pi0Config(
    paligemma=GemmaSize(width=32, depth=2, mlp_dim=64, num_heads=8, num_kv_heads=1, head_dim=4),
    action_expert=GemmaSize(width=16, depth=2, mlp_dim=32, num_heads=8, num_kv_heads=1, head_dim=4),
    vision=SiglipSize(hidden_size=24, intermediate_size=40, num_layers=2, num_heads=2, patch_size=8),
    vocab_size=64,
    image_size=16,
    chunk_size=4,
    max_state_dim=8,
    max_action_dim=8,
    num_inference_steps=3,
    tokenizer_max_length=6,
    value_head_sizes=(8,),
)


def _reference(
    variant: str = "pi0",
) -> tuple[dict[str, torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    ref = load_file(str(ROOT / f"lerobot_{variant}_tiny" / "reference.safetensors"))
    return ref, list(ref["images"].unbind(1)), list(ref["image_masks"].unbind(1))


def _tiny_model(seed: int = 0, config: Pi0Config = TINY) -> Pi0Model:
    torch.manual_seed(seed)
    model = Pi0Model(config)
    with torch.no_grad():  # Gemma's norms start at zero; randomise them too
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    return model.eval()


# --- against LeRobot ---


@pytest.mark.parametrize("variant", VARIANTS)
def test_lerobot_checkpoint_loads_strictly_and_reproduces_lerobot_outputs(variant: str) -> None:
    model, report = load_pi0(ROOT / f"lerobot_{variant}_tiny" / "ckpt")
    assert report.prefixed and not report.tied_from
    assert all(name.startswith("value_head.") for name in report.initialised) and report.initialised
    assert model.config.pi05 == (variant == "pi05") and model.config.paligemma.width == 32
    ref, images, masks = _reference(variant)
    state = None if model.config.pi05 else ref["state"]  # π0.5's state is in its prompt
    with torch.no_grad():
        prefix = model.eval().encode_prefix(images, masks, ref["tokens"], ref["token_mask"])
        # LeRobot computes the loss in one joint pass over prefix + suffix; ours goes through the KV cache.
        losses = model.flow_matching_loss(prefix, state, ref["actions"], ref["noise"], ref["time"])
        sampled = model.sample_actions(prefix, state, ref["noise"], num_steps=3)
    torch.testing.assert_close(losses, ref["losses"], atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(sampled, ref["sampled"], atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("variant", VARIANTS)
def test_saved_keys_and_shapes_are_lerobots(tmp_path: Path, variant: str) -> None:
    model = _tiny_model(config=attrs.evolve(TINY, pi05=variant == "pi05"))
    save_pi0(model, tmp_path, state_dim=5, action_dim=7, camera_names=("base", "wrist"))
    lerobot = ROOT / f"lerobot_{variant}_tiny" / "ckpt"
    ours = load_file(str(tmp_path / "model.safetensors"))
    theirs = load_file(str(lerobot / "model.safetensors"))
    assert {k: list(v.shape) for k, v in ours.items()} == {k: list(v.shape) for k, v in theirs.items()}
    config = json.loads((tmp_path / "config.json").read_text())
    lerobot_config = json.loads((lerobot / "config.json").read_text())
    for key in (
        "type",
        "chunk_size",
        "max_state_dim",
        "max_action_dim",
        "image_resolution",
        "input_features",
    ):
        assert config[key] == lerobot_config[key], key


@pytest.mark.parametrize(("variant", "mode"), [("pi0", "mean_std"), ("pi05", "quantile")])
def test_lerobot_normalizer_statistics_match_lerobots_normalisation(variant: str, mode: str) -> None:
    directory = ROOT / f"lerobot_{variant}_tiny"
    stats = load_lerobot_norm_stats(
        directory / "ckpt" / "policy_preprocessor_step_5_normalizer_processor.safetensors"
    )
    done = load_file(str(directory / "normalized.safetensors"))
    # LeRobot's statistics are applied with LeRobot's formulas (std + 1e-8; a quantile range guarded only when
    # zero): openpi's (+ 1e-6 everywhere) would be off by 2e-6 to 1e-5 on these files.
    for feature, key in (("observation.state", "state"), ("action", "action")):
        normalized = stats[feature].normalize(done[f"raw_{key}"], mode)  # type: ignore[arg-type]
        torch.testing.assert_close(normalized, done[key], rtol=0, atol=1e-6)
        back = stats[feature].unnormalize(normalized, mode)  # type: ignore[arg-type]
        torch.testing.assert_close(back, done[f"raw_{key}"])


def test_pi05_prompt_layout_matches_lerobots() -> None:
    record = json.loads((ROOT / "lerobot_pi05_tiny" / "prompts.json").read_text())
    state = torch.tensor(record["state"], dtype=torch.float32)
    assert format_prompts(record["tasks"], discretize_state(state)) == record["prompts"]
    assert format_prompts(["pick_up\nthe block "]) == ["pick up the block\n"]


# --- checkpoints ---


@pytest.mark.parametrize("variant", VARIANTS)
def test_round_trip_gives_identical_outputs(tmp_path: Path, variant: str) -> None:
    model = _tiny_model(seed=3, config=attrs.evolve(TINY, pi05=variant == "pi05"))
    save_pi0(model, tmp_path, state_dim=5, action_dim=7, camera_names=("base", "wrist"))
    loaded, report = load_pi0(tmp_path)
    assert loaded.config == model.config  # value_head_sizes come back from value_head.safetensors
    assert report.initialised == () and report.prefixed
    assert set(load_file(str(tmp_path / "value_head.safetensors"))) == {
        "mlp.0.weight",
        "mlp.0.bias",
        "mlp.2.weight",
        "mlp.2.bias",
    }
    ref, images, masks = _reference()
    with torch.no_grad():
        for m in (model, loaded):
            prefix = m.encode_prefix(images, masks, ref["tokens"], ref["token_mask"])
            m.outputs = (m.sample_actions(prefix, ref["state"], ref["noise"]), m.value(prefix))  # type: ignore[assignment]
    torch.testing.assert_close(loaded.outputs, model.outputs, atol=0, rtol=0)


def test_openpi_layout_bare_keys_needs_a_config(tmp_path: Path) -> None:
    model = _tiny_model(seed=4)
    tensors = load_file(str(DATA / "ckpt" / "model.safetensors"))
    save_file({k.removeprefix("model."): v for k, v in tensors.items()}, str(tmp_path / "model.safetensors"))
    with pytest.raises(FileNotFoundError, match="pass config=Pi0Config"):
        load_pi0(tmp_path)
    loaded, report = load_pi0(tmp_path, config=model.config)
    assert not report.prefixed
    reference, _ = load_pi0(DATA / "ckpt", config=model.config)
    for (name, a), (_, b) in zip(loaded.state_dict().items(), reference.state_dict().items(), strict=True):
        if not name.startswith("value_head."):
            assert torch.equal(a, b), name


def test_tied_embedding_is_filled_from_the_lm_head(tmp_path: Path) -> None:
    tensors = load_file(str(DATA / "ckpt" / "model.safetensors"))
    embed = "model.paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight"
    del tensors[embed]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text((DATA / "ckpt" / "config.json").read_text())
    model, report = load_pi0(tmp_path)
    assert report.tied_from == {
        embed.removeprefix("model."): "paligemma_with_expert.paligemma.lm_head.weight"
    }
    head = tensors["model.paligemma_with_expert.paligemma.lm_head.weight"]
    assert torch.equal(model.paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight, head)


@pytest.mark.parametrize("change", ["missing", "unexpected", "shape"])
def test_strict_load_names_the_offending_keys(tmp_path: Path, change: str) -> None:
    tensors = load_file(str(DATA / "ckpt" / "model.safetensors"))
    name = "model.state_proj.weight"
    if change == "missing":
        del tensors[name]
    elif change == "unexpected":
        tensors["model.extra_head.weight"] = torch.zeros(2)
    else:
        tensors[name] = torch.zeros(3, 3)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text((DATA / "ckpt" / "config.json").read_text())
    expected = {
        "missing": "1 missing [state_proj.weight]",
        "unexpected": "1 unexpected [extra_head.weight]",
        "shape": "state_proj.weight: file [3, 3] vs model [16, 8]",
    }[change]
    with pytest.raises(CheckpointMismatchError, match=re.escape(expected)):
        load_pi0(tmp_path)


# --- model behaviour ---


def test_attention_pattern_is_prefix_lm_then_state_then_actions() -> None:
    # Two prefix tokens (the second is padding), the state token, two action tokens.
    pad = torch.tensor([[True, False, True, True, True]])
    starts = torch.tensor([0, 0, 1, 1, 0])
    sees = attention_pattern(pad, starts)[0].int()
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0],  # prefix: the real prefix only
            [0, 0, 0, 0, 0],  # padding sees nothing
            [1, 0, 1, 0, 0],  # state: prefix + itself
            [1, 0, 1, 1, 1],  # actions: prefix + state + all actions
            [1, 0, 1, 1, 1],
        ]
    )
    assert torch.equal(sees, expected)


def test_sampling_is_deterministic_given_the_noise() -> None:
    model = _tiny_model(seed=5)
    ref, images, masks = _reference()
    with torch.no_grad():
        prefix = model.encode_prefix(images, masks, ref["tokens"], ref["token_mask"])
        first = model.sample_actions(prefix, ref["state"], ref["noise"])
        again = model.sample_actions(prefix, ref["state"], ref["noise"].clone())
        other = model.sample_actions(prefix, ref["state"], ref["noise"] + 1.0)
        one_step = model.sample_actions(prefix, ref["state"], ref["noise"], num_steps=1)
        v = model.velocity(ref["noise"], torch.ones(2), prefix, ref["state"])
    assert first.shape == (2, 4, 8)
    assert torch.equal(first, again) and not torch.allclose(first, other)
    torch.testing.assert_close(one_step, ref["noise"] - v)  # one Euler step from t=1 to t=0


@pytest.mark.parametrize("variant", VARIANTS)
def test_padding_and_missing_cameras_do_not_leak(variant: str) -> None:
    model = _tiny_model(seed=6, config=attrs.evolve(TINY, pi05=variant == "pi05"))
    ref, images, masks = _reference()
    tokens = ref["tokens"].clone()
    tokens[0, 4:] = (tokens[0, 4:] + 1) % 64  # sample 0's padded tokens
    images2 = [images[0], images[1].clone()]
    images2[1][1] = -images2[1][1]  # sample 1's missing wrist camera
    with torch.no_grad():
        a = model.encode_prefix(images, masks, ref["tokens"], ref["token_mask"])
        b = model.encode_prefix(images2, masks, tokens, ref["token_mask"])
        va = model.velocity(ref["noise"], ref["time"], a, ref["state"])
        vb = model.velocity(ref["noise"], ref["time"], b, ref["state"])
    torch.testing.assert_close(va, vb)
    torch.testing.assert_close(model.value(a), model.value(b))


@pytest.mark.parametrize("variant", VARIANTS)
def test_loss_decreases_on_a_fixed_batch(variant: str) -> None:
    model = _tiny_model(seed=7, config=attrs.evolve(TINY, pi05=variant == "pi05")).train()
    ref, images, masks = _reference()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        prefix = model.encode_prefix(images, masks, ref["tokens"], ref["token_mask"])
        loss = model.flow_matching_loss(
            prefix, ref["state"], ref["actions"], ref["noise"], ref["time"]
        ).mean()
        optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        losses.append(loss.item())
        optimizer.step()
    assert losses[-1] < 0.5 * losses[0], losses
    # The gradient reaches both towers through the shared attention (the VLM through the cached keys/values).
    vlm = model.paligemma_with_expert.paligemma.model
    assert vlm.vision_tower.embeddings.patch_embedding.weight.grad is not None
    assert vlm.language_model.layers[0].self_attn.k_proj.weight.grad is not None


def test_sample_time_follows_the_configured_beta() -> None:
    torch.manual_seed(0)
    t = _tiny_model().sample_time(4000)
    assert t.shape == (4000,) and t.min() >= 0.001 and t.max() <= 1.0
    # Beta(1.5, 1) has mean 0.6 → 0.6 * 0.999 + 0.001.
    assert abs(t.mean().item() - 0.6004) < 0.02


@pytest.mark.parametrize("variant", VARIANTS)
def test_bfloat16_towers_keep_vision_and_norms_in_float32_and_stay_near_lerobot(variant: str) -> None:
    directory = ROOT / f"lerobot_{variant}_tiny"
    config = attrs.evolve(Pi0Config.from_json(directory / "ckpt" / "config.json"), dtype="bfloat16")
    model, _ = load_pi0(directory / "ckpt", config=config)
    towers = model.paligemma_with_expert
    assert towers.gemma_expert.model.layers[0].self_attn.q_proj.weight.dtype == torch.bfloat16
    norm = towers.gemma_expert.model.layers[0].input_layernorm
    assert all(p.dtype == torch.float32 for p in norm.parameters())  # weight (π0) or dense (π0.5)
    assert towers.paligemma.model.language_model.layers[0].mlp.up_proj.weight.dtype == torch.bfloat16
    assert towers.paligemma.model.vision_tower.embeddings.patch_embedding.weight.dtype == torch.float32
    assert model.action_out_proj.weight.dtype == torch.float32
    ref, images, masks = _reference(variant)
    with torch.no_grad():
        prefix = model.eval().encode_prefix(images, masks, ref["tokens"], ref["token_mask"])
        sampled = model.sample_actions(
            prefix, None if config.pi05 else ref["state"], ref["noise"], num_steps=3
        )
    assert sampled.dtype == torch.float32
    # LeRobot's float32 chunk: bfloat16 towers stay within a few per mille here (0.4 % measured).
    assert (sampled - ref["sampled"]).norm() / ref["sampled"].norm() < 0.02


def test_published_size_builds_on_the_meta_device_with_published_shapes() -> None:
    config = Pi0Config()
    with torch.device("meta"):
        model = Pi0Model(config)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert shapes["paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight"] == (
        257_152,
        2048,
    )
    assert shapes["paligemma_with_expert.gemma_expert.lm_head.weight"] == (257_152, 1024)
    assert shapes["paligemma_with_expert.paligemma.model.vision_tower.embeddings.patch_embedding.weight"] == (
        1152,
        3,
        14,
        14,
    )
    assert shapes[
        "paligemma_with_expert.paligemma.model.vision_tower.embeddings.position_embedding.weight"
    ] == (
        256,
        1152,
    )
    assert shapes["paligemma_with_expert.gemma_expert.model.layers.17.self_attn.q_proj.weight"] == (
        2048,
        1024,
    )
    assert shapes["paligemma_with_expert.gemma_expert.model.layers.17.self_attn.k_proj.weight"] == (256, 1024)
    assert shapes["action_time_mlp_in.weight"] == (1024, 2048)
    assert shapes["state_proj.weight"] == (1024, 32)
    assert config.image_tokens == 256
    published = config.to_lerobot_dict(state_dim=8, action_dim=7, camera_names=("base_0_rgb",))
    assert published["paligemma_variant"] == "gemma_2b" and published["action_expert_variant"] == "gemma_300m"
    assert "rlinf_architecture" not in published
    assert Pi0Config.from_lerobot_dict(published) == config


# --- config ---


def test_config_errors_name_the_field_and_allowed_values() -> None:
    with pytest.raises(ValueError, match=r"'type' must be one of \['pi0', 'pi05'\]"):
        Pi0Config.from_lerobot_dict({"type": "smolvla"})
    assert Pi0Config.from_lerobot_dict({"type": "pi05"}).tokenizer_max_length == 200
    with pytest.raises(ValueError, match=r"'paligemma_variant' must be one of \['gemma_2b', 'gemma_300m'\]"):
        Pi0Config.from_lerobot_dict({"type": "pi0", "paligemma_variant": "gemma_7b"})
    with pytest.raises(ValueError, match=r"\['depth'\] must be equal"):
        Pi0Config(
            action_expert=GemmaSize(
                width=1024, depth=6, mlp_dim=4096, num_heads=8, num_kv_heads=1, head_dim=256
            )
        )
    with pytest.raises(ValueError, match="dtype"):
        Pi0Config(dtype="float16")  # type: ignore[arg-type]
    assert GEMMA_VARIANTS["gemma_300m"].width == 1024


# --- inputs ---


def test_preprocess_image_layouts_and_padding() -> None:
    g = torch.Generator().manual_seed(0)
    hwc = torch.randint(0, 256, (2, 16, 16, 3), generator=g, dtype=torch.uint8)
    chw_float = hwc.permute(0, 3, 1, 2).float() / 255
    a, b = preprocess_image(hwc, 16), preprocess_image(chw_float, 16)
    torch.testing.assert_close(a, b)
    assert a.shape == (2, 3, 16, 16) and a.min() >= -1 and a.max() <= 1
    wide = preprocess_image(torch.full((1, 8, 16, 3), 255, dtype=torch.uint8), 16)
    assert wide.shape == (1, 3, 16, 16)
    assert (wide[:, :, :4] == -1).all() and (wide[:, :, 12:] == -1).all() and (wide[:, :, 4:12] == 1).all()
    with pytest.raises(ValueError, match="must be"):
        preprocess_image(torch.zeros(2, 16, 16), 16)


def test_openpi_norm_stats_and_quantile_mode(tmp_path: Path) -> None:
    path = tmp_path / "norm_stats.json"
    entry = {"mean": [1.0, 2.0], "std": [2.0, 4.0], "q01": [-1.0, 0.0], "q99": [3.0, 8.0]}
    path.write_text(json.dumps({"norm_stats": {"state": entry, "actions": entry}}))
    stats = load_openpi_norm_stats(path)
    x = torch.tensor([[3.0, 2.0]])
    torch.testing.assert_close(stats["state"].normalize(x), torch.tensor([[1.0, 0.0]]), atol=1e-5, rtol=0)
    torch.testing.assert_close(
        stats["actions"].normalize(x, "quantile"), torch.tensor([[1.0, -0.5]]), atol=1e-5, rtol=0
    )
    torch.testing.assert_close(
        stats["actions"].unnormalize(stats["actions"].normalize(x, "quantile"), "quantile"), x
    )
    with pytest.raises(ValueError, match="q01 and q99"):
        NormStats(mean=torch.zeros(2), std=torch.ones(2)).normalize(x, "quantile")


def _tiny_tokenizer_dir(path: Path) -> Path:
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "<bos>", "<unk>", " ", "\n", "pick", "up", "the", "red", "block"]
    words += ["Task:", "up,", "State:", "0", "128", "255;", "Action:"]  # π0.5's prompt
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"\s"), behavior="isolated")
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", pad_token="<pad>", unk_token="<unk>"
    )
    fast.padding_side = "left"  # PaliGemma's default; tokenize_prompts must pad on the right anyway
    fast.save_pretrained(path)
    return path


def test_tokenize_prompts_bos_newline_right_padding(tmp_path: Path) -> None:
    tokenizer = load_tokenizer(_tiny_tokenizer_dir(tmp_path / "tok"))
    tokens, mask = tokenize_prompts(
        tokenizer, ["pick_up", "pick up the red block the red block"], max_length=6
    )
    assert tokens.shape == (2, 6) and tokens.dtype == torch.int64 and mask.dtype == torch.bool
    # <bos> pick ' ' up '\n' <pad>: underscores become spaces, "\n" closes the prompt.
    assert tokens[0].tolist() == [1, 5, 3, 6, 4, 0] and mask[0].tolist() == [True] * 5 + [False]
    assert mask[1].all() and tokens[1, 0] == 1  # truncated to max_length
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_tokenizer(tmp_path / "absent")


def test_tokenize_prompts_pi05_writes_the_discretised_state(tmp_path: Path) -> None:
    tokenizer = load_tokenizer(_tiny_tokenizer_dir(tmp_path / "tok"))
    state = torch.tensor([[-1.0, 0.0, 0.999]])
    assert discretize_state(state).tolist() == [[0, 128, 255]]
    tokens, mask = tokenize_prompts(tokenizer, ["pick_up"], max_length=40, state=state)
    words = tokenizer.convert_ids_to_tokens(tokens[0][mask[0]].tolist())
    assert "<unk>" not in words
    assert "".join(words) == "<bos>Task: pick up, State: 0 128 255;\nAction: "
    with pytest.raises(ValueError, match="2 prompts but 1 states"):
        format_prompts(["a", "b"], discretize_state(state))
