"""rlinf_models.openvla, OpenVLA-OFT: OFT's checkpoint layout, parallel chunk decoding, log-probs, heads, LoRA."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("peft")

from rlinf_core.protocols import EnvSpec, ObsSpec
from rlinf_models.openvla import (
    OFT_STOP_TOKEN_ID,
    OpenVLAOFTModel,
    OpenVLAOFTPolicy,
    load_openvla_oft,
    normalize_actions,
    reduce_log_probs,
    save_openvla_oft,
)
from rlinf_models.openvla.testing import TINY_OFT_NORM_STATS, make_tiny_openvla_oft
from rlinf_models.policies import PolicyConfig, build_policy
from rlinf_models.vla import CheckpointMismatchError

torch.set_num_threads(1)

C, D = 8, 7
TASKS = ("pick up the black bowl and place it on the plate", "open the top drawer")
SPEC = EnvSpec(
    obs_shape=(),
    action_type="continuous",
    action_dim=D,
    action_low=(-1.0,) * D,
    action_high=(1.0,) * D,
    obs_dict={
        "rgb": ObsSpec((64, 64, 3), "uint8"),
        "wrist_rgb": ObsSpec((64, 64, 3), "uint8"),
        "state": ObsSpec((8,)),
        "task_index": ObsSpec((1,), "int16"),
    },
    task_descriptions=TASKS,
)
N = 4


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_openvla_oft(tmp_path_factory.mktemp("oft") / "ckpt", value_head_sizes=(16,))


@pytest.fixture(scope="module")
def plain_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """No L1 head and no proprio projector: RLinf's discrete OFT checkpoints."""
    return make_tiny_openvla_oft(tmp_path_factory.mktemp("oft") / "plain", l1_head=False, proprio_dim=None)


def _config(ckpt: Path, **changes: object) -> PolicyConfig:
    base: dict[str, object] = {
        "model_type": "openvla_oft",
        "model_path": str(ckpt),
        "num_action_chunks": C,
        "unnorm_key": "libero_spatial_no_noops",
    }
    return PolicyConfig(**{**base, **changes})  # type: ignore[arg-type]


def _obs(n: int = N, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "rgb": torch.randint(0, 256, (n, 64, 64, 3), generator=g, dtype=torch.uint8),
        "wrist_rgb": torch.randint(0, 256, (n, 64, 64, 3), generator=g, dtype=torch.uint8),
        "state": torch.randn(n, 8, generator=g) * 0.3,
        "task_index": torch.arange(n).remainder(2)[:, None],
    }


