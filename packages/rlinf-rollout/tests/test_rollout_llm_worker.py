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
from rlinf_rollout.llm import LLMRolloutConfig, SamplingConfig

cloudpickle.register_pickle_by_value(sys.modules[__name__])
torch.set_num_threads(1)

TEXTS = ["What is 3 + 4?", "hello", "the answer is 12 apples and", "Compute 5 * 6 =", "cats"]


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


def _concat(parts: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    return [o for part in parts for o in part]


def _training_batch(outputs: list[dict[str, Any]], advantages: list[float]) -> dict[str, torch.Tensor]:
    """The actor's batch layout: prompts left-padded to end at column P, responses right-padded after it."""
    width = max(len(o["prompt_token_ids"]) for o in outputs)
    resp = max(len(o["token_ids"]) for o in outputs)
    ids = torch.zeros((len(outputs), width + resp), dtype=torch.long)
    mask = torch.zeros_like(ids)
    loss_mask = torch.zeros_like(ids)
    for r, o in enumerate(outputs):
        p, t = o["prompt_token_ids"], o["token_ids"]
        ids[r, width - len(p) : width + len(t)] = torch.tensor(p + t)
        mask[r, width - len(p) : width + len(t)] = 1
        loss_mask[r, width : width + len(t)] = 1
    adv = torch.tensor(advantages, dtype=torch.float32)[:, None] * loss_mask.float()
    return {"input_ids": ids, "attention_mask": mask, "loss_mask": loss_mask, "advantages": adv}


@pytest.mark.ray
def test_rollout_ranks_generate_with_the_weights_of_an_actor_step(cluster: Any, model_dir: Path) -> None:
    from rlinf_core.config import AlgorithmConfig
    from rlinf_models import OptimConfig
    from rlinf_models.llm import LLMActorConfig, LLMActorWorker
    from rlinf_rollout.llm import LLMRolloutWorker
    from rlinf_scheduler import NodePlacementStrategy
    from transformers import AutoTokenizer

    temperature = 0.9
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = [tokenizer.encode(t) for t in TEXTS]
    model_cfg = LLMModelConfig(model_path=str(model_dir))
    actor_cfg = LLMActorConfig(
        model=model_cfg,
        optim=OptimConfig(lr=5e-2, clip_grad=1.0),
        global_batch_size=4,
        micro_batch_size=2,
        temperature=temperature,  # the actor scores tokens as the rollout samples them
        torch_num_threads=1,
    )
    algorithm = AlgorithmConfig(adv_type="grpo", loss_type="actor", update_epoch=1)
    sampling = SamplingConfig(temperature=temperature, max_new_tokens=6, seed=0)
    rollout_cfg = LLMRolloutConfig(max_batch_size=2, sampling=sampling, enable_offload=True)
    actor = LLMActorWorker.create_group(actor_cfg, algorithm).launch(
        cluster, NodePlacementStrategy([0]), name="llm_actor"
    )
    rollout = LLMRolloutWorker.create_group(rollout_cfg, model_cfg).launch(
        cluster, NodePlacementStrategy([0, 0]), name="llm_rollout"
    )
    greedy = {"temperature": 0}
    try:
        assert rollout.get_model_version().wait(timeout=120) == [-1, -1]
        parts = rollout.generate(prompts, greedy).wait(timeout=120)
        assert [len(p) for p in parts] == [3, 2]  # contiguous shares of the 5 prompts, in rank order
        before = _concat(parts)
        assert [o["prompt_token_ids"] for o in before] == prompts
        assert set(before[0]) == {"prompt_token_ids", "token_ids", "logprobs", "text", "finish_reason"}

        # One PPO-style step of the real actor on sampled responses, then the versioned broadcast.
        first = _concat(rollout.generate(prompts[:4]).wait(timeout=120))
        metrics = actor.run_training(_training_batch(first, [1.0, -1.0, 1.0, -1.0])).wait(timeout=180)
        assert metrics[0]["actor/grad_norm"] > 0
        sent = actor.sync_model_to_rollout("llm_rollout")
        synced = rollout.sync_model_from_actor("llm_actor").wait(timeout=120)
        (version,) = sent.wait(timeout=120)
        assert version >= 1 and synced == [version, version]
        assert rollout.get_model_version().wait(timeout=60) == [version, version]

        after = _concat(rollout.generate(prompts, greedy).wait(timeout=120))
        assert [o["token_ids"] for o in after] != [o["token_ids"] for o in before]
        # The rollout's sampled-token logprobs are the actor's, on the new weights, at the same temperature.
        second = _concat(rollout.generate(prompts[:4], {"seed": 1}).wait(timeout=120))
        batch = _training_batch(second, [0.0] * 4)
        (scored,) = actor.compute_logprobs(batch).wait(timeout=120)
        width = batch["input_ids"].shape[1] - max(len(o["token_ids"]) for o in second)
        for r, o in enumerate(second):
            assert len(o["logprobs"]) == len(o["token_ids"]) >= 1
            actor_lp = scored["logprobs"][r, width : width + len(o["token_ids"])]
            torch.testing.assert_close(torch.tensor(o["logprobs"]), actor_lp, atol=1e-4, rtol=1e-4)

        # Explicit offload/onload around a generation: the same greedy outputs with the synced weights.
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
