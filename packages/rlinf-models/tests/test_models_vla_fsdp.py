"""Every VLA policy trains under FSDP2: two gloo ranks make the one-rank PPO update, and the state gathers.

A VLA policy calls its network's ``encode_prefix`` / ``expert_output`` / ``value`` ... rather than ``forward``;
``shard_module`` registers those (``FSDP_FORWARD_METHODS``) so the network's parameters are gathered around
them. For each tiny VLA (π0 with Flow-Noise, SmolVLA, GR00T, OpenVLA, OpenVLA-OFT): one
``EmbodiedPPOTrainer.train`` on one rank (plain module, all envs) and on two ranks (FSDP2 on gloo, half the
envs each, as the actor worker splits them) from the same rollout give the same parameters, and the full
state dict gathers every entry. OpenVLA-OFT's deterministic ``act`` (its L1 head) runs on the sharded policy,
and rank 0 exports a sharded policy in its published layout (``export_pretrained``, as a checkpoint does).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

from rlinf_core.config import AlgorithmConfig
from rlinf_models import EmbodiedActorConfig, OptimConfig
from rlinf_models._fsdp import full_model_state_dict, init_distributed, shard_module
from rlinf_models.embodied import EmbodiedPPOTrainer
from rlinf_models.policies import PolicyConfig, build_policy, export_pretrained
from rlinf_models.vla.testing import libero_spec

KINDS = ["pi0", "smolvla", "gr00t", "openvla", "openvla_oft"]
# LIBERO's two cameras, an 8-D state, 7-D actions: what every tiny checkpoint of rlinf_models.*.testing fits.
SPEC = libero_spec(32)
T, E = 2, 4  # rollout steps x envs: 8 samples, 4 per rank


def write_checkpoint(kind: str, root: Path) -> dict[str, str]:
    """The tiny checkpoint's ``actor.model`` paths."""
    out = root / kind
    if kind == "openvla":
        from rlinf_models.openvla.testing import make_tiny_openvla

        return {"model_path": str(make_tiny_openvla(out, value_head_sizes=(16,)))}
    if kind == "openvla_oft":
        from rlinf_models.openvla.testing import make_tiny_openvla_oft

        return {"model_path": str(make_tiny_openvla_oft(out, value_head_sizes=(16,)))}
    if kind == "gr00t":
        from rlinf_models.gr00t.testing import make_tiny_gr00t

        paths = make_tiny_gr00t(out)
    elif kind == "smolvla":
        from rlinf_models.smolvla.testing import make_tiny_smolvla

        paths = make_tiny_smolvla(out)
    else:
        from rlinf_models.pi0.testing import make_tiny_pi0

        paths = make_tiny_pi0(out)
    return {k: str(v) for k, v in paths.items()}


def policy_config(kind: str, paths: dict[str, str]) -> PolicyConfig:
    extra: dict[str, Any] = {"num_action_chunks": 2, "denoising_steps": 2}
    if kind == "pi0":
        extra["noise_method"] = "flow_noise"  # the noise head (a second child unit of the policy) trains too
    elif kind == "openvla":
        extra = {}
    elif kind == "openvla_oft":
        extra = {"num_action_chunks": 8, "unnorm_key": "libero_spatial_no_noops"}
    return PolicyConfig(model_type=kind, **paths, **extra)


def _rollout(policy: Any) -> dict[str, Any]:
    """A ``[T, E]`` rollout batch of the policy's own samples (the same on every rank)."""
    g = torch.Generator().manual_seed(1)
    n = T * E
    obs = {
        "rgb": torch.randint(0, 256, (n, 32, 32, 3), generator=g, dtype=torch.uint8),
        "wrist_rgb": torch.randint(0, 256, (n, 32, 32, 3), generator=g, dtype=torch.uint8),
        "state": torch.randn(n, 8, generator=g) * 0.3,
        "task_index": torch.tensor([[i % 2] for i in range(n)], dtype=torch.int16),
    }
    out = policy.act(obs, generator=torch.Generator().manual_seed(2))
    c = out.actions.shape[1]
    return {
        "obs": {k: v.view(T, E, *v.shape[1:]) for k, v in obs.items()},
        "actions": out.actions.view(T, E, *out.actions.shape[1:]),
        "rewards": torch.rand(T, E, c, generator=g),
        "dones": torch.zeros(T + 1, E, c, dtype=torch.bool),
        "prev_logprobs": out.logprobs.reshape(T, E, -1),
        "prev_values": torch.randn(T + 1, E, 1, generator=g),
        "versions": torch.zeros(T, E, dtype=torch.long),
        "forward_inputs": {k: v.view(T, E, *v.shape[1:]) for k, v in (out.forward_inputs or {}).items()},
    }


