"""LLMActorWorker on Ray: 2 FSDP2 ranks (gloo) make the 1-rank update; weight sync; cross-world-size checkpoint."""

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

from rlinf_core.config import AlgorithmConfig
from rlinf_models import OptimConfig
from rlinf_models.llm import CausalLMPolicy, LLMActorConfig, LLMActorWorker, LLMModelConfig, load_causal_lm
from rlinf_models.llm.testing import local_llm_actor, make_tiny_model_dir
from rlinf_scheduler import (
    Cluster,
    PackedPlacementStrategy,
    Worker,
    WorkerGroup,
)

pytestmark = pytest.mark.ray

cloudpickle.register_pickle_by_value(sys.modules[__name__])

# PPO with a critic and a KL penalty: the value head and the frozen reference model are sharded too.
ALGO = AlgorithmConfig(
    adv_type="gae",
    loss_type="actor_critic",
    update_epoch=2,
    clip_ratio_low=0.2,
    clip_ratio_high=0.28,
    kl_beta=0.05,
    kl_penalty="low_var_kl",
)
TEMPERATURE = 0.8


def _cfg(model_dir: Path, seed: int = 3, *, lora: bool = False) -> LLMActorConfig:
    return LLMActorConfig(
        model=LLMModelConfig(model_path=str(model_dir), add_value_head=True, is_lora=lora, lora_rank=4),
        optim=OptimConfig(lr=5e-3, clip_grad=1.0),
        global_batch_size=8,
        micro_batch_size=2,
        seed=seed,
        temperature=TEMPERATURE,
        torch_num_threads=1,
    )


def _batch(seed: int, n: int = 16, p: int = 5, r: int = 4) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 500, (n, p + r), generator=g)
    attn = torch.ones(n, p + r, dtype=torch.long)
    attn[::3, :2] = 0  # some left padding
    attn[1::4, -1] = 0  # some right padding
    ids[attn == 0] = 2
    loss_mask = attn.clone()
    loss_mask[:, :p] = 0
    adv = torch.randn(n, 1, generator=g) * loss_mask.float()
    returns = torch.randn(n, 1, generator=g) * loss_mask.float()
    return {
        "input_ids": ids,
        "attention_mask": attn,
        "loss_mask": loss_mask,
        "advantages": adv,
        "returns": returns,
    }


class LocalGroup:
    """A one-rank actor in the test process, answering like a WorkerGroup call (a list with one result)."""

    def __init__(self, cfg: LLMActorConfig, algorithm: AlgorithmConfig) -> None:
        self.worker = local_llm_actor(cfg, algorithm)

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.worker, name)
        return lambda *args, **kwargs: [method(*args, **kwargs)]


