"""LLMRolloutWorker with ``engine: vllm`` on Ray: weights broadcast by an actor drive vLLM's next generation.

Slow (a Ray cluster plus a vLLM server inside the rollout actor); skips without the vLLM venv
(``bash scripts/setup_vllm_cpu.sh``). Run:
``uv run pytest packages/rlinf-rollout/tests/test_rollout_vllm_worker.py -m slow -p no:xdist``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
import torch

pytest.importorskip("transformers")

from rlinf_models.llm import LLMModelConfig
from rlinf_models.llm.testing import make_tiny_model_dir
from rlinf_rollout.llm import LLMRolloutConfig, SamplingConfig
from rlinf_rollout.llm._vllm_options import VLLMOptions, default_vllm_python

cloudpickle.register_pickle_by_value(sys.modules[__name__])
torch.set_num_threads(1)


def _vllm_python() -> str | None:
    python = default_vllm_python()
    if python is None or not os.access(python, os.X_OK):
        return None
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
    try:
        ok = subprocess.run([python, "-c", probe], timeout=60, capture_output=True).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return None
    return python if ok else None


VLLM_PYTHON = _vllm_python()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.ray,
    pytest.mark.skipif(
        VLLM_PYTHON is None,
        reason="no Python with vLLM: run `bash scripts/setup_vllm_cpu.sh` (or set RLINF_VLLM_PYTHON)",
    ),
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # head_dim 32: vLLM's CPU attention has no kernel for the default tiny model's 16.
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny_vllm_worker"), hidden_size=128, num_layers=2)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    os.environ["RAY_ENABLE_UV_RUN_RUNTIME_ENV"] = "0"
    from rlinf_scheduler import Cluster

    c = Cluster(num_nodes=1, ray_address="local", num_cpus=2, interrupt_main_on_failure=False)
    try:
        yield c
    finally:
        c.shutdown()


def _actor_cls() -> type:
    from rlinf_models.llm import CausalLMPolicy, load_causal_lm
    from rlinf_scheduler import Worker

    class PolicyActor(Worker):
        """Actor stand-in: the actor's CausalLMPolicy (value head, tied embeddings), stepped by a perturbation."""

        def __init__(self, model_path: str) -> None:
            torch.set_num_threads(1)
            self.policy = CausalLMPolicy(
                load_causal_lm(LLMModelConfig(model_path=model_path)), add_value_head=True
            )

        def step(self, seed: int) -> None:
            gen = torch.Generator().manual_seed(seed)
            with torch.no_grad():
                for p in self.policy.parameters():
                    p.add_(0.3 * torch.randn(p.shape, generator=gen))

        def push(self, rollout_group: str, version: int) -> int:
            state = {k: v.detach().cpu() for k, v in self.policy.state_dict().items()}
            self.broadcast(
                {"version": version, "state_dict": state},
                [(self.group_name, 0), (rollout_group, [0])],
                src=(self.group_name, 0),
                timeout=120,
            )
            return version

        def logprobs(self, outputs: list[dict[str, Any]], temperature: float) -> list[list[float]]:
            result = []
            for o in outputs:
                ids = torch.tensor([o["prompt_token_ids"] + o["token_ids"]])
                with torch.no_grad():
                    lp = self.policy(ids, torch.ones_like(ids), temperature=temperature)["logprobs"]
                result.append(lp[0, len(o["prompt_token_ids"]) :].tolist())
            return result

    return PolicyActor


def _assert_match(outputs: list[dict[str, Any]], expected: list[list[float]]) -> None:
    for o, ref in zip(outputs, expected, strict=True):
        assert len(o["logprobs"]) == len(o["token_ids"]) >= 1
        torch.testing.assert_close(torch.tensor(o["logprobs"]), torch.tensor(ref), atol=2e-4, rtol=0)


def test_vllm_rollout_uses_the_weights_the_actor_broadcasts(cluster: Any, model_dir: Path) -> None:
    from rlinf_rollout.llm import LLMRolloutWorker
    from rlinf_scheduler import NodePlacementStrategy
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = [tokenizer.encode(t) for t in ("What is 3 + 4?", "hello", "Compute 5 * 6 =")]
    marker = f"vllm-worker-test-{uuid.uuid4().hex}"
    cfg = LLMRolloutConfig(
        engine="vllm",
        max_batch_size=4,
        sampling=SamplingConfig(max_new_tokens=8),
        enable_offload=True,  # collocated mode: weights arrive while the engine is offloaded
        vllm=VLLMOptions(
            python=VLLM_PYTHON,
            max_model_len=256,
            kv_cache_space_gib=0.25,
            startup_timeout_s=900,
            env={"RLINF_TEST_MARKER": marker},  # inherited by the server and every vLLM process
        ),
    )
    actor = (
        _actor_cls().create_group(str(model_dir)).launch(cluster, NodePlacementStrategy([0]), name="actor")
    )
    rollout = LLMRolloutWorker.create_group(cfg, LLMModelConfig(model_path=str(model_dir))).launch(
        cluster, NodePlacementStrategy([0]), name="rollout"
    )
    try:
        sampled = {"temperature": 0.8, "seed": 4}
        (before,) = rollout.generate(prompts, sampled).wait(timeout=900)
        (expected,) = actor.logprobs(before, 0.8).wait(timeout=120)
        _assert_match(before, expected)

        actor.step(7).wait(timeout=60)
        syncing = rollout.sync_model_from_actor("actor")
        assert actor.push("rollout", 1).wait(timeout=300) == [1]
        assert syncing.wait(timeout=300) == [1]
        assert rollout.get_model_version().wait(timeout=60) == [1]

        (after,) = rollout.generate(prompts, sampled).wait(timeout=300)
        (expected,) = actor.logprobs(after, 0.8).wait(timeout=120)
        _assert_match(after, expected)
        assert [o["token_ids"] for o in after] != [o["token_ids"] for o in before]
        assert _processes_with(marker), "the vLLM server and its processes carry the marker"
    finally:
        for group in (actor, rollout):
            group.shutdown()
    # The rollout actor is killed by the shutdown: its vLLM server and vLLM's processes must not outlive it.
    deadline = time.monotonic() + 60
    while _processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _processes_with(marker), "vLLM processes outlived the rollout worker"


def _processes_with(marker: str) -> list[int]:
    """Live (non-zombie) processes whose environment holds ``marker``."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if marker.encode() not in (proc / "environ").read_bytes():
                continue
            if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
        except (OSError, IndexError):
            continue
        found.append(int(proc.name))
    return found