def _envs(batch: Any, rank: int, world: int) -> Any:
    """Rank ``rank``'s envs ``[rank·E/W, (rank+1)·E/W)`` of every ``[T(+1), E, ...]`` entry (the worker's split)."""
    if isinstance(batch, dict):
        return {k: _envs(v, rank, world) for k, v in batch.items()}
    per = E // world
    return batch[:, rank * per : (rank + 1) * per]


def update(kind: str, paths: dict[str, str], rank: int, world: int) -> dict[str, torch.Tensor]:
    """One PPO update on ``world`` ranks (FSDP2 on gloo when more than one); the full state dict (rank 0)."""
    torch.manual_seed(0)
    policy: Any = build_policy(SPEC, policy_config(kind, paths))
    batch = _rollout(policy)
    reduce_sum = None
    if world > 1:
        policy = shard_module(policy, init_distributed(torch.device("cpu")))
        assert all(isinstance(p, torch.distributed.tensor.DTensor) for p in policy.parameters())

        def reduce_sum(x: torch.Tensor) -> torch.Tensor:
            out = x.detach().clone()
            torch.distributed.all_reduce(out)
            return out

    # adam_eps well above float32 noise: a near-zero gradient's sign must not decide a whole lr step.
    actor = EmbodiedActorConfig(
        global_batch_size=T * E, micro_batch_size=2, optim=OptimConfig(lr=1e-2, adam_eps=1e-3)
    )
    trainer = EmbodiedPPOTrainer(
        policy, AlgorithmConfig(update_epoch=1), actor, world_size=world, rank=rank, reduce_sum=reduce_sum
    )
    metrics = trainer.train(trainer.compute_advantages_and_returns(_envs(batch, rank, world)))
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values()), metrics
    return full_model_state_dict(policy)


# A fresh interpreter per rank: each joins the two-rank gloo group, which must not outlive the test.
_RANK = """
import json, sys, torch
torch.set_num_threads(1)
sys.path.insert(0, sys.argv[1])
from test_models_vla_fsdp import update
state = update(sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4]), 2)
if int(sys.argv[4]) == 0:
    torch.save(state, sys.argv[5])
"""


