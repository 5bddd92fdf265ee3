"""rlinf_models.pi0.Pi0Policy: π0 / π0.5 as an RL flow policy, on the tiny LeRobot checkpoints of data/."""

from __future__ import annotations

import dataclasses
import string
from pathlib import Path

import attrs
import pytest
import torch

pytest.importorskip("transformers")

from rlinf_core.protocols import ObsSpec
from rlinf_models.pi0 import Pi0Policy, load_tokenizer, tokenize_prompts
from rlinf_models.pi0.testing import LEROBOT_TINY_SPEC, lerobot_tiny_obs, make_tiny_pi0, write_char_tokenizer
from rlinf_models.policies import PolicyConfig, build_inference_policy, build_policy

torch.set_num_threads(1)

ROOT = Path(__file__).parent / "data"
VARIANTS = ["pi0", "pi05"]
# The LeRobot fixtures: 16x16 images (the 24x24 cameras are resized), a 5-D state, 7-D actions, chunk 4, 64 token ids.
SPEC = LEROBOT_TINY_SPEC
TASKS = LEROBOT_TINY_SPEC.task_descriptions


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # 3 specials + 28 characters: within the fixtures' 64-token vocabulary.
    return write_char_tokenizer(tmp_path_factory.mktemp("tok"), string.ascii_lowercase + " \n")


def _config(variant: str, tokenizer_dir: Path, **changes: object) -> PolicyConfig:
    ckpt = ROOT / f"lerobot_{variant}_tiny" / "ckpt"
    cfg = PolicyConfig(
        model_type=variant,  # type: ignore[arg-type]
        model_path=str(ckpt),
        tokenizer_path=str(tokenizer_dir),
        norm_stats_path=str(ckpt / "policy_preprocessor_step_5_normalizer_processor.safetensors"),
        image_keys=("base", "wrist"),
        num_action_chunks=3,
        denoising_steps=4,
    )
    return attrs.evolve(cfg, **changes)


def _policy(variant: str, tokenizer_dir: Path, seed: int = 0, **changes: object) -> Pi0Policy:
    torch.manual_seed(seed)
    policy = build_policy(SPEC, _config(variant, tokenizer_dir, **changes))
    assert isinstance(policy, Pi0Policy)
    return policy


