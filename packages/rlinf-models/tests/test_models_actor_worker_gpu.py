"""EmbodiedActorWorker on CUDA (NCCL when there are two GPUs): skipped on machines without a GPU."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import cloudpickle
import pytest
import torch
from rlinf_core.config import AlgorithmConfig
from rlinf_core.protocols import EnvSpec
from rlinf_models import EmbodiedActorConfig
from rlinf_models.policies import PolicyConfig

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
