"""GR00T N1.5 on transformers: the published checkpoint layout, the network's conventions, the RL policy."""

from __future__ import annotations

import dataclasses
import json
import string
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch

pytest.importorskip("transformers")

from rlinf_core.protocols import ObsSpec
from rlinf_models.gr00t import (
    EAGLE_VARIANTS,
    GR00TConfig,
    GR00TModel,
    GR00TPolicy,
    apply_lora,
    load_gr00t,
    load_gr00t_weights,
    load_metadata,
    normalize,
    save_gr00t,
    tokenize_prompts,
    unnormalize,
)
from rlinf_models.gr00t.testing import TINY_GR00T, make_tiny_gr00t, tiny_metadata
from rlinf_models.pi0 import CheckpointMismatchError, PrefixCache, load_tokenizer
from rlinf_models.pi0.testing import LEROBOT_TINY_SPEC, lerobot_tiny_obs
from rlinf_models.policies import (
    PolicyConfig,
    build_inference_policy,
    build_policy,
    load_rollout_weights,
    rollout_state_dict,
    trainable_names,
)
from safetensors.torch import load_file, save_file

# config.json of nvidia/GR00T-N1.5-3B (the fields this implementation reads; values as published).
GR00T_N15_3B: dict[str, Any] = {
    "action_dim": 32,
    "action_head_cfg": {
        "action_dim": 32,
        "action_horizon": 16,
        "add_pos_embed": True,
        "backbone_embedding_dim": 2048,
        "diffusion_model_cfg": {
            "attention_head_dim": 48,
            "cross_attention_dim": 2048,
            "dropout": 0.2,
            "final_dropout": True,
            "interleave_self_attention": True,
            "norm_type": "ada_norm",
            "num_attention_heads": 32,
            "num_layers": 16,
            "output_dim": 1024,
            "positional_embeddings": None,
        },
        "hidden_size": 1024,
        "input_embedding_dim": 1536,
        "max_action_dim": 32,
        "max_state_dim": 64,
        "model_dtype": "float32",
        "noise_beta_alpha": 1.5,
        "noise_beta_beta": 1.0,
        "noise_s": 0.999,
        "num_inference_timesteps": 4,
        "num_target_vision_tokens": 32,
        "num_timestep_buckets": 1000,
        "tune_diffusion_model": True,
        "tune_projector": True,
        "use_vlln": True,
        "vl_self_attention_cfg": {
            "attention_head_dim": 64,
            "dropout": 0.2,
            "final_dropout": True,
            "num_attention_heads": 32,
            "num_layers": 4,
            "positional_embeddings": None,
        },
    },
    "action_horizon": 16,
    "architectures": ["GR00T_N1_5"],
    "backbone_cfg": {
        "eagle_path": "NVEagle/eagle_er-qwen3_1_7B-Siglip2_400M_stage1_5_128gpu_er_v7_1mlp_nops",
        "load_bf16": False,
        "project_to_dim": None,
        "reproject_vision": False,
        "select_layer": 12,
        "tune_llm": False,
        "tune_visual": True,
        "use_flash_attention": True,
    },
    "hidden_size": 2048,
    "model_dtype": "float32",
    "model_type": "gr00t_n1_5",
}

SPEC = LEROBOT_TINY_SPEC  # two cameras, a 5-D state, 7-D actions, two instructions


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_tiny_gr00t(tmp_path_factory.mktemp("gr00t"), state_dim=5, action_dim=7)