class StandInRollout(Worker):
    """The rollout side of the weight-sync contract: a plain HF model loading the broadcast state dict."""

    def __init__(self, model_dir: str) -> None:
        torch.set_num_threads(1)
        self.model = load_causal_lm(LLMModelConfig(model_path=model_dir))
        self.version = -1

    def sync_model_from_actor(self, actor_group_name: str) -> int:
        msg = self.broadcast(
            None,
            groups=[(actor_group_name, 0), (self.group_name, list(range(self.world_size)))],
            src=(actor_group_name, 0),
            timeout=120,
        )
        self.model.load_state_dict(msg["state_dict"], strict=True)
        self.version = msg["version"]
        return self.version

    def logprobs(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        with torch.no_grad():
            policy = CausalLMPolicy(self.model)
            return policy(batch["input_ids"], batch["attention_mask"], temperature=TEMPERATURE)["logprobs"]


@pytest.fixture(scope="module")
def groups(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    model_dir = make_tiny_model_dir(tmp_path_factory.mktemp("tiny") / "m", arch="llama", seed=5)
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    import ray

    torch.set_num_threads(1)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        with Cluster(num_nodes=1, simulated_accelerators_per_node=4, interrupt_main_on_failure=False) as c:
            groups = {
                "a1": LocalGroup(_cfg(model_dir), ALGO),
                "a2": LLMActorWorker.create_group(_cfg(model_dir), ALGO).launch(
                    c, PackedPlacementStrategy(0, 1), name="a2"
                ),
                "l1": LocalGroup(_cfg(model_dir, lora=True), ALGO),
                "l2": LLMActorWorker.create_group(_cfg(model_dir, lora=True), ALGO).launch(
                    c, PackedPlacementStrategy(0, 1), name="l2"
                ),
                "ro": StandInRollout.create_group(str(model_dir)).launch(
                    c, PackedPlacementStrategy(2, 2), name="ro"
                ),
            }
            # Five worker processes start at once: minutes on a loaded 2-core box, not the tests' call timeouts.
            for group in groups.values():
                if isinstance(group, WorkerGroup):
                    group.wait_ready(timeout=300)
            yield groups
    finally:
        ray.shutdown()


def _sync(actor: WorkerGroup, ro: WorkerGroup) -> int:
    sent = actor.sync_model_to_rollout("ro")
    got = ro.sync_model_from_actor(actor.name).wait(timeout=120)
    versions = sent.wait(timeout=120)
    assert got == versions[:1] * len(got)
    return versions[0]


def _wait(result: Any) -> list[Any]:
    """A group call's results (a LocalGroup answers with the list directly)."""
    return result if isinstance(result, list) else result.wait(timeout=300)


def _all_same(results: list[Any]) -> Any:
    for r in results[1:]:
        assert r.keys() == results[0].keys()
        for k in r:
            if isinstance(r[k], torch.Tensor):
                assert torch.equal(r[k], results[0][k]), k
            else:
                assert r[k] == results[0][k], k
    return results[0]


def test_two_fsdp_ranks_make_the_same_update_and_sync_it(groups: dict[str, Any], tmp_path: Path) -> None:
    a1, a2, ro = groups["a1"], groups["a2"], groups["ro"]
    batch = _batch(seed=0)
    x1 = _all_same(_wait(a1.compute_logprobs(batch)))
    x2 = _all_same(a2.compute_logprobs(batch).wait(timeout=120))
    assert set(x2) == {"logprobs", "ref_logprobs", "values"}
    for key in x1:  # each rank scored half, all-gathered
        torch.testing.assert_close(x2[key], x1[key], rtol=1e-5, atol=1e-5, msg=key)
    lp2 = x2["logprobs"]

    m1 = _all_same(_wait(a1.run_training(batch)))
    m2 = _all_same(a2.run_training(batch).wait(timeout=300))
    assert m1["actor/num_optimizer_steps"] == m2["actor/num_optimizer_steps"] == 4.0
    for key in m1:
        assert m2[key] == pytest.approx(m1[key], rel=1e-3, abs=1e-5), key

    valid = batch["loss_mask"].bool()  # the positions compute_logprobs scores
    after1 = _wait(a1.compute_logprobs(batch))[0]["logprobs"]
    after2 = _all_same(a2.compute_logprobs(batch).wait(timeout=120))["logprobs"]
    torch.testing.assert_close(after2[valid], after1[valid], rtol=1e-3, atol=1e-4)  # 2 ranks ≈ 1 rank
    assert (after2[valid] - lp2[valid]).abs().max() > 1e-2

    # Weight sync: the rollout's next scores use the new weights, exactly the actor's.
    assert _sync(a2, ro) == 1
    after_ro2 = ro.logprobs(batch).wait(timeout=120)[0]
    torch.testing.assert_close(after_ro2[valid], after2[valid], rtol=1e-5, atol=1e-5)

    # A 2-rank checkpoint loads into the 1-rank group: same weights and counters.
    a2.save_checkpoint(str(tmp_path / "ck")).wait(timeout=120)
    a1.load_checkpoint(str(tmp_path / "ck"))
    assert a1.get_model_version() == [1]
    lp_loaded = _wait(a1.compute_logprobs(batch))[0]["logprobs"]
    torch.testing.assert_close(lp_loaded[valid], after_ro2[valid], rtol=1e-5, atol=1e-5)
    # The reference model is frozen until update_reference_model (which copies the sharded policy into it).
    ref = _all_same(a2.compute_logprobs(batch).wait(timeout=120))
    torch.testing.assert_close(ref["ref_logprobs"], lp2)
    a2.update_reference_model().wait(timeout=120)
    ref = _all_same(a2.compute_logprobs(batch).wait(timeout=120))
    torch.testing.assert_close(ref["ref_logprobs"], ref["logprobs"])
    # SFT on two ranks reports the global token-mean loss.
    sft = {k: batch[k] for k in ("input_ids", "attention_mask", "loss_mask")}
    s1 = a1.run_sft(sft)[0]
    s2 = _all_same(a2.run_sft(sft).wait(timeout=120))
    assert s2["sft/loss"] == pytest.approx(s1["sft/loss"], rel=1e-4)
    assert s2["sft/grad_norm"] == pytest.approx(s1["sft/grad_norm"], rel=1e-3)


def test_lora_on_two_fsdp_ranks_matches_one_and_syncs_merged_weights(groups: dict[str, Any]) -> None:
    """FSDP2 shards a model whose base weights are frozen and whose adapters train; the rollout gets W + sBA."""
    l1, l2, ro = groups["l1"], groups["l2"], groups["ro"]
    batch = _batch(seed=7)
    m1 = _all_same(_wait(l1.run_training(batch)))
    m2 = _all_same(l2.run_training(batch).wait(timeout=300))
    for key in m1:
        assert m2[key] == pytest.approx(m1[key], rel=1e-3, abs=1e-5), key
    valid = batch["loss_mask"].bool()
    after1 = _wait(l1.compute_logprobs(batch))[0]["logprobs"]
    after2 = _all_same(l2.compute_logprobs(batch).wait(timeout=120))["logprobs"]
    torch.testing.assert_close(after2[valid], after1[valid], rtol=1e-3, atol=1e-4)
    _sync(l2, ro)
    torch.testing.assert_close(
        ro.logprobs(batch).wait(timeout=120)[0][valid], after2[valid], rtol=1e-5, atol=1e-5
    )