def _two_ranks(kind: str, paths: dict[str, str], out: Path, script: str = _RANK) -> dict[str, torch.Tensor]:
    import json

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(2):
        env = {
            **os.environ,
            "RANK": str(rank),
            "WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
        args = [sys.executable, "-c", script, str(Path(__file__).parent), kind, json.dumps(paths), str(rank)]
        procs.append(
            subprocess.Popen(
                [*args, str(out)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    for rank, proc in enumerate(procs):
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"rank {rank}:\n{err[-4000:]}"
    state: dict[str, torch.Tensor] = torch.load(out)
    return state


@pytest.mark.slow  # ~1-2.5 min per model on two shared cores
@pytest.mark.timeout(900)
@pytest.mark.parametrize("kind", KINDS)
def test_two_fsdp2_ranks_make_the_one_rank_update(kind: str, tmp_path: Path) -> None:
    paths = write_checkpoint(kind, tmp_path)
    torch.manual_seed(0)
    initial = build_policy(SPEC, policy_config(kind, paths)).state_dict()
    one = update(kind, paths, rank=0, world=1)
    two = _two_ranks(kind, paths, tmp_path / "two_ranks.pt")

    assert two.keys() == one.keys() == initial.keys()
    moved = max(float((one[k] - initial[k]).abs().max()) for k in one if one[k].is_floating_point())
    assert moved > 1e-3  # the update changed the policy (so equality below is not the initial weights')
    for key, value in one.items():
        torch.testing.assert_close(two[key], value, atol=1e-5, rtol=0, msg=key)


def _obs(n: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    return {
        "rgb": torch.randint(0, 256, (n, 32, 32, 3), generator=g, dtype=torch.uint8),
        "wrist_rgb": torch.randint(0, 256, (n, 32, 32, 3), generator=g, dtype=torch.uint8),
        "state": torch.randn(n, 8, generator=g) * 0.3,
        "task_index": torch.tensor([[i % 2] for i in range(n)], dtype=torch.int16),
    }


def act_and_export(
    kind: str, paths: dict[str, str], rank: int, world: int, export: str | None = None
) -> dict[str, torch.Tensor]:
    """The deterministic actions and values of the policy (its weights nudged off the checkpoint's) on ``world``
    ranks; with ``export``, rank 0 also exports it there as a checkpoint does, from the gathered full state."""
    torch.manual_seed(0)
    policy: Any = build_policy(SPEC, policy_config(kind, paths))
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():  # the export must hold these weights, not model_path's
        for p in policy.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    obs = _obs(E)
    sample = policy.act(obs, generator=torch.Generator().manual_seed(0))
    if world > 1:
        policy = shard_module(policy, init_distributed(torch.device("cpu")))
    # The training forward first, as in the actor: FSDP2 makes the first unit whose forward runs its root, which
    # it leaves gathered; were that the network (through act's registered methods), a direct call of its head
    # would see gathered parameters and pass unnoticed.
    with torch.no_grad():
        policy(obs, sample.actions, sample.forward_inputs)
    out = policy.act(obs, deterministic=True)
    full = full_model_state_dict(policy)
    if rank == 0 and export is not None:
        rng = torch.get_rng_state()
        export_pretrained(policy, SPEC, policy_config(kind, paths), export, full)
        # The export's fresh unsharded policy drew on no RNG state the run keeps.
        assert torch.equal(torch.get_rng_state(), rng)
    return {"actions": out.actions, "values": out.values, **{f"state/{k}": v for k, v in full.items()}}


_ACT_RANK = """
import json, sys, torch
torch.set_num_threads(1)
sys.path.insert(0, sys.argv[1])
from test_models_vla_fsdp import act_and_export
rank = int(sys.argv[4])
out = act_and_export(sys.argv[2], json.loads(sys.argv[3]), rank, 2, sys.argv[5] + ".export")
if rank == 0:
    torch.save(out, sys.argv[5])
"""


@pytest.mark.slow  # ~1 min on two shared cores
@pytest.mark.timeout(900)
def test_oft_deterministic_act_and_the_pretrained_export_on_two_fsdp2_ranks(tmp_path: Path) -> None:
    """The L1 head's actions of the sharded policy are the plain policy's (the head is called through a
    registered forward method of the network, not directly), and the export a checkpoint writes from the sharded
    policy loads as ``actor.model.model_path`` with the trained weights."""
    import attrs

    kind = "openvla_oft"
    paths = write_checkpoint(kind, tmp_path)
    one = act_and_export(kind, paths, rank=0, world=1)
    out = tmp_path / "two_ranks.pt"
    two = _two_ranks(kind, paths, out, _ACT_RANK)
    torch.testing.assert_close(two["actions"], one["actions"], atol=1e-5, rtol=0)
    torch.testing.assert_close(two["values"], one["values"], atol=1e-5, rtol=0)
    # The L1 head's continuous actions, not the decoded tokens' (bin centres).
    policy: Any = build_policy(SPEC, policy_config(kind, paths))
    tokens = policy.act(_obs(E), deterministic=False, generator=torch.Generator().manual_seed(0))
    assert not torch.allclose(one["actions"], tokens.actions)

    export = Path(str(out) + ".export")
    assert (export / "config.json").is_file() and any(export.glob("action_head--*"))
    reloaded = build_policy(
        SPEC, attrs.evolve(policy_config(kind, paths), model_path=str(export))
    ).state_dict()
    saved = {k[len("state/") :]: v for k, v in two.items() if k.startswith("state/")}
    initial = policy.state_dict()
    assert reloaded.keys() == saved.keys()
    for key, value in saved.items():
        torch.testing.assert_close(reloaded[key], value, atol=0, rtol=0, msg=key)
    assert any(not torch.equal(saved[k], initial[k]) for k in saved if saved[k].is_floating_point())