def _inputs(
    model: GR00TModel, tokenizer_dir: Path, n: int = 2
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    e = model.config.eagle
    prompts = ["pick up the red block", "go"][:n]
    ids, mask = tokenize_prompts(
        load_tokenizer(tokenizer_dir),
        prompts,
        cameras=2,
        image_tokens=e.image_tokens,
        image_token_id=e.image_token_index,
    )
    pixels = (
        torch.rand(2 * n, 3, e.image_size, e.image_size, generator=torch.Generator().manual_seed(0)) * 2 - 1
    )
    return pixels, ids, mask


# --- the checkpoint layout ---


def test_tiny_checkpoint_in_the_published_layout_loads_strictly(tiny: dict[str, Path]) -> None:
    directory = tiny["model_path"]
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1  # sharded, as the published checkpoint
    assert (directory / "experiment_cfg" / "metadata.json").is_file()
    model, report = load_gr00t(directory)
    assert report.initialised == () and not report.tied_from  # no missing, no unexpected key
    stored = set(index["weight_map"]) | {
        f"value_head.{k}" for k in load_file(str(directory / "value_head.safetensors"))
    }
    assert stored == set(model.state_dict())
    assert model.config == TINY_GR00T
    assert json.loads((directory / "config.json").read_text())["model_type"] == "gr00t_n1_5"


@pytest.mark.parametrize("change", ["missing", "unexpected", "reshaped"])
def test_strict_load_names_the_offending_keys(tmp_path: Path, change: str) -> None:
    model = GR00TModel(TINY_GR00T)
    save_gr00t(model, tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    key = "action_head.action_encoder.W2.W"
    if change == "missing":
        del tensors[key]
    elif change == "unexpected":
        tensors["action_head.extra.weight"] = torch.zeros(1)
        key = "action_head.extra.weight"
    else:
        tensors[key] = torch.zeros(3, 3)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointMismatchError, match=key.replace(".", r"\.")):
        load_gr00t(tmp_path)


def test_tied_output_head_is_filled_from_the_embedding(tmp_path: Path) -> None:
    model = GR00TModel(TINY_GR00T)
    save_gr00t(model, tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    head = "backbone.eagle_model.language_model.lm_head.weight"
    del tensors[head]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    loaded, report = load_gr00t(tmp_path)
    assert report.tied_from == {head: "backbone.eagle_model.language_model.model.embed_tokens.weight"}
    torch.testing.assert_close(loaded.state_dict()[head], model.state_dict()[head])


def test_save_and_reload_round_trip_keeps_the_outputs(tiny: dict[str, Path], tmp_path: Path) -> None:
    model, _ = load_gr00t(tiny["model_path"], embodiment_id=31)
    save_gr00t(model, tmp_path / "copy", metadata=tiny["model_path"] / "experiment_cfg" / "metadata.json")
    again, _ = load_gr00t(tmp_path / "copy", embodiment_id=31)
    assert again.config == model.config
    pixels, ids, mask = _inputs(model, tiny["tokenizer_path"])
    noise, state = torch.randn(2, 8, 8), torch.randn(2, 8)
    with torch.no_grad():
        a = model.sample_actions(model.encode_prefix(pixels, ids, mask), state, noise)
        b = again.sample_actions(again.encode_prefix(pixels, ids, mask), state, noise)
    torch.testing.assert_close(a, b, atol=0, rtol=0)
    assert load_metadata(tmp_path / "copy")[0] == "new_embodiment"


def test_published_config_builds_the_published_shapes_on_the_meta_device() -> None:
    config = GR00TConfig.from_gr00t_dict(GR00T_N15_3B)
    assert config.eagle == next(iter(EAGLE_VARIANTS.values()))
    assert GR00TConfig.from_gr00t_dict(config.to_gr00t_dict()) == config
    with torch.device("meta"):
        model = GR00TModel(config)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    eagle, head = "backbone.eagle_model", "action_head"
    assert shapes[f"{eagle}.vision_model.vision_model.embeddings.patch_embedding.weight"] == (1152, 3, 14, 14)
    assert shapes[f"{eagle}.vision_model.vision_model.embeddings.position_embedding.weight"] == (256, 1152)
    assert f"{eagle}.vision_model.vision_model.encoder.layers.26.mlp.fc2.weight" in shapes
    assert shapes[f"{eagle}.mlp1.0.weight"] == (2048, 1152)
    text = f"{eagle}.language_model.model.layers"
    assert f"{text}.11.mlp.down_proj.weight" in shapes and f"{text}.12.mlp.down_proj.weight" not in shapes
    assert shapes[f"{text}.0.self_attn.k_proj.weight"] == (1024, 2048)
    assert shapes[f"{head}.state_encoder.layer1.W"] == (32, 64, 1024)
    assert shapes[f"{head}.action_encoder.W1.W"] == (32, 32, 1536)
    assert shapes[f"{head}.action_encoder.W2.W"] == (32, 3072, 1536)
    assert shapes[f"{head}.action_decoder.layer2.W"] == (32, 1024, 32)
    assert shapes[f"{head}.model.transformer_blocks.0.attn1.to_k.weight"] == (1536, 2048)  # cross-attention
    assert shapes[f"{head}.model.transformer_blocks.1.attn1.to_k.weight"] == (1536, 1536)  # self-attention
    assert shapes[f"{head}.model.transformer_blocks.15.ff.net.2.weight"] == (1536, 6144)
    assert shapes[f"{head}.model.timestep_encoder.timestep_embedder.linear_1.weight"] == (1536, 256)
    assert shapes[f"{head}.model.proj_out_2.weight"] == (1024, 1536)
    assert shapes[f"{head}.vl_self_attention.transformer_blocks.3.norm1.weight"] == (2048,)
    assert shapes[f"{head}.future_tokens.weight"] == (32, 1536)
    assert shapes[f"{head}.position_embedding.weight"] == (1024, 1536)
    assert not any(k.startswith(f"{head}.model.transformer_blocks.0.norm1.norm") for k in shapes)


def test_published_size_has_the_names_and_shapes_of_lerobots_gr00tn15() -> None:
    # LeRobot 0.4.4's GR00TN15 at the published size (make_lerobot_gr00t_reference.py), built from the same
    # config.json and Eagle sizes: all 899 tensors (585 in the backbone) have our names and shapes.
    lerobot = json.loads((Path(__file__).parent / "data" / "lerobot_gr00t_n15_shapes.json").read_text())
    with torch.device("meta"):
        model = GR00TModel(GR00TConfig.from_gr00t_dict(GR00T_N15_3B))
    ours = {k: list(v.shape) for k, v in model.state_dict().items() if not k.startswith("value_head.")}
    assert ours == lerobot
    assert len(ours) == 899 and sum(k.startswith("backbone.") for k in ours) == 585


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (("model_type",), "gr00t_n1_6", "model_type"),
        (("backbone_cfg", "reproject_vision"), True, "backbone_cfg.reproject_vision"),
        (
            ("action_head_cfg", "diffusion_model_cfg", "positional_embeddings"),
            "sinusoidal",
            "positional_embeddings",
        ),
        (("backbone_cfg", "select_layer"), 40, "select_layer"),
        (("backbone_cfg", "eagle_path"), "nowhere/eagle", "eagle_path"),
    ],
)
def test_config_json_errors_name_the_field(path: tuple[str, ...], value: object, field: str) -> None:
    data = json.loads(json.dumps(GR00T_N15_3B))
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(ValueError, match=field):
        GR00TConfig.from_gr00t_dict(data)


