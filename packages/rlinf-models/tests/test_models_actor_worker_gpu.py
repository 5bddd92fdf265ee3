"""EmbodiedActorWorker on CUDA (NCCL when there are two GPUs): skipped on machines without a GPU.

The flow and π0 cases feed the actor rollouts sampled on the CPU by the same weights (same seed), so the
first update's PPO ratio must be 1: the chain log-probs recomputed on the GPU equal the CPU rollout's.
"""

from __future__ import annotations

import os
import string
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import cloudpickle
import pytest
import torch
from rlinf_core.config import AlgorithmConfig
from rlinf_core.protocols import EnvSpec
from rlinf_models import EmbodiedActorConfig
from rlinf_models.policies import PolicyConfig, build_policy

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.ray,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

cloudpickle.register_pickle_by_value(sys.modules[__name__])

SPEC = EnvSpec((3,), "continuous", 2)
MODEL = PolicyConfig(hidden_sizes=(16,))


def _message(offset: int, e: int, t: int = 4) -> dict[str, Any]:
    g = torch.Generator().manual_seed(offset)
    return {
        "env_offset": offset,
        "obs": torch.randn(t, e, 3, generator=g),
        "actions": torch.randn(t, e, 1, 2, generator=g),
        "rewards": torch.rand(t, e, 1, generator=g),
        "dones": torch.zeros(t + 1, e, 1, dtype=torch.bool),
        "prev_logprobs": torch.full((t, e, 2), -1.0),
        "prev_values": torch.randn(t + 1, e, 1, generator=g),
    }


@pytest.fixture(scope="module")
def gpu_cluster() -> Iterator[Any]:
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    import ray
    from rlinf_scheduler import Cluster

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        with Cluster(num_nodes=1, interrupt_main_on_failure=False) as cluster:
            yield cluster
    finally:
        ray.shutdown()


def test_actor_trains_and_checkpoints_on_cuda(gpu_cluster: Any, tmp_path: Any) -> None:
    from rlinf_models import EmbodiedActorWorker
    from rlinf_scheduler import Channel, PackedPlacementStrategy

    ranks = min(2, torch.cuda.device_count())
    actor_cfg = EmbodiedActorConfig(model=MODEL, global_batch_size=8, micro_batch_size=4, seed=1)
    actor = EmbodiedActorWorker.create_group(actor_cfg, AlgorithmConfig(update_epoch=1), SPEC).launch(
        gpu_cluster, PackedPlacementStrategy(0, ranks - 1), name="gpu-actor"
    )
    ch = Channel.create("gpu-traj")
    for offset in (0, 2):
        for rank in range(ranks):
            ch.put(_message(offset, 2), key=rank)
    assert sum(actor.recv_rollout_batch(ch, 2, 60).wait(timeout=300)) == 4 * 4
    actor.compute_advantages_and_returns().wait(timeout=120)
    metrics = actor.run_training().wait(timeout=300)
    assert all(torch.isfinite(torch.tensor(m["actor/policy_loss"])) for m in metrics)
    actor.save_checkpoint(str(tmp_path)).wait(timeout=120)
    actor.load_checkpoint(str(tmp_path)).wait(timeout=120)
    assert actor.get_model_version().wait(timeout=60) == [1] * ranks


DATA = Path(__file__).parent / "data"


TASKS = ("pick up the black bowl and place it on the plate", "open the top drawer")


def _case(kind: str, tmp_path: Path) -> tuple[EnvSpec, PolicyConfig]:
    """The env spec and policy config of ``kind``: a flow MLP, or a tiny checkpoint of one of the VLA adapters."""
    if kind == "flow":
        spec = EnvSpec((5,), "continuous", 2, action_low=(-1.0, -1.0), action_high=(1.0, 1.0))
        cfg = PolicyConfig(
            model_type="flow",
            hidden_sizes=(32, 32),
            num_action_chunks=3,
            denoising_steps=4,
            add_value_head=True,
        )
        return spec, cfg
    pytest.importorskip("transformers")
    from rlinf_models.pi0.testing import LEROBOT_TINY_SPEC, write_char_tokenizer

    if kind in ("openvla", "openvla_oft"):  # LIBERO's cameras; the checkpoint holds its tokenizer
        from rlinf_models.openvla.testing import make_tiny_openvla, make_tiny_openvla_oft
        from rlinf_models.vla.testing import libero_spec

        make = make_tiny_openvla if kind == "openvla" else make_tiny_openvla_oft
        ckpt = make(tmp_path / kind, value_head_sizes=(16,))
        extra: dict[str, Any] = {"temperature": 0.8}
        if kind == "openvla_oft":
            extra |= {"num_action_chunks": 8, "unnorm_key": "libero_spatial_no_noops"}
        return libero_spec(64, TASKS), PolicyConfig(model_type=kind, model_path=str(ckpt), **extra)
    common: dict[str, Any] = {
        "image_keys": ("base", "wrist"),
        "num_action_chunks": 3,
        "denoising_steps": 4,
        "add_value_head": True,
    }
    if kind == "gr00t":
        from rlinf_models.gr00t.testing import make_tiny_gr00t

        paths = make_tiny_gr00t(tmp_path / "gr00t", state_dim=5, action_dim=7, seed=3)
        write_char_tokenizer(paths["tokenizer_path"], string.ascii_lowercase + " <>[]'/0123456789")
        cfg = PolicyConfig(
            model_type="gr00t",
            model_path=str(paths["model_path"]),
            tokenizer_path=str(paths["tokenizer_path"]),
            **common,
        )
        return LEROBOT_TINY_SPEC, cfg
    ckpt = DATA / ("lerobot_smolvla_tiny" if kind == "smolvla" else "lerobot_pi0_tiny") / "ckpt"
    cfg = PolicyConfig(
        model_type="smolvla" if kind == "smolvla" else "pi0",
        model_path=str(ckpt),
        tokenizer_path=str(write_char_tokenizer(tmp_path / "tok", string.ascii_lowercase + " \n")),
        norm_stats_path=str(ckpt / "policy_preprocessor_step_5_normalizer_processor.safetensors"),
        is_lora=kind == "pi0_lora",
        lora_rank=4,
        **common,
    )
    return LEROBOT_TINY_SPEC, cfg