def _inputs(b: int = 3, length: int = 12, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Pixels, prompts (row 0 left-padded after BOS), mask and proprio of a batch."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 90, (b, length), generator=g)
    ids[:, 0] = 1
    mask = torch.ones(b, length, dtype=torch.long)
    mask[0, 1:5] = 0
    ids[0, 1:5] = 512  # the pad token
    return torch.randn(b, 6, 224, 224, generator=g), ids, mask, torch.randn(b, 8, generator=g)


# --- the checkpoint layout ---


def test_oft_layout_has_ofts_module_files_and_key_names(ckpt: Path) -> None:
    names = {p.name for p in ckpt.iterdir()}
    assert {"action_head--latest_checkpoint.pt", "proprio_projector--latest_checkpoint.pt"} <= names
    assert "config.json" in names and "model.safetensors.index.json" in names
    head = torch.load(ckpt / "action_head--latest_checkpoint.pt", weights_only=True)
    # OFT's MLPResNet under DDP's prefix; input D*H (224), hidden H (32), output D.
    assert set(head) == {
        f"module.model.{k}"
        for k in (
            "layer_norm1.weight",
            "layer_norm1.bias",
            "fc1.weight",
            "fc1.bias",
            *(
                f"mlp_resnet_blocks.{i}.ffn.{j}.{p}"
                for i in (0, 1)
                for j in (0, 1)
                for p in ("weight", "bias")
            ),
            "layer_norm2.weight",
            "layer_norm2.bias",
            "fc2.weight",
            "fc2.bias",
        )
    }
    assert head["module.model.fc1.weight"].shape == (32, 32 * D)
    assert head["module.model.fc2.weight"].shape == (D, 32)
    proprio = torch.load(ckpt / "proprio_projector--latest_checkpoint.pt", weights_only=True)
    assert {k: tuple(v.shape) for k, v in proprio.items()} == {
        "module.fc1.weight": (32, 8),
        "module.fc1.bias": (32,),
        "module.fc2.weight": (32, 32),
        "module.fc2.bias": (32,),
    }


def test_loading_is_strict_and_round_trips(ckpt: Path, tmp_path: Path) -> None:
    model, report = load_openvla_oft(ckpt, action_dim=D, num_action_chunks=C)
    assert report.initialised == ()
    assert model.action_head is not None and model.proprio_projector is not None
    assert model.value_head is not None  # the directory's value_head.safetensors
    save_openvla_oft(model, tmp_path / "again", step=7)
    again, _ = load_openvla_oft(tmp_path / "again", action_dim=D, num_action_chunks=C)
    state = model.state_dict()
    assert set(again.state_dict()) == set(state)
    for key, value in again.state_dict().items():
        assert torch.equal(value, state[key]), key
    # A head of the wrong width (another robot's action dims) is a shape mismatch.
    with pytest.raises(
        CheckpointMismatchError, match=r"5 shape mismatches \[action_head.model.layer_norm1.weight"
    ):
        load_openvla_oft(ckpt, action_dim=6, num_action_chunks=C)


def _copy(ckpt: Path, tmp_path: Path) -> Path:
    out = tmp_path / "copy"
    shutil.copytree(ckpt, out)
    return out


def test_a_head_file_with_a_missing_or_extra_tensor_is_refused(ckpt: Path, tmp_path: Path) -> None:
    out = _copy(ckpt, tmp_path)
    file = out / "action_head--latest_checkpoint.pt"
    head = torch.load(file, weights_only=True)
    torch.save({k: v for k, v in head.items() if "layer_norm2" not in k}, file)
    with pytest.raises(CheckpointMismatchError, match=r"2 missing \[action_head.model.layer_norm2.weight"):
        load_openvla_oft(out, action_dim=D, num_action_chunks=C)
    torch.save({**head, "module.model.extra": torch.zeros(1)}, file)
    with pytest.raises(CheckpointMismatchError, match=r"1 unexpected \[action_head.model.extra\]"):
        load_openvla_oft(out, action_dim=D, num_action_chunks=C)


def test_unsupported_or_duplicated_module_files_are_refused(ckpt: Path, tmp_path: Path) -> None:
    out = _copy(ckpt, tmp_path)
    shutil.copy(out / "action_head--latest_checkpoint.pt", out / "action_head--100_checkpoint.pt")
    with pytest.raises(ValueError, match="several checkpoint files of one module"):
        load_openvla_oft(out, action_dim=D, num_action_chunks=C)
    (out / "action_head--100_checkpoint.pt").unlink()
    torch.save({}, out / "vision_backbone--latest_checkpoint.pt")  # FiLM
    with pytest.raises(ValueError, match=r"\['vision_backbone'\].*FiLM"):
        load_openvla_oft(out, action_dim=D, num_action_chunks=C)


def test_without_module_files_the_model_has_no_heads(plain_ckpt: Path) -> None:
    model, _ = load_openvla_oft(plain_ckpt, action_dim=D, num_action_chunks=C)
    assert model.action_head is None and model.proprio_projector is None and model.value_head is None
    with pytest.raises(ValueError, match="no L1 regression head"):
        model.regress_chunk(*_inputs()[:3])


# --- parallel decoding ---


@pytest.fixture(scope="module")
def model(ckpt: Path) -> OpenVLAOFTModel:
    return load_openvla_oft(ckpt, action_dim=D, num_action_chunks=C)[0].eval()


def _reference_hidden(model: OpenVLAOFTModel, embeds: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The LM's hidden states through transformers' own bidirectional path (``is_causal = False``), not ours."""
    lm = model.language_model
    saved = lm.config.is_causal if hasattr(lm.config, "is_causal") else None
    layers = [layer.self_attn for layer in lm.model.layers]
    try:
        lm.config.is_causal = False
        for attn in layers:
            attn.is_causal = False
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        out: torch.Tensor = lm.model(
            inputs_embeds=embeds, attention_mask=mask, position_ids=positions
        ).last_hidden_state
    finally:
        if saved is None:
            del lm.config.is_causal
        else:
            lm.config.is_causal = saved
        for attn in layers:
            attn.is_causal = True
    return out


@torch.no_grad()
def test_one_pass_matches_transformers_bidirectional_attention_and_a_per_position_readout(
    model: OpenVLAOFTModel,
) -> None:
    pixels, ids, mask, proprio = _inputs()
    embeds, full_mask = model.embed_chunk_inputs(pixels, ids, mask, proprio)
    a = C * D
    # The layout: [BOS, 49 patches, proprio token, prompt[1:], 0 x C*D, </s>].
    assert embeds.shape[1] == 1 + 49 + 1 + (ids.shape[1] - 1) + a + 1
    assert bool((embeds[:, -a - 1 : -1] == 0).all())
    stop = model.language_model.get_input_embeddings().weight[OFT_STOP_TOKEN_ID]
    torch.testing.assert_close(embeds[:, -1], stop.expand(3, -1))
    ours = model.bidirectional_hidden(embeds, full_mask)
    reference = _reference_hidden(model, embeds, full_mask)
    real = full_mask.bool()
    torch.testing.assert_close(ours[real], reference[real], atol=1e-5, rtol=1e-5)
    # Per position: the LM head's full-vocabulary logits at position L'-a-2+i, cut to the action tokens and
    # log-softmaxed, give token i's distribution (the causal-LM shift: the last prompt token predicts token 0).
    sample = model.sample_chunk(
        pixels, ids, mask, proprio, temperature=0.7, generator=torch.Generator().manual_seed(0)
    )
    first = model.action_tokenizer.first_token
    logits = model.language_model.lm_head(reference)
    length = embeds.shape[1]
    for i in range(a):
        row = logits[:, length - a - 2 + i, first : first + 256] / 0.7
        expected = torch.log_softmax(row, -1).gather(-1, (sample.tokens[:, i : i + 1] - first)).squeeze(-1)
        torch.testing.assert_close(sample.log_probs[:, i], expected, atol=1e-5, rtol=0)
    greedy = model.sample_chunk(pixels, ids, mask, proprio, greedy=True)
    torch.testing.assert_close(
        greedy.tokens, logits[:, length - a - 2 : length - 2, first : first + 256].argmax(-1) + first
    )


@torch.no_grad()
def test_attention_is_bidirectional_and_the_tokens_are_not_fed_back(model: OpenVLAOFTModel) -> None:
    pixels, ids, mask, proprio = _inputs()
    base = model.sample_chunk(pixels, ids, mask, proprio, greedy=True)
    # Any stored tokens give the same distributions: the action positions' inputs are zeros.
    other = torch.randint(
        model.action_tokenizer.first_token, model.action_tokenizer.vocab_size, base.tokens.shape
    )
    evaluated = model.evaluate_chunk(pixels, ids, mask, other, proprio)
    torch.testing.assert_close(evaluated.entropy, base.entropy, atol=1e-6, rtol=0)
    # The stop token comes after every action position: under causal attention it could not move them.
    embedding = model.language_model.get_input_embeddings().weight
    saved = embedding[OFT_STOP_TOKEN_ID].clone()
    try:
        embedding[OFT_STOP_TOKEN_ID] += 1.0
        moved = model.sample_chunk(pixels, ids, mask, proprio, greedy=True)
    finally:
        embedding[OFT_STOP_TOKEN_ID] = saved
    assert not torch.allclose(moved.entropy[:, 0], base.entropy[:, 0])


@torch.no_grad()
def test_a_prompt_decodes_the_same_alone_and_left_padded_in_a_batch(model: OpenVLAOFTModel) -> None:
    pixels, ids, mask, proprio = _inputs()
    batch = model.sample_chunk(pixels, ids, mask, proprio, greedy=True)
    real = mask[0].bool()
    alone = model.sample_chunk(pixels[:1], ids[:1, real], mask[:1, real], proprio[:1], greedy=True)
    torch.testing.assert_close(alone.log_probs, batch.log_probs[:1], atol=1e-5, rtol=0)
    assert alone.values is not None and batch.values is not None
    torch.testing.assert_close(alone.values, batch.values[:1], atol=1e-5, rtol=0)


# --- the policy ---


@pytest.mark.parametrize("level", ["token_level", "action_level", "chunk_level"])
def test_rollout_and_actor_log_probs_agree_at_every_level(ckpt: Path, level: str) -> None:
    torch.manual_seed(0)
    policy = build_policy(SPEC, _config(ckpt, temperature=0.8, image_keys=("rgb",)))
    assert isinstance(policy, OpenVLAOFTPolicy)
    obs = _obs()
    out = policy.act(obs, generator=torch.Generator().manual_seed(1))
    assert out.actions.shape == (N, C, D) and out.logprobs.shape == (N, C, D) and out.values.shape == (N, 1)
    assert out.forward_inputs is not None and out.forward_inputs["action_tokens"].shape == (N, C, D)
    # The actor sees the rows in another order and split in two micro-batches.
    order = torch.tensor([2, 0, 3, 1])
    parts = [order[:2], order[2:]]
    evaluated = torch.cat(
        [
            policy.evaluate(
                {k: v[p] for k, v in obs.items()},
                out.actions[p],
                {"action_tokens": out.forward_inputs["action_tokens"][p]},
            )[0]
            for p in parts
        ]
    )
    rollout = reduce_log_probs(out.logprobs[order].reshape(N, -1), level, D)
    actor = reduce_log_probs(evaluated.reshape(N, -1), level, D)
    assert actor.shape == {"token_level": (N, C * D), "action_level": (N, C), "chunk_level": (N,)}[level]
    torch.testing.assert_close(actor, rollout, atol=1e-5, rtol=0)
    _, entropy, values = policy.evaluate(obs, out.actions, out.forward_inputs)
    torch.testing.assert_close(values, out.values, atol=1e-5, rtol=0)
    torch.testing.assert_close(policy.value(obs), out.values, atol=1e-5, rtol=0)
    assert entropy.shape == (N, C, D) and bool((entropy > 0).all())


def test_sampled_chunks_decode_to_bin_centres_and_deterministic_uses_the_l1_head(ckpt: Path) -> None:
    policy = build_policy(
        SPEC, _config(ckpt, image_keys=("rgb", "wrist_rgb"), gripper_action="binary_inverted")
    )
    assert isinstance(policy, OpenVLAOFTPolicy) and policy.model.num_images == 2
    obs = _obs()
    out = policy.act(obs, generator=torch.Generator().manual_seed(3))
    assert out.forward_inputs is not None
    tokens = out.forward_inputs["action_tokens"]
    stats = TINY_OFT_NORM_STATS["libero_spatial_no_noops"]["action"]
    expected = policy.model.action_tokenizer.decode(tokens).float()
    low, high = torch.tensor(stats["q01"]), torch.tensor(stats["q99"])
    expected[..., :6] = 0.5 * (expected[..., :6] + 1) * (high[:6] - low[:6]) + low[:6]
    expected[..., 6] = -torch.sign(2 * expected[..., 6] - 1)
    torch.testing.assert_close(out.actions, expected)
    det = policy.act(obs, deterministic=True)
    pixels, ids, mask = policy._inputs(obs)
    regressed = policy.model.regress_chunk(pixels, ids, mask, policy._proprio(obs))
    assert regressed.shape == (N, C, D)
    torch.testing.assert_close(
        det.actions[..., :6], 0.5 * (regressed[..., :6] + 1) * (high[:6] - low[:6]) + low[:6]
    )
    assert set(det.actions[..., 6].unique().tolist()) <= {-1.0, 0.0, 1.0}


def test_without_an_l1_head_deterministic_actions_are_the_greedy_tokens(plain_ckpt: Path) -> None:
    policy = build_policy(SPEC, _config(plain_ckpt))
    assert isinstance(policy, OpenVLAOFTPolicy) and policy.proprio_stats is None
    obs = _obs()
    det = policy.act(obs, deterministic=True)
    alone = policy.act({k: v[:1] for k, v in obs.items()}, deterministic=True)
    assert det.forward_inputs is not None and alone.forward_inputs is not None
    assert torch.equal(det.forward_inputs["action_tokens"][:1], alone.forward_inputs["action_tokens"])
    pixels, ids, mask = policy._inputs(obs)
    greedy = policy.model.sample_chunk(pixels, ids, mask, greedy=True).tokens.reshape(N, C, D)
    assert torch.equal(det.forward_inputs["action_tokens"], greedy)


def test_proprio_is_normalised_with_the_checkpoints_quantiles(ckpt: Path) -> None:
    policy = build_policy(SPEC, _config(ckpt))
    assert isinstance(policy, OpenVLAOFTPolicy)
    obs = _obs()
    proprio = policy._proprio(obs)
    assert proprio is not None
    torch.testing.assert_close(
        proprio, normalize_actions(obs["state"], TINY_OFT_NORM_STATS["libero_spatial_no_noops"]["proprio"])
    )
    assert SPEC.obs_dict is not None
    spec = dataclasses.replace(SPEC, obs_dict={**SPEC.obs_dict, "state": ObsSpec((9,))})
    with pytest.raises(ValueError, match=r"actor.model.state_key 'state'.*needs a \[8\] state vector"):
        build_policy(spec, _config(ckpt))


def test_lora_trains_only_adapters_and_ofts_heads(ckpt: Path) -> None:
    policy = build_policy(SPEC, _config(ckpt, is_lora=True, lora_rank=2))
    trainable = {n for n, p in policy.named_parameters() if p.requires_grad}
    assert trainable and all(
        ".lora_" in n or n.startswith(("model.value_head.", "model.proprio_projector.", "model.action_head."))
        for n in trainable
    )
    assert any(".lora_" in n for n in trainable)
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    obs = _obs()
    out = policy.act(obs, generator=torch.Generator().manual_seed(0))
    logprobs, _, values = policy.evaluate(obs, out.actions, out.forward_inputs)
    torch.optim.SGD([p for p in policy.parameters() if p.requires_grad], lr=0.1).zero_grad()
    (logprobs.sum() + values.sum()).backward()
    torch.optim.SGD([p for p in policy.parameters() if p.requires_grad], lr=0.1).step()
    changed = {n for n, p in policy.named_parameters() if not torch.equal(p, before[n])}
    assert changed and changed <= trainable
    assert any(".lora_B" in n for n in changed) and any(
        n.startswith("model.proprio_projector.") for n in changed
    )


def test_imitation_loss_is_l1_with_the_head_and_cross_entropy_without(ckpt: Path, plain_ckpt: Path) -> None:
    obs = _obs()
    actions = torch.rand(N, C, D) * 0.2 - 0.1
    mask = torch.ones(N, C)
    mask[0, 4:] = 0
    policy = build_policy(SPEC, _config(ckpt))
    loss = policy.imitation_loss(obs, actions, mask)
    pixels, ids, prompt_mask = policy._inputs(obs)
    predicted = policy.model.regress_chunk(pixels, ids, prompt_mask, policy._proprio(obs))
    target = normalize_actions(actions, TINY_OFT_NORM_STATS["libero_spatial_no_noops"]["action"])
    keep = mask.bool()
    torch.testing.assert_close(loss, (predicted - target).abs()[keep].mean())
    loss.backward()
    assert policy.model.action_head is not None and policy.model.action_head.model.fc2.weight.grad is not None
    plain = build_policy(SPEC, _config(plain_ckpt))
    tokens = plain.model.action_tokenizer.encode(target)
    log_probs, _, _ = plain.evaluate(obs, actions, {"action_tokens": tokens})  # temperature 1
    torch.testing.assert_close(plain.imitation_loss(obs, actions, mask), -log_probs[keep].mean())
    with pytest.raises(ValueError, match=r"actions must be \[N, 8, 7\]"):
        plain.imitation_loss(obs, actions[:, :1], mask[:, :1])


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"model_path": None}, "model_type 'openvla_oft' needs model_path"),
        ({"norm_stats_path": "x.json"}, "norm_stats_path does not apply to model_type 'openvla_oft'"),
        ({"add_q_head": True, "add_value_head": False}, "model_type 'openvla_oft' is trained on-policy"),
    ],
)
def test_bad_openvla_oft_configs_name_the_key(changes: dict[str, object], message: str) -> None:
    base: dict[str, object] = {"model_type": "openvla_oft", "model_path": "ckpt", "num_action_chunks": 8}
    with pytest.raises(ValueError, match=message):
        PolicyConfig(**{**base, **changes})  # type: ignore[arg-type]


def test_chunks_are_allowed_for_openvla_oft_only() -> None:
    assert PolicyConfig(model_type="openvla_oft", model_path="ckpt", num_action_chunks=8).is_vla
    with pytest.raises(ValueError, match="num_action_chunks must be 1 for model_type 'openvla'"):
        PolicyConfig(model_type="openvla", model_path="ckpt", num_action_chunks=8)


def test_l1_imitation_loss_falls_with_training(ckpt: Path) -> None:
    """SFT (``apps/embodied/sft.py``) with OFT's head: its L1 loss on demonstrated chunks falls."""
    torch.manual_seed(0)
    policy = build_policy(SPEC, _config(ckpt, gripper_action="binary_inverted"))
    obs = _obs(2)
    actions = torch.rand(2, C, D) * 0.4 - 0.2
    actions[..., -1] = torch.where(torch.rand(2, C) > 0.5, 1.0, -1.0)  # robosuite's gripper
    mask = torch.ones(2, C)
    start = float(policy.imitation_loss(obs, actions, mask).detach())
    optim = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=3e-3)
    for _ in range(15):
        optim.zero_grad()
        policy.imitation_loss(obs, actions, mask).backward()
        optim.step()
    assert float(policy.imitation_loss(obs, actions, mask).detach()) < 0.5 * start


def test_published_size_heads_have_ofts_libero_shapes() -> None:
    """OpenVLA-7B with OFT's LIBERO heads, built on the meta device: the shapes OFT's constructors give."""
    from rlinf_models.openvla import OFT_PLATFORMS, OpenVLAConfig

    libero = OFT_PLATFORMS["libero"]
    with torch.device("meta"):
        model = OpenVLAOFTModel(
            OpenVLAConfig(),
            action_dim=libero.action_dim,
            num_action_chunks=libero.num_actions_chunk,
            l1_head=True,
            proprio_dim=libero.proprio_dim,
            num_images=2,
        )
    assert model.num_action_tokens == 56
    assert model.action_head is not None and model.proprio_projector is not None
    shapes = {k: tuple(v.shape) for k, v in model.action_head.state_dict().items()}
    # L1RegressionActionHead(input_dim=4096, hidden_dim=4096, action_dim=7): MLPResNet(2, 4096 * 7, 4096, 7).
    assert shapes["model.fc1.weight"] == (4096, 28672) and shapes["model.layer_norm1.weight"] == (28672,)
    assert shapes["model.mlp_resnet_blocks.1.ffn.1.weight"] == (4096, 4096)
    assert shapes["model.fc2.weight"] == (7, 4096)
    # 2 residual blocks: 2·28672 + (28672·4096 + 4096) + 2·(2·4096 + 4096² + 4096) + 2·4096 + (4096·7 + 7)
    assert sum(t.numel() for t in model.action_head.state_dict().values()) == 151_117_831
    assert model.proprio_projector.fc1.weight.shape == (4096, 8)
    assert model.proprio_projector.fc2.weight.shape == (4096, 4096)