def test_a_local_eagle_directory_gives_the_sizes(tmp_path: Path) -> None:
    eagle = TINY_GR00T.eagle.to_hf_dict()
    (tmp_path / "my-eagle").mkdir()
    (tmp_path / "my-eagle" / "config.json").write_text(json.dumps(eagle))
    data = {
        **TINY_GR00T.to_gr00t_dict(),
        "backbone_cfg": {**TINY_GR00T.to_gr00t_dict()["backbone_cfg"], "eagle_path": "my-eagle"},
    }
    del data["rlinf_architecture"]
    (tmp_path / "config.json").write_text(json.dumps(data))
    assert GR00TConfig.from_json(tmp_path / "config.json").eagle == TINY_GR00T.eagle


# --- the network's conventions ---


def test_time_steps_are_gr00ts_buckets() -> None:
    model = GR00TModel(TINY_GR00T)
    for k in (3, 4, 10):  # Euler grids: openpi's t = 1 - k/K is GR00T's step int(k/K * 1000)
        t = torch.linspace(1.0, 1.0 / k, k)
        expected = torch.tensor([int(i / k * 1000) for i in range(k)])
        assert torch.equal(model.steps(t), expected)


def test_padding_tokens_change_no_sample(tiny: dict[str, Path]) -> None:
    model, _ = load_gr00t(tiny["model_path"])
    pixels, ids, mask = _inputs(model, tiny["tokenizer_path"])
    assert int(mask[1].sum()) < ids.shape[1]  # the short prompt is padded in the batch
    noise, state = torch.randn(2, 8, 8), torch.randn(2, 8)
    length = int(mask[1].sum())
    with torch.no_grad():
        both = model.sample_actions(model.encode_prefix(pixels, ids, mask), state, noise)
        alone = model.sample_actions(
            model.encode_prefix(pixels[2:], ids[1:, :length], mask[1:, :length]), state[1:], noise[1:]
        )
    torch.testing.assert_close(both[1:], alone, atol=1e-5, rtol=0)