def _obs(n: int = 4, seed: int = 0) -> dict[str, torch.Tensor]:
    return lerobot_tiny_obs(n, torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize(("method", "joint"), [("flow_sde", False), ("flow_sde", True), ("flow_noise", None)])
def test_evaluate_recomputes_the_rollouts_log_probs(
    tokenizer_dir: Path, variant: str, method: str, joint: bool | None
) -> None:
    policy = _policy(variant, tokenizer_dir, noise_method=method, joint_logprob=joint)
    obs = _obs()
    out = policy.act(obs, generator=torch.Generator().manual_seed(1))
    assert out.actions.shape == out.logprobs.shape == (4, 3, 7) and out.values.shape == (4, 1)
    assert out.forward_inputs is not None
    assert out.forward_inputs["chains"].shape == (4, 5, 4, 8)  # K+1 steps of [chunk_size, max_action_dim]
    assert out.forward_inputs["denoise_mask"].sum(dim=1).tolist() == [4 if joint is not False else 1] * 4
    assert bool((out.logprobs != 0).all())
    logprobs, entropy, values = policy.evaluate(obs, out.actions, out.forward_inputs)
    # Same weights, same chain: the rollout's and the trainer's log-probs agree (float32 forward passes).
    torch.testing.assert_close(logprobs, out.logprobs, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(values, out.values)
    assert entropy.shape == (4, 3, 7)
    logprobs.sum().backward()  # type: ignore[no-untyped-call]
    expert = policy.model.action_out_proj.weight.grad
    assert expert is not None and bool(expert.abs().sum() > 0)
    if method == "flow_noise":
        assert policy.noise_head is not None and policy.noise_head.weight.grad is not None


@pytest.mark.parametrize("variant", VARIANTS)
def test_actions_are_the_executed_part_of_the_chain_in_env_units(tokenizer_dir: Path, variant: str) -> None:
    policy = _policy(variant, tokenizer_dir)
    obs = _obs()
    out = policy.act(obs, deterministic=True)
    assert out.forward_inputs is not None
    end = out.forward_inputs["chains"][:, -1, :3, :7]
    torch.testing.assert_close(out.actions, policy.action_stats.unnormalize(end, policy.norm_mode))
    assert bool((out.logprobs == 0).all()) and not out.forward_inputs["denoise_mask"].any()
    torch.testing.assert_close(policy.act(obs, deterministic=True).actions, out.actions, atol=0, rtol=0)


def test_each_env_is_prompted_with_its_own_instruction(tokenizer_dir: Path) -> None:
    policy = _policy("pi0", tokenizer_dir)
    tokens, _ = tokenize_prompts(
        load_tokenizer(tokenizer_dir), TASKS, policy.model.config.tokenizer_max_length
    )
    assert torch.equal(policy.task_tokens, tokens)
    assert "task_tokens" not in policy.state_dict()  # derived at build time, not weights
    obs = _obs(2)
    obs["task_index"] = torch.tensor([[0], [0]], dtype=torch.int16)
    same = policy.value(obs)
    obs["task_index"] = torch.tensor([[0], [1]], dtype=torch.int16)
    other = policy.value(obs)
    assert same[0] == other[0] and same[1] != other[1]


@pytest.mark.parametrize("variant", VARIANTS)
def test_value_head_only_with_add_value_head(tokenizer_dir: Path, variant: str) -> None:
    obs = _obs()
    ppo = _policy(variant, tokenizer_dir)
    values = ppo.value(obs)
    assert values.shape == (4, 1) and bool((values != 0).all())
    values.sum().backward()  # type: ignore[no-untyped-call]
    assert all(p.grad is not None for p in ppo.model.value_head.parameters())
    grpo = _policy(variant, tokenizer_dir, add_value_head=False)
    assert torch.equal(grpo.value(obs), torch.zeros(4, 1))
    assert torch.equal(grpo.act(obs).values, torch.zeros(4, 1))


@pytest.mark.parametrize("variant", VARIANTS)
def test_imitation_loss_decreases(tokenizer_dir: Path, variant: str) -> None:
    policy = _policy(variant, tokenizer_dir)
    obs = _obs()
    g = torch.Generator().manual_seed(3)
    actions = torch.rand(4, 3, 7, generator=g) * 2 - 1
    mask = torch.ones(4, 3)
    optim = torch.optim.Adam(policy.parameters(), lr=3e-3)
    losses = []
    for _ in range(40):
        loss = policy.imitation_loss(obs, actions, mask)
        optim.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        optim.step()
        losses.append(loss.item())
    assert sum(losses[-8:]) / 8 < 0.7 * sum(losses[:8]) / 8, losses


def test_rollout_copy_takes_the_actors_weights(tokenizer_dir: Path) -> None:
    actor = _policy("pi0", tokenizer_dir, seed=0, noise_method="flow_noise")
    with torch.no_grad():
        for p in actor.parameters():
            p.add_(0.01)
    rollout = build_inference_policy(SPEC, actor.config)
    rollout.load_state_dict(actor.state_dict())
    obs = _obs()
    a = actor.act(obs, generator=torch.Generator().manual_seed(5))
    b = rollout.act(obs, generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(a.actions, b.actions, atol=0, rtol=0)


def test_make_tiny_pi0_writes_a_libero_sized_model(tmp_path: Path) -> None:
    paths = make_tiny_pi0(tmp_path, pi05=True)
    spec = dataclasses.replace(
        SPEC,
        obs_dict={
            "rgb": ObsSpec((64, 64, 3), "uint8"),
            "wrist_rgb": ObsSpec((64, 64, 3), "uint8"),
            "state": ObsSpec((8,)),
        },
        task_descriptions=("pick up the black bowl and place it on the plate",),
    )
    cfg = PolicyConfig(model_type="pi05", num_action_chunks=4, **{k: str(v) for k, v in paths.items()})
    policy = build_policy(spec, cfg)
    obs = {
        "rgb": torch.zeros(2, 64, 64, 3, dtype=torch.uint8),
        "wrist_rgb": torch.zeros(2, 64, 64, 3, dtype=torch.uint8),
        "state": torch.zeros(2, 8),
    }
    out = policy.act(obs)  # no task_index entry: the one description
    assert out.actions.shape == (2, 4, 7) and bool(torch.isfinite(out.actions).all())


def test_bad_combinations_name_the_field(tokenizer_dir: Path) -> None:
    with pytest.raises(ValueError, match="needs tokenizer_path, norm_stats_path"):
        PolicyConfig(model_type="pi0", model_path="x")
    with pytest.raises(ValueError, match="belong to model_type 'pi0' / 'pi05', not 'mlp'"):
        PolicyConfig(tokenizer_path="tok")
    with pytest.raises(ValueError, match="has no Q heads"):
        _config("pi0", tokenizer_dir, add_q_head=True, add_value_head=False)
    with pytest.raises(ValueError, match=r"model_type is 'pi05' but .* holds a 'pi0' model"):
        build_policy(SPEC, attrs.evolve(_config("pi0", tokenizer_dir), model_type="pi05"))
    with pytest.raises(ValueError, match=r"image_keys \['base', 'state'\]: must be camera entries"):
        _policy("pi0", tokenizer_dir, image_keys=("base", "state"))
    with pytest.raises(ValueError, match="state_key 'proprio'"):
        _policy("pi0", tokenizer_dir, state_key="proprio")
    with pytest.raises(ValueError, match=r"num_action_chunks \(5\) exceeds the model's chunk_size \(4\)"):
        _policy("pi0", tokenizer_dir, num_action_chunks=5)
    no_index = dataclasses.replace(
        SPEC, obs_dict={k: v for k, v in SPEC.obs_dict.items() if k != "task_index"}
    )  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="2 task descriptions but no 'task_index' entry"):
        build_policy(no_index, _config("pi0", tokenizer_dir))
    policy = _policy("pi0", tokenizer_dir)
    with pytest.raises(
        ValueError, match=r"π0 policy's log-probability needs .*'chains', 'denoise_mask'.*got None"
    ):
        policy.evaluate(_obs(), torch.zeros(4, 3, 7), None)
    with pytest.raises(FileNotFoundError, match="norm_stats_path"):
        _policy("pi0", tokenizer_dir, norm_stats_path=str(tokenizer_dir / "absent.json"))


# ---------------------------------------------------------------------------------------------- LoRA
def test_lora_adapts_only_the_gemma_towers_and_freezes_the_backbone(tokenizer_dir: Path) -> None:
    plain = _policy("pi0", tokenizer_dir, seed=0)
    lora = _policy("pi0", tokenizer_dir, seed=0, is_lora=True, lora_rank=4, lora_alpha=8.0)
    names = [n for n, _ in lora.named_parameters() if ".lora_A." in n]
    assert names and all(".language_model." in n or ".gemma_expert." in n for n in names)
    assert not any("vision_tower" in n for n in names)  # SigLIP's q_proj & co. keep no adapter
    trainable = {n for n, p in lora.named_parameters() if p.requires_grad}
    backbone = {n for n in trainable if n.startswith("model.paligemma_with_expert.")}
    assert backbone == {n for n, _ in lora.named_parameters() if ".lora_" in n}
    assert "model.action_out_proj.weight" in trainable and "model.state_proj.weight" in trainable
    # B starts at zero: the adapted policy acts exactly as the plain one.
    obs = _obs()
    a = plain.act(obs, generator=torch.Generator().manual_seed(1))
    b = lora.act(obs, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(a.actions, b.actions, atol=0, rtol=0)


def test_lora_training_reaches_the_rollout_through_merged_weights(tokenizer_dir: Path) -> None:
    from rlinf_models.policies import rollout_state_dict

    actor = _policy("pi0", tokenizer_dir, seed=0, is_lora=True, lora_rank=4, lora_alpha=8.0)
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
    assert not any(".lora_" in n for n in rollout.state_dict())
    rollout.load_state_dict(rollout_state_dict(actor.config, actor.state_dict()))  # strict: keys match
    a = actor.act(obs, deterministic=True)
    b = rollout.act(obs, deterministic=True)
    torch.testing.assert_close(a.actions, b.actions, atol=1e-4, rtol=1e-4)
    # The merge is what moved the rollout: the base weights alone give other actions.
    base = build_inference_policy(SPEC, actor.config)
    base.load_state_dict(
        {k.replace(".base_layer.", "."): v for k, v in actor.state_dict().items() if ".lora_" not in k}
    )
    assert not torch.allclose(base.act(obs, deterministic=True).actions, a.actions, atol=1e-4)


def test_plain_weights_load_under_the_adapters_and_lora_weights_need_is_lora(
    tokenizer_dir: Path, tmp_path: Path
) -> None:
    from rlinf_models.policies import load_policy_weights

    plain = _policy("pi0", tokenizer_dir, seed=0)
    with torch.no_grad():
        for p in plain.parameters():
            p.add_(0.01)
    torch.save(plain.state_dict(), tmp_path / "plain.pt")
    lora = _policy("pi0", tokenizer_dir, seed=1, is_lora=True, lora_rank=4)
    loaded = load_policy_weights(lora, tmp_path / "plain.pt", field="actor.model.model_path", strict=False)
    assert not [k for k in loaded.kept if ".lora_" not in k]  # every base weight came from the file
    obs = _obs()
    torch.testing.assert_close(
        lora.act(obs, deterministic=True).actions, plain.act(obs, deterministic=True).actions, atol=0, rtol=0
    )
    torch.save(lora.state_dict(), tmp_path / "lora.pt")
    with pytest.raises(ValueError, match="is_lora: true"):
        load_policy_weights(plain, tmp_path / "lora.pt", field="actor.model.model_path", strict=False)


def test_is_lora_is_for_vla_models_only() -> None:
    with pytest.raises(ValueError, match="is_lora"):
        PolicyConfig(model_type="mlp", is_lora=True)
