"""``actor.model.lora_sync``: the rollout of every LoRA-capable VLA gets the merged model or only the adapters.

For π0 (Flow-Noise, so the noise head trains too), π0.5, SmolVLA and OpenVLA on tiny random checkpoints: after a
few optimizer steps of the adapted actor, the ``adapters`` sync sends exactly the tensors that train, and a
rollout policy built independently (another seed) from the same ``model_path`` then has the merged sync's
effective weights and acts, and scores the actor's samples, exactly as the actor does.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("peft")

from rlinf_models._lora_state import merge_lora_state
from rlinf_models.policies import (
    PolicyConfig,
    build_inference_policy,
    build_policy,
    load_rollout_weights,
    rollout_state_dict,
    trainable_names,
)
from rlinf_models.vla.testing import libero_obs, libero_spec

torch.set_num_threads(1)

MODELS = ["pi0", "pi05", "smolvla", "openvla"]
# What the tiny checkpoints of rlinf_models.*.testing fit: LIBERO's two cameras, an 8-D state, 7-D actions.
SPEC = libero_spec(32)
N = 3


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("lora_sync")


@cache
def _checkpoint(kind: str, root: Path) -> dict[str, str]:
    """The tiny checkpoint's ``actor.model`` paths (written once per module)."""
    if kind == "openvla":
        from rlinf_models.openvla.testing import make_tiny_openvla

        return {"model_path": str(make_tiny_openvla(root / kind, value_head_sizes=(16,)))}
    if kind == "smolvla":
        from rlinf_models.smolvla.testing import make_tiny_smolvla

        paths = make_tiny_smolvla(root / kind)
    else:
        from rlinf_models.pi0.testing import make_tiny_pi0

        paths = make_tiny_pi0(root / kind, pi05=kind == "pi05")
    return {k: str(v) for k, v in paths.items()}


def _config(kind: str, root: Path, **changes: Any) -> PolicyConfig:
    flow = {} if kind == "openvla" else {"num_action_chunks": 2, "denoising_steps": 3}
    noise = {"noise_method": "flow_noise"} if kind == "pi0" else {}
    lora = {"is_lora": True, "lora_rank": 4, "lora_alpha": 8.0, "lora_sync": "adapters"}
    return PolicyConfig(model_type=kind, **{**_checkpoint(kind, root), **flow, **noise, **lora, **changes})


def _obs(seed: int = 0) -> dict[str, torch.Tensor]:
    return libero_obs(N, 32, seed)


def _trained_actor(kind: str, root: Path) -> Any:
    """The adapted actor after 2 Adam steps of a PPO-like loss on its own samples (adapters and heads move)."""
    torch.manual_seed(0)
    actor: Any = build_policy(SPEC, _config(kind, root))
    optim = torch.optim.Adam([p for p in actor.parameters() if p.requires_grad], lr=1e-2)
    obs = _obs()
    sample = actor.act(obs, generator=torch.Generator().manual_seed(0))
    for _ in range(2):
        logprobs, _, values = actor(obs, sample.actions, sample.forward_inputs)
        loss = -logprobs.sum() + (values - 1).square().mean()
        optim.zero_grad()
        loss.backward()
        optim.step()
    actor.eval()
    return actor