def test_the_prompt_holds_one_run_of_image_tokens_per_camera(tiny: dict[str, Path]) -> None:
    e = TINY_GR00T.eagle
    tok = load_tokenizer(tiny["tokenizer_path"])
    ids, mask = tokenize_prompts(
        tok, ["open the drawer"], cameras=2, image_tokens=e.image_tokens, image_token_id=103
    )
    row = ids[0][mask[0]].tolist()
    assert row.count(103) == 2 * e.image_tokens
    text = str(tok.decode([i for i in row if i != 103])).replace(" ", "")
    assert text == "<image1><img></img><image2><img></img>['openthedrawer']"


def test_min_max_normalisation_round_trips_and_zeroes_constant_dims(tmp_path: Path) -> None:
    meta = tiny_metadata(3, 2)
    meta["new_embodiment"]["statistics"]["state"]["state"]["max"][1] = meta["new_embodiment"]["statistics"][
        "state"
    ]["state"]["min"][1]
    (tmp_path / "metadata.json").write_text(json.dumps(meta))
    tag, state, _ = load_metadata(tmp_path / "metadata.json")
    assert tag == "new_embodiment"
    x = torch.stack([state.minimum, state.maximum])
    normed = normalize(x, state)
    torch.testing.assert_close(normed[:, 0], torch.tensor([-1.0, 1.0]))
    assert bool((normed[:, 1] == 0).all())
    y = torch.rand(4, 3)
    back = unnormalize(normalize(y, state), state)
    torch.testing.assert_close(back[:, [0, 2]], y[:, [0, 2]])
    with pytest.raises(ValueError, match="embodiment_tag 'gr1'"):
        load_metadata(tmp_path / "metadata.json", "gr1")


# --- the RL policy ---


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny GR00T whose tokenizer covers the instructions' characters only (ids below the image token)."""
    root = tmp_path_factory.mktemp("gr00t_small")
    paths = make_tiny_gr00t(root, state_dim=5, action_dim=7, seed=3)
    from rlinf_models.pi0.testing import write_char_tokenizer

    write_char_tokenizer(paths["tokenizer_path"], string.ascii_lowercase + " <>[]'/0123456789")
    return paths


def _policy(paths: dict[str, Path], seed: int = 0, **changes: object) -> GR00TPolicy:
    config = PolicyConfig(
        model_type="gr00t",
        model_path=str(paths["model_path"]),
        tokenizer_path=str(paths["tokenizer_path"]),
        image_keys=("base", "wrist"),
        num_action_chunks=3,
        denoising_steps=4,
    )
    torch.manual_seed(seed)
    policy = build_policy(SPEC, attrs.evolve(config, **changes))
    assert isinstance(policy, GR00TPolicy)
    return policy


