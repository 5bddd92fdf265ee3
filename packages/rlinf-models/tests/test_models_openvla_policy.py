"""rlinf_models.openvla.OpenVLAPolicy: OpenVLA as an embodied PPO policy (tokens, log-probs, values, LoRA)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("peft")

from rlinf_algos import reshape_entropy
from rlinf_models.openvla import (
    OpenVLAPolicy,
    action_stats,
    format_prompt,
    normalize_actions,
    unnormalize_actions,
)
from rlinf_models.openvla.testing import TINY_OPENVLA, make_tiny_openvla
from rlinf_models.policies import (
    PolicyConfig,
    build_inference_policy,
    build_policy,
    rollout_state_dict,
)
from rlinf_models.vla.testing import libero_spec

torch.set_num_threads(1)

TASKS = ("pick up the black bowl and place it on the plate", "open the top drawer")
SPEC = libero_spec(64, TASKS)
N = 4


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_openvla(tmp_path_factory.mktemp("openvla") / "ckpt", value_head_sizes=(16,))


def _config(ckpt: Path, **changes: object) -> PolicyConfig:
    return PolicyConfig(model_type="openvla", model_path=str(ckpt), **changes)  # type: ignore[arg-type]


def _obs(n: int = N, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "rgb": torch.randint(0, 256, (n, 64, 64, 3), generator=g, dtype=torch.uint8),
        "wrist_rgb": torch.randint(0, 256, (n, 64, 64, 3), generator=g, dtype=torch.uint8),
        "state": torch.randn(n, 8, generator=g),
        "task_index": torch.arange(n).remainder(2)[:, None],
    }


def test_rollout_and_actor_log_probs_agree_through_the_policy(ckpt: Path) -> None:
    torch.manual_seed(0)
    policy = build_policy(SPEC, _config(ckpt, temperature=0.8))
    assert isinstance(policy, OpenVLAPolicy)
    obs = _obs()
    out = policy.act(obs, generator=torch.Generator().manual_seed(1))
    assert out.actions.shape == (N, 1, 7) and out.actions.dtype == torch.float32
    assert out.logprobs.shape == (N, 1, 7) and out.values.shape == (N, 1)
    assert out.forward_inputs is not None and set(out.forward_inputs) == {"action_tokens"}
    tokens = out.forward_inputs["action_tokens"]
    first = policy.model.action_tokenizer.first_token
    assert tokens.shape == (N, 7) and bool(((tokens >= first) & (tokens < first + 256)).all())
    # The env's action: the tokens' bin centres un-normalised with the checkpoint's statistics.
    expected = unnormalize_actions(
        policy.model.action_tokenizer.decode(tokens).float(),
        action_stats(TINY_OPENVLA, "libero_spatial_no_noops"),
    )
    torch.testing.assert_close(out.actions[:, 0], expected)
    logprobs, entropy, values = policy.evaluate(obs, out.actions, out.forward_inputs)
    torch.testing.assert_close(logprobs, out.logprobs, atol=1e-5, rtol=0)
    torch.testing.assert_close(values, out.values, atol=1e-5, rtol=0)
    torch.testing.assert_close(policy.value(obs), out.values, atol=1e-5, rtol=0)
    assert entropy.shape == (N, 1, 7) and bool((entropy > 0).all())
    # token_level as stored; action_level is the sum over the 7 tokens (the action's log-probability).
    summed = reshape_entropy(logprobs.reshape(N, -1), "action_level", 7, N)
    assert summed is not None and summed.shape == (N, 1)


def test_the_instruction_is_the_env_tasks_prompt(ckpt: Path) -> None:
    policy = build_policy(SPEC, _config(ckpt))
    assert isinstance(policy, OpenVLAPolicy)
    ids, mask = policy.task_tokens, policy.task_token_mask
    for row, text in enumerate(TASKS):
        prompt = format_prompt(text) + " "
        real = ids[row][mask[row].bool()].tolist()
        assert real[0] == 1 and len(real) == len(prompt) + 1  # BOS, then one id per character
        assert real[-1] == real[1 + prompt.index(" ")]  # ends with the space token, as Llama's ▁ (29871)
    assert ids.shape[1] == len(format_prompt(TASKS[0])) + 2  # the longest prompt; the other is left-padded


def test_deterministic_actions_are_greedy_and_eval_batches_independent(ckpt: Path) -> None:
    policy = build_policy(SPEC, _config(ckpt))
    obs = _obs()
    a = policy.act(obs, deterministic=True)
    b = policy.act({k: v[:1] for k, v in obs.items()}, deterministic=True)
    assert a.forward_inputs is not None and b.forward_inputs is not None
    assert torch.equal(a.forward_inputs["action_tokens"][:1], b.forward_inputs["action_tokens"])


def test_gripper_binary_inverted_is_robosuites_convention(ckpt: Path) -> None:
    raw = build_policy(SPEC, _config(ckpt)).act(_obs(), deterministic=True).actions
    inverted = build_policy(SPEC, _config(ckpt, gripper_action="binary_inverted")).act(
        _obs(), deterministic=True
    )
    torch.testing.assert_close(inverted.actions[..., :6], raw[..., :6])
    torch.testing.assert_close(inverted.actions[..., 6], -torch.sign(2 * raw[..., 6] - 1))


def test_lora_trains_only_the_adapters_and_the_value_head_and_reaches_the_rollout_merged(ckpt: Path) -> None:
    actor = build_policy(SPEC, _config(ckpt, is_lora=True, lora_rank=4, lora_alpha=8.0))
    assert isinstance(actor, OpenVLAPolicy)
    trainable = {n for n, p in actor.named_parameters() if p.requires_grad}
    assert trainable == {
        n for n, _ in actor.named_parameters() if ".lora_" in n or n.startswith("model.value_head.")
    }
    assert any(".lora_" in n for n in trainable)
    assert not any("vision_backbone" in n or "projector" in n for n in trainable)
    frozen = {n: p.detach().clone() for n, p in actor.named_parameters() if not p.requires_grad}
    optim = torch.optim.Adam([p for p in actor.parameters() if p.requires_grad], lr=1e-2)
    obs = _obs()
    sample = actor.act(obs, generator=torch.Generator().manual_seed(0))
    for _ in range(3):
        logprobs, _, values = actor(obs, sample.actions, sample.forward_inputs)
        loss = -logprobs.sum() + values.square().mean()
        optim.zero_grad()
        loss.backward()
        optim.step()
    assert all(torch.equal(p, frozen[n]) for n, p in actor.named_parameters() if n in frozen)
    assert any(float(p.detach().abs().sum()) > 0 for n, p in actor.named_parameters() if ".lora_B." in n)
    rollout = build_inference_policy(SPEC, actor.config)
    assert isinstance(rollout, OpenVLAPolicy) and not rollout.config.is_lora
    rollout.load_state_dict(rollout_state_dict(actor.config, actor.state_dict()))  # strict: keys match
    actor.eval()
    want = actor.evaluate(obs, sample.actions, sample.forward_inputs)
    got = rollout.evaluate(obs, sample.actions, sample.forward_inputs)
    for x, y in zip(got, want, strict=True):
        torch.testing.assert_close(x, y, atol=1e-4, rtol=1e-4)


def test_without_a_value_head_values_are_zero(ckpt: Path) -> None:
    policy = build_policy(SPEC, _config(ckpt, add_value_head=False))
    assert isinstance(policy, OpenVLAPolicy) and policy.model.value_head is None
    assert torch.equal(policy.act(_obs()).values, torch.zeros(N, 1))
    assert not any(k.startswith("model.value_head.") for k in policy.state_dict())


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"num_action_chunks": 2}, "num_action_chunks must be 1 for model_type 'openvla'"),
        ({"norm_stats_path": "x.json"}, "norm_stats_path does not apply to model_type 'openvla'"),
        ({"model_path": None}, "model_type 'openvla' needs model_path"),
    ],
)
def test_config_refusals_name_the_field(changes: dict[str, object], message: str) -> None:
    base: dict[str, object] = {"model_type": "openvla", "model_path": "ckpt"}
    with pytest.raises(ValueError, match=message):
        PolicyConfig(**(base | changes))  # type: ignore[arg-type]


def test_openvla_keys_are_refused_on_other_models() -> None:
    with pytest.raises(ValueError, match="unnorm_key and gripper_action belong to model_type 'openvla'"):
        PolicyConfig(model_type="mlp", unnorm_key="libero_spatial_no_noops")


def test_env_and_checkpoint_refusals_name_the_field(ckpt: Path) -> None:
    with pytest.raises(ValueError, match=r"actor.model.unnorm_key: unnorm_key 'bridge_orig' is not in"):
        build_policy(SPEC, _config(ckpt, unnorm_key="bridge_orig"))
    with pytest.raises(
        ValueError, match=r"actor.model.image_keys \['rgb', 'wrist_rgb'\]: OpenVLA sees one camera"
    ):
        build_policy(SPEC, _config(ckpt, image_keys=("rgb", "wrist_rgb")))
    with pytest.raises(ValueError, match="the env has 4 action dims"):
        build_policy(dataclasses.replace(SPEC, action_dim=4), _config(ckpt))


def test_imitation_loss_is_the_cross_entropy_of_the_demonstrated_tokens_and_falls(ckpt: Path) -> None:
    """SFT (``apps/embodied/sft.py``): the demonstrated env actions go back to OpenVLA's tokens (the inverse of
    what ``act`` executes, gripper included), whose teacher-forced cross-entropy falls with training."""
    torch.manual_seed(0)
    policy = build_policy(SPEC, _config(ckpt, gripper_action="binary_inverted"))
    assert isinstance(policy, OpenVLAPolicy)
    obs = _obs()
    executed = policy.act(obs, generator=torch.Generator().manual_seed(3))
    tokens = executed.forward_inputs["action_tokens"]  # type: ignore[index]
    stats = action_stats(TINY_OPENVLA, "libero_spatial_no_noops")
    # the env actions the rollout executed map back to the very tokens it sampled (bin centres)
    normalized = policy.model.action_tokenizer.decode(tokens).float()
    back = policy.model.action_tokenizer.encode(
        normalize_actions(unnormalize_actions(normalized, stats), stats)
    )
    assert torch.equal(back[:, :-1], tokens[:, :-1])
    mask = torch.ones(N, 1)
    loss = policy.imitation_loss(obs, executed.actions, mask)
    assert loss.ndim == 0 and float(loss.detach()) > 0
    masked = policy.imitation_loss(obs, executed.actions, torch.tensor([[1.0], [0.0], [0.0], [0.0]]))
    first = policy.imitation_loss({k: v[:1] for k, v in obs.items()}, executed.actions[:1], mask[:1])
    torch.testing.assert_close(masked, first, rtol=1e-5, atol=1e-6)
    optim = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=3e-3)
    start = float(loss.detach())
    for _ in range(20):
        optim.zero_grad()
        policy.imitation_loss(obs, executed.actions, mask).backward()
        optim.step()
    assert float(policy.imitation_loss(obs, executed.actions, mask).detach()) < 0.5 * start