def _obs(spec: EnvSpec, n: int, g: torch.Generator) -> Any:
    if spec.obs_dict is None:
        return torch.randn(n, *spec.obs_shape, generator=g)
    if "rgb" in spec.obs_dict:  # LIBERO's cameras
        from rlinf_models.vla.testing import libero_obs

        return libero_obs(n, 64, seed=int(torch.randint(2**31, (1,), generator=g)))
    from rlinf_models.pi0.testing import lerobot_tiny_obs

    return lerobot_tiny_obs(n, g)


def _rollout(policy: Any, spec: EnvSpec, offset: int, t: int, e: int) -> dict[str, Any]:
    """One env rank's trajectory message, sampled by ``policy`` on the CPU."""
    g = torch.Generator().manual_seed(offset)
    obs = _obs(spec, t * e, g)
    with torch.no_grad():
        out = policy.act(obs, generator=g)
    assert out.forward_inputs is not None

    def steps(v: torch.Tensor) -> torch.Tensor:
        return v.reshape(t, e, *v.shape[1:])

    chunks = out.actions.shape[1]
    return {
        "env_offset": offset,
        "obs": {k: steps(v) for k, v in obs.items()} if isinstance(obs, dict) else steps(obs),
        "actions": steps(out.actions),
        "rewards": torch.rand(t, e, chunks, generator=g),
        "dones": torch.zeros(t + 1, e, chunks, dtype=torch.bool),
        "prev_logprobs": steps(out.logprobs),
        "prev_values": torch.randn(t + 1, e, 1, generator=g),
        "forward_inputs": {k: steps(v) for k, v in out.forward_inputs.items()},
    }


@pytest.mark.parametrize("kind", ["flow", "pi0", "pi0_lora", "smolvla", "gr00t", "openvla", "openvla_oft"])
def test_policies_train_on_cuda_from_cpu_rollouts(gpu_cluster: Any, tmp_path: Path, kind: str) -> None:
    from rlinf_models import EmbodiedActorWorker
    from rlinf_scheduler import Channel, PackedPlacementStrategy

    spec, model = _case(kind, tmp_path)
    seed = 3
    torch.manual_seed(seed)  # the actor builds its policy the same way: its weights equal this CPU copy's
    policy = build_policy(spec, model).eval()
    t, e = 4, 2
    actor_cfg = EmbodiedActorConfig(model=model, global_batch_size=t * 2 * e, micro_batch_size=4, seed=seed)
    actor_cfg = attrs.evolve(actor_cfg, optim=attrs.evolve(actor_cfg.optim, lr=1e-4))
    actor = EmbodiedActorWorker.create_group(actor_cfg, AlgorithmConfig(update_epoch=1), spec).launch(
        gpu_cluster, PackedPlacementStrategy(0, 0), name=f"gpu-actor-{kind}"
    )
    ch = Channel.create(f"gpu-traj-{kind}")
    for offset in (0, e):
        ch.put(_rollout(policy, spec, offset, t, e), key=0)
    assert actor.recv_rollout_batch(ch, 2, 120).wait(timeout=300) == [t * 2 * e]
    actor.compute_advantages_and_returns().wait(timeout=120)
    (metrics,) = actor.run_training().wait(timeout=300)
    # One optimizer step over the whole batch: every ratio is taken before it, at the rollout's weights.
    assert abs(metrics["actor/ratio"] - 1.0) < 1e-3, metrics
    assert abs(metrics["actor/approx_kl"]) < 1e-5, metrics
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values() if isinstance(v, float))
    if kind == "pi0_lora":  # the rollout gets the merged weights: a plain π0 that acts as the trained actor
        from rlinf_models.policies import build_inference_policy

        ch_w = Channel.create("gpu-weights-lora")
        actor.publish_weights(ch_w, 1).wait(timeout=120)
        message = ch_w.get(key=0, timeout=60)
        rollout = build_inference_policy(spec, model)
        assert not any(".lora_" in k for k in message["state_dict"])
        rollout.load_state_dict(message["state_dict"])  # strict: the plain model's keys exactly
    actor.save_checkpoint(str(tmp_path / "ckpt")).wait(timeout=120)
    actor.load_checkpoint(str(tmp_path / "ckpt")).wait(timeout=120)
    assert actor.get_model_version().wait(timeout=60) == [1]