def _obs(n: int = 4, seed: int = 0) -> dict[str, torch.Tensor]:
    return lerobot_tiny_obs(n, torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(("method", "joint"), [("flow_sde", False), ("flow_sde", True), ("flow_noise", None)])
def test_evaluate_recomputes_the_rollouts_log_probs(
    small: dict[str, Path], method: str, joint: bool | None
) -> None:
    policy = _policy(small, noise_method=method, joint_logprob=joint)
    obs = _obs()
    out = policy.act(obs, generator=torch.Generator().manual_seed(1))
    assert out.actions.shape == out.logprobs.shape == (4, 3, 7) and out.values.shape == (4, 1)
    assert out.forward_inputs is not None and out.forward_inputs["chains"].shape == (4, 5, 8, 8)
    assert bool((out.logprobs != 0).all())
    logprobs, entropy, values = policy.evaluate(obs, out.actions, out.forward_inputs)
    # Same weights, same chain: the rollout's and the trainer's log-probs agree (float32 forward passes).
    torch.testing.assert_close(logprobs, out.logprobs, atol=1e-5, rtol=0)
    torch.testing.assert_close(values, out.values)
    assert entropy.shape == (4, 3, 7)
    logprobs.sum().backward()  # type: ignore[no-untyped-call]
    grad = policy.model.action_head.action_decoder.layer2.W.grad
    assert grad is not None and bool(grad.abs().sum() > 0)


def test_deterministic_act_is_gr00ts_sampler_unnormalised(small: dict[str, Path]) -> None:
    policy = _policy(small, denoising_steps=TINY_GR00T.num_inference_timesteps)
    obs = _obs(2)
    actions = policy.act(obs, deterministic=True).actions
    with torch.no_grad():
        cond = policy._encode(obs)
        assert cond.state is not None
        sampled = policy.model.sample_actions(cond.prefix, cond.state, torch.zeros(2, 8, 8))
    torch.testing.assert_close(
        actions, unnormalize(sampled[:, :3, :7], policy.action_stats), atol=1e-5, rtol=0
    )


def test_each_env_is_prompted_with_its_own_instruction(small: dict[str, Path]) -> None:
    policy = _policy(small)
    obs = _obs()
    a = policy.act(obs, deterministic=True).actions
    obs["task_index"] = 1 - obs["task_index"]
    assert not torch.allclose(a, policy.act(obs, deterministic=True).actions)


def test_lora_trains_only_adapters_and_heads_and_reaches_the_rollout_merged(small: dict[str, Path]) -> None:
    actor = _policy(small, is_lora=True, lora_rank=4, lora_alpha=8.0)
    trainable = {n for n, p in actor.named_parameters() if p.requires_grad}
    lora = {n for n, _ in actor.named_parameters() if ".lora_" in n}
    assert {n for n in trainable if n.startswith("model.backbone.")} == {
        n for n in lora if n.startswith("model.backbone.")
    }
    assert any("language_model" in n for n in lora) and any("action_head.model." in n for n in lora)
    assert not any("vision_model" in n for n in trainable)
    towers = ("model.action_head.model.", "model.action_head.vl_self_attention.")
    assert all(".lora_" in n for n in trainable if n.startswith(towers))
    heads = {n for n in trainable if ".lora_" not in n}
    assert {"model.action_head.action_decoder.layer2.W", "model.value_head.mlp.0.weight"} <= heads
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


def test_lora_adapters_sync_gives_the_rollout_the_actors_log_probs(small: dict[str, Path]) -> None:
    actor = _policy(small, is_lora=True, lora_rank=4, lora_alpha=8.0, lora_sync="adapters")
    optim = torch.optim.Adam([p for p in actor.parameters() if p.requires_grad], lr=1e-2)
    obs = _obs()
    sample = actor.act(obs, generator=torch.Generator().manual_seed(0))
    for _ in range(2):
        logprobs, _, values = actor(obs, sample.actions, sample.forward_inputs)
        loss = -logprobs.sum() + (values - 1).square().mean()
        optim.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        optim.step()
    actor.eval()
    sent = rollout_state_dict(actor.config, actor.state_dict(), trainable=trainable_names(actor))
    assert set(sent) == {n for n, p in actor.named_parameters() if p.requires_grad}
    assert not any(".base_layer." in k for k in sent) and any("action_head.model." in k for k in sent)
    torch.manual_seed(123)  # the rollout's own fresh adapters and heads, replaced by what it receives
    rollout = build_inference_policy(SPEC, actor.config)
    load_rollout_weights(rollout, actor.config, sent)
    rollout.eval()
    obs = _obs(seed=1)
    want = actor.act(obs, generator=torch.Generator().manual_seed(2))
    got = rollout.act(obs, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(got.actions, want.actions, atol=0, rtol=0)
    torch.testing.assert_close(got.logprobs, want.logprobs, atol=0, rtol=0)


def test_lora_on_the_published_size_adapts_the_text_model_and_the_dit() -> None:
    with torch.device("meta"):
        model = GR00TModel(GR00TConfig.from_gr00t_dict(GR00T_N15_3B))
        apply_lora(model, PolicyConfig(model_type="mlp", lora_rank=8))
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert all(".lora_" in n for n in trainable if n.startswith("backbone."))
    assert "action_head.model.transformer_blocks.0.attn1.to_q.lora_A.default.weight" in trainable
    assert "action_head.model.transformer_blocks.0.attn1.to_q.base_layer.weight" not in trainable
    assert "action_head.state_encoder.layer1.W" in trainable


def test_config_errors_name_the_key(small: dict[str, Path]) -> None:
    with pytest.raises(ValueError, match="model_path, tokenizer_path"):
        PolicyConfig(model_type="gr00t")
    with pytest.raises(ValueError, match="embodiment_tag"):
        PolicyConfig(
            model_type="smolvla",
            model_path="m",
            tokenizer_path="t",
            norm_stats_path="s",
            embodiment_tag="gr1",
        )
    with pytest.raises(ValueError, match=r"actor\.model\.embodiment_tag 'gr1'"):
        _policy(small, embodiment_tag="gr1")
    with pytest.raises(ValueError, match="norm_stats_path"):
        assert SPEC.obs_dict is not None
        wider = {**SPEC.obs_dict, "state": ObsSpec((6,))}  # the statistics cover 5 state dims
        build_policy(dataclasses.replace(SPEC, obs_dict=wider), _config(small))


def _config(paths: dict[str, Path]) -> PolicyConfig:
    return PolicyConfig(
        model_type="gr00t",
        model_path=str(paths["model_path"]),
        tokenizer_path=str(paths["tokenizer_path"]),
        image_keys=("base", "wrist"),
    )


# --- against LeRobot's GR00TN15 (tests/data/make_lerobot_gr00t_reference.py) ---

REFERENCE = Path(__file__).parent / "data" / "lerobot_gr00t_tiny"
LEROBOT_TINY = attrs.evolve(TINY_GR00T, max_num_embodiments=4)  # the fixture's sizes


def _lerobot_model() -> tuple[GR00TModel, dict[str, torch.Tensor], PrefixCache]:
    model = GR00TModel(LEROBOT_TINY)
    # LeRobot's state dict loads into ours strictly: the same names and shapes, nothing missing but our value head.
    report = load_gr00t_weights(model, REFERENCE)
    assert report.initialised and all(k.startswith("value_head.") for k in report.initialised)
    assert not report.tied_from
    model.eval()
    ref = load_file(str(REFERENCE / "reference.safetensors"))
    ids = ref["input_ids"]
    with torch.no_grad():
        prefix = model.encode_prefix(ref["pixel_values"], ids, torch.ones_like(ids, dtype=torch.bool))
    return model, ref, prefix


def test_backbone_features_match_lerobots_eagle() -> None:
    model, ref, _ = _lerobot_model()
    ids = ref["input_ids"]
    with torch.no_grad():
        features = model.backbone(ref["pixel_values"], ids, torch.ones_like(ids, dtype=torch.bool))
    torch.testing.assert_close(features, ref["backbone_features"], atol=1e-5, rtol=1e-5)


def test_velocity_and_loss_match_lerobots_gr00t() -> None:
    model, ref, prefix = _lerobot_model()
    ids = ref["embodiment_id"]  # one embodiment per sample: the category-specific weights differ
    tau = ref["tau"]
    x = (1 - tau[:, None, None]) * ref["noise"] + tau[:, None, None] * ref["actions"]  # GR00T's time
    with torch.no_grad():
        hidden = model.action_head.hidden(
            x, model.steps(1 - tau), prefix.hidden, prefix.pad_mask, ref["state"], ids
        )
        velocity = model.action_head.decode(hidden, ids)
    torch.testing.assert_close(velocity, ref["velocity"], atol=1e-5, rtol=1e-5)
    # Our per-element loss in openpi's time (t = 1 - τ, velocity noise - actions) is LeRobot's, whose mean it takes.
    errors = []
    for i, embodiment in enumerate(ids.tolist()):
        model.embodiment_id = embodiment
        one = PrefixCache(
            keys=(), values=(), pad_mask=prefix.pad_mask[i : i + 1], hidden=prefix.hidden[i : i + 1]
        )
        with torch.no_grad():
            errors.append(
                model.flow_matching_loss(
                    one,
                    ref["state"][i : i + 1],
                    ref["actions"][i : i + 1],
                    ref["noise"][i : i + 1],
                    1 - tau[i : i + 1],
                )
            )
    torch.testing.assert_close(torch.cat(errors).mean().reshape(1), ref["loss"], atol=1e-6, rtol=1e-5)


def test_sampled_actions_match_lerobots_get_action() -> None:
    model, ref, prefix = _lerobot_model()
    for i, embodiment in enumerate(ref["embodiment_id"].tolist()):
        model.embodiment_id = embodiment
        one = PrefixCache(
            keys=(), values=(), pad_mask=prefix.pad_mask[i : i + 1], hidden=prefix.hidden[i : i + 1]
        )
        with torch.no_grad():
            sampled = model.sample_actions(one, ref["state"][i : i + 1], ref["init"][i : i + 1])
        torch.testing.assert_close(sampled[0], ref["sampled"][i], atol=1e-5, rtol=1e-5)