@pytest.mark.parametrize("kind", MODELS)
def test_adapters_sync_gives_the_rollout_the_merged_weights_and_the_actors_log_probs(
    kind: str, root: Path
) -> None:
    actor = _trained_actor(kind, root)
    config = actor.config
    state = actor.state_dict()

    # What moves: exactly the tensors that train; every adapter, nothing frozen.
    sent = rollout_state_dict(config, state, trainable=trainable_names(actor))
    requires_grad = {n for n, p in actor.named_parameters() if p.requires_grad}
    assert set(sent) == requires_grad
    assert {k for k in state if ".lora_A." in k or ".lora_B." in k} <= set(sent)
    assert not any(".base_layer." in k for k in sent)
    assert any(".value_head." in k for k in sent)
    if kind == "pi0":
        assert {"noise_head.weight", "model.action_out_proj.weight"} <= set(sent)
    assert sum(v.numel() for v in sent.values()) < sum(v.numel() for v in state.values()) / 2

    # The rollout of each mode, built as the rollout worker does, with another seed (fresh adapters and heads).
    torch.manual_seed(123)
    adapted = build_inference_policy(SPEC, config)
    assert any(".lora_A." in k for k in adapted.state_dict())
    load_rollout_weights(adapted, config, sent)
    merged_config = attrs.evolve(config, lora_sync="merged")
    plain = build_inference_policy(SPEC, merged_config)
    assert not any(".lora_" in k for k in plain.state_dict())
    load_rollout_weights(plain, merged_config, rollout_state_dict(merged_config, state))
    adapted.eval()
    plain.eval()

    # Effective weights: the adapters rollout's W0 + scale·B·A is the merged sync's W, everything else equal.
    effective = merge_lora_state(adapted.state_dict(), config.lora_scaling)
    expected = plain.state_dict()
    assert effective.keys() == expected.keys()
    for key, value in expected.items():
        torch.testing.assert_close(effective[key], value, atol=1e-6, rtol=0, msg=key)

    # The πRL contract: the adapters rollout computes what the actor computes, bit for bit (same layers,
    # same weights); the merged one agrees within float32 rounding of the folded weights.
    obs = _obs(seed=1)
    sample = actor.act(obs, generator=torch.Generator().manual_seed(2))
    again = adapted.act(obs, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(again.actions, sample.actions, atol=0, rtol=0)
    torch.testing.assert_close(again.logprobs, sample.logprobs, atol=0, rtol=0)
    with torch.no_grad():
        want = actor.evaluate(obs, sample.actions, sample.forward_inputs)
        got = adapted.evaluate(obs, sample.actions, sample.forward_inputs)
        folded = plain.evaluate(obs, sample.actions, sample.forward_inputs)
    for x, y, z in zip(got, want, folded, strict=True):
        torch.testing.assert_close(x, y, atol=0, rtol=0)
        torch.testing.assert_close(z, y, atol=1e-4, rtol=1e-4)
    # The received tensors are what moved the rollout: the base weights and fresh adapters act otherwise.
    torch.manual_seed(123)
    fresh = build_inference_policy(SPEC, config).eval()
    with torch.no_grad():
        assert not torch.allclose(fresh.evaluate(obs, sample.actions, sample.forward_inputs)[0], want[0])


# Run in a fresh interpreter: it joins a (one-rank, gloo) process group, which must not outlive the test.
_SHARDED = """
import sys, torch
from rlinf_models._fsdp import full_model_state_dict, init_distributed, shard_module
from rlinf_models.policies import build_policy, rollout_state_dict, trainable_names
sys.path.insert(0, sys.argv[1])
from test_models_lora_sync import SPEC, _config
config = _config("pi0", __import__("pathlib").Path(sys.argv[2]))
torch.manual_seed(0)
policy = build_policy(SPEC, config)
keys = trainable_names(policy)
plain = rollout_state_dict(config, full_model_state_dict(policy), trainable=keys)
policy = shard_module(policy, init_distributed(torch.device("cpu")))
assert isinstance(next(iter(policy.parameters())), torch.distributed.tensor.DTensor)
assert trainable_names(policy) == keys, sorted(keys ^ trainable_names(policy))[:4]
sharded = full_model_state_dict(policy, keys=keys)
assert sharded.keys() == keys and all(torch.equal(sharded[k], plain[k]) for k in keys)
assert rollout_state_dict(config, sharded, trainable=keys).keys() == plain.keys()
print("ok", len(keys))
"""


def test_adapters_sync_gathers_the_trainable_entries_of_an_fsdp2_actor(root: Path) -> None:
    """The actor worker's path under FSDP2: the trainable names survive ``fully_shard`` and
    ``full_model_state_dict(keys=...)`` gathers exactly those entries, equal to the unsharded policy's."""
    _checkpoint("pi0", root)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    out = subprocess.run(
        [sys.executable, "-c", _SHARDED, str(Path(__file__).parent), str(root)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith("ok "), out.stdout


def test_adapters_sync_refuses_tensors_that_do_not_fit_the_rollout(root: Path) -> None:
    config = _config("pi05", root)
    torch.manual_seed(0)
    actor = build_policy(SPEC, config)
    sent = rollout_state_dict(config, actor.state_dict(), trainable=trainable_names(actor))
    rollout = build_inference_policy(SPEC, config)
    lora_a = next(k for k in sent if ".lora_A." in k)
    with pytest.raises(ValueError, match=rf"lora_sync 'adapters'.*missing \['{lora_a}'\]"):
        load_rollout_weights(rollout, config, {k: v for k, v in sent.items() if k != lora_a})
    base = lora_a.replace("lora_A.default", "base_layer")
    with pytest.raises(ValueError, match=rf"unexpected \['{base}'\]"):
        load_rollout_weights(rollout, config, {**sent, base: actor.state_dict()[base]})
    # Built with another rank, the rollout's adapters do not fit.
    other = attrs.evolve(config, lora_rank=2)
    with pytest.raises(
        ValueError, match=r"lora_sync 'adapters': .*lora_A.* is \(4, \d+\) from the actor, \(2, "
    ):
        load_rollout_weights(build_inference_policy(SPEC, other), other, sent)
    with pytest.raises(ValueError, match="trainable=trainable_names"):
        rollout_state_dict(config, actor.state_dict())
    with pytest.raises(ValueError, match="lacks trainable tensors"):
        rollout_state_dict(config, {}, trainable=trainable_names(actor))


def test_merged_sync_is_the_default_and_the_rollout_runs_the_plain_model(root: Path) -> None:
    config = _config("smolvla", root, lora_sync="merged")
    assert PolicyConfig().lora_sync == "merged"
    rollout = build_inference_policy(SPEC, config)
    assert not rollout.config.is_lora and not any(".lora_" in k for k in rollout.state_dict())


def test_lora_sync_config_errors_name_the_key_and_the_values() -> None:
    with pytest.raises(
        ValueError, match=r"lora_sync 'adapters' .* needs is_lora: true.*'merged', 'adapters'"
    ):
        PolicyConfig(model_type="mlp", lora_sync="adapters")
    with pytest.raises(ValueError, match=r"'lora_sync' must be in \('merged', 'adapters'\)"):
        PolicyConfig(lora_sync="delta")  # type: ignore[arg-type]
