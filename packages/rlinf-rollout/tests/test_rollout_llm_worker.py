from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
import torch

pytest.importorskip("transformers")

from rlinf_models.llm import LLMModelConfig
from rlinf_models.llm.testing import make_tiny_model_dir
from rlinf_rollout.llm import LLMRolloutConfig, SamplingConfig, shard_bounds

cloudpickle.register_pickle_by_value(sys.modules[__name__])
torch.set_num_threads(1)

TEXTS = ["What is 3 + 4?", "hello", "the answer is 12 apples and", "Compute 5 * 6 =", "cats"]


def test_shard_bounds_cover_every_item_once() -> None:
    for n in range(0, 12):
        for world in range(1, 5):
            spans = [shard_bounds(n, r, world) for r in range(world)]
            assert [i for a, b in spans for i in range(a, b)] == list(range(n))
            sizes = [b - a for a, b in spans]
            assert max(sizes) - min(sizes) <= 1


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny_llm_worker"), hidden_size=64, num_layers=2)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    os.environ["RAY_ENABLE_UV_RUN_RUNTIME_ENV"] = "0"
    from rlinf_scheduler import Cluster

    c = Cluster(num_nodes=1, ray_address="local", num_cpus=2, interrupt_main_on_failure=False)
    try:
        yield c
    finally:
        c.shutdown()


def _fake_actor_cls() -> type:
    from rlinf_models.llm import CausalLMPolicy, load_causal_lm
    from rlinf_scheduler import Worker

    class FakeActor(Worker):
        """Actor stand-in: a CausalLMPolicy (with a value head) that perturbs and broadcasts its weights."""

        def __init__(self, model_path: str) -> None:
            torch.set_num_threads(1)
            model = load_causal_lm(LLMModelConfig(model_path=model_path))
            self.policy = CausalLMPolicy(model, add_value_head=True)

        def perturb(self, seed: int) -> None:
            gen = torch.Generator().manual_seed(seed)
            with torch.no_grad():
                for p in self.policy.parameters():
                    p.add_(0.5 * torch.randn(p.shape, generator=gen))

        def push(self, rollout_group: str, version: int, world_size: int) -> int:
            state = {k: v.detach().cpu() for k, v in self.policy.state_dict().items()}
            self.broadcast(
                {"version": version, "state_dict": state},
                [(self.group_name, 0), (rollout_group, list(range(world_size)))],
                src=(self.group_name, 0),
                timeout=60,
            )
            return version

        def logprobs(self, outputs: list[dict[str, Any]], temperature: float) -> list[list[float]]:
            """Logprobs of each output's tokens on the actor's layout (prompts left-, responses right-padded)."""
            width = max(len(o["prompt_token_ids"]) for o in outputs)
            resp = max(len(o["token_ids"]) for o in outputs)
            ids = torch.zeros((len(outputs), width + resp), dtype=torch.long)
            mask = torch.zeros_like(ids)
            for r, o in enumerate(outputs):
                p, t = o["prompt_token_ids"], o["token_ids"]
                ids[r, width - len(p) : width + len(t)] = torch.tensor(p + t)
                mask[r, width - len(p) : width + len(t)] = 1
            with torch.no_grad():
                lp = self.policy(ids, mask, temperature=temperature)["logprobs"]
            return [lp[r, width : width + len(o["token_ids"])].tolist() for r, o in enumerate(outputs)]

    return FakeActor


def _concat(parts: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    return [o for part in parts for o in part]


@pytest.mark.ray
def test_rollout_generates_with_the_weights_the_actor_broadcasts(cluster: Any, model_dir: Path) -> None:
    from rlinf_rollout.llm import LLMRolloutWorker
    from rlinf_scheduler import NodePlacementStrategy
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = [tokenizer.encode(t) for t in TEXTS]
    model_cfg = LLMModelConfig(model_path=str(model_dir))
    cfg = LLMRolloutConfig(max_batch_size=2, sampling=SamplingConfig(max_new_tokens=8), enable_offload=True)
    actor = (
        _fake_actor_cls()
        .create_group(str(model_dir))
        .launch(cluster, NodePlacementStrategy([0]), name="actor")
    )
    rollout = LLMRolloutWorker.create_group(cfg, model_cfg).launch(
        cluster, NodePlacementStrategy([0, 0]), name="rollout"
    )
    try:
        assert rollout.get_model_version().wait(timeout=120) == [-1, -1]
        greedy = {"temperature": 0}
        parts = rollout.generate(prompts, greedy).wait(timeout=120)
        assert [len(p) for p in parts] == [3, 2]  # contiguous shares of the 5 prompts
        before = _concat(parts)
        assert [o["prompt_token_ids"] for o in before] == prompts
        assert set(before[0]) == {"prompt_token_ids", "token_ids", "logprobs", "text", "finish_reason"}

        actor.perturb(7).wait(timeout=60)
        syncing = rollout.sync_model_from_actor("actor")
        assert actor.push("rollout", 3, 2).wait(timeout=120) == [3]
        assert syncing.wait(timeout=120) == [3, 3]
        assert rollout.get_model_version().wait(timeout=60) == [3, 3]

        after = _concat(rollout.generate(prompts, greedy).wait(timeout=120))
        assert [o["token_ids"] for o in after] != [o["token_ids"] for o in before]
        (expected,) = actor.logprobs(after, 1.0).wait(timeout=60)  # greedy: logprobs at temperature 1
        for o, ref in zip(after, expected, strict=True):
            torch.testing.assert_close(torch.tensor(o["logprobs"]), torch.tensor(ref), atol=1e-4, rtol=1e-4)

        sampled = _concat(rollout.generate(prompts, {"temperature": 0.8, "seed": 4}).wait(timeout=120))
        (expected,) = actor.logprobs(sampled, 0.8).wait(timeout=60)
        for o, ref in zip(sampled, expected, strict=True):
            assert len(o["logprobs"]) == len(o["token_ids"]) >= 1
            torch.testing.assert_close(torch.tensor(o["logprobs"]), torch.tensor(ref), atol=1e-4, rtol=1e-4)

        # Explicit offload/onload around a generation: same greedy outputs with the synced weights.
        rollout.offload().wait(timeout=60)
        again = _concat(rollout.generate(prompts, greedy).wait(timeout=120))
        assert [o["token_ids"] for o in again] == [o["token_ids"] for o in after]
        for o, ref in zip(again, after, strict=True):
            assert o["logprobs"] == pytest.approx(ref["logprobs"], abs=1e-5)
        rollout.onload().wait(timeout=60)
        (alone,) = rollout.execute_on(1).generate(prompts[:2], greedy, shard=False).wait(timeout=120)
        assert [o["token_ids"] for o in alone] == [o["token_ids"] for o in after[:2]]
    finally:
        for group in (actor, rollout):
            group.shutdown()
