from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from rlinf_core.config import AlgorithmConfig
from rlinf_core.protocols import EnvSpec
from rlinf_models import EmbodiedActorConfig, OptimConfig
from rlinf_models.embodied import EmbodiedPPOTrainer
from rlinf_models.policies import PolicyConfig, build_policy

SPEC = EnvSpec((3,), "discrete", 1, num_actions=2)


def _batch(t: int = 8, e: int = 4, c: int = 1, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    dones = torch.zeros(t + 1, e, c, dtype=torch.bool)
    dones[min(5, t), 1] = True
    return {
        "obs": torch.randn(t, e, 3, generator=g),
        "actions": torch.randint(0, 2, (t, e, c), generator=g),
        "rewards": torch.rand(t, e, c, generator=g),
        "dones": dones,
        "prev_logprobs": torch.full((t, e, c), -0.69),
        "prev_values": torch.randn(t + 1, e, 1, generator=g),
    }


def _trainer(**alg: object) -> EmbodiedPPOTrainer:
    torch.manual_seed(0)
    policy = build_policy(SPEC, PolicyConfig(hidden_sizes=(16,)))
    actor = EmbodiedActorConfig(global_batch_size=16, micro_batch_size=8, optim=OptimConfig(lr=1e-2))
    return EmbodiedPPOTrainer(policy, AlgorithmConfig(update_epoch=2, **alg), actor)  # type: ignore[arg-type]


def test_gae_advantages_and_update_change_the_policy() -> None:
    trainer = _trainer()
    batch = trainer.compute_advantages_and_returns(_batch())
    assert batch["advantages"].shape == (8, 4, 1) and batch["returns"].shape == (8, 4, 1)
    before = [p.detach().clone() for p in trainer.policy.parameters()]
    metrics = trainer.train(batch)
    assert trainer.optimizer_steps == 2 * (32 // 16)
    assert all(np.isfinite(v) for v in metrics.values())
    for key in (
        "actor/policy_loss",
        "critic/value_loss",
        "actor/grad_norm",
        "actor/entropy_loss",
        "actor/lr",
    ):
        assert key in metrics, sorted(metrics)
    assert not any(key.startswith("__sum__") for key in metrics), sorted(metrics)
    assert np.isfinite(metrics["critic/explained_variance"]) and metrics["critic/explained_variance"] <= 1.0
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.policy.parameters(), strict=True))


def test_state_dict_round_trip_reproduces_the_next_update() -> None:
    a = _trainer()
    batch = a.compute_advantages_and_returns(_batch())
    a.train(batch)
    state = copy.deepcopy(a.state_dict())
    b = _trainer()
    b.load_state_dict(state)
    ma = a.train(batch)
    mb = b.train(batch)
    assert ma == mb
    for pa, pb in zip(a.policy.parameters(), b.policy.parameters(), strict=True):
        torch.testing.assert_close(pa, pb)


def test_bad_batches_are_explained() -> None:
    trainer = _trainer()
    bad = _batch()
    bad["dones"] = bad["dones"][:-1]
    with pytest.raises(ValueError, match=r"dones must be \[9, 4, 1\]"):
        trainer.compute_advantages_and_returns(bad)
    with pytest.raises(ValueError, match="missing"):
        trainer.compute_advantages_and_returns({"rewards": torch.zeros(2, 2, 1)})
    small = trainer.compute_advantages_and_returns(_batch(t=2, e=4))
    with pytest.raises(
        ValueError, match=r"8 samples on this rank but actor\.global_batch_size / world_size = 16"
    ):
        trainer.train(small)


def test_grpo_without_critic() -> None:
    torch.manual_seed(0)
    policy = build_policy(SPEC, PolicyConfig(hidden_sizes=(16,), add_value_head=False))
    alg = AlgorithmConfig(adv_type="grpo", loss_type="actor", group_size=2, update_epoch=1)
    trainer = EmbodiedPPOTrainer(policy, alg, EmbodiedActorConfig(global_batch_size=16, micro_batch_size=16))
    batch = _batch()
    batch["loss_mask"] = torch.ones(8, 4, 1, dtype=torch.bool)
    batch["loss_mask_sum"] = torch.full((8, 4, 1), 8.0)
    batch = trainer.compute_advantages_and_returns(batch)
    assert "returns" not in batch
    metrics = trainer.train(batch)
    assert "actor/policy_loss" in metrics and "critic/value_loss" not in metrics


def test_loss_agg_func_reaches_the_loss() -> None:
    # With 2 actions per chunk, summing per row (seq-mean-token-sum) gives about twice token-mean's loss.
    losses = []
    for agg in ("token-mean", "seq-mean-token-sum"):
        torch.manual_seed(0)
        policy = build_policy(
            SPEC, PolicyConfig(hidden_sizes=(16,), num_action_chunks=2, add_value_head=False)
        )
        alg = AlgorithmConfig(
            adv_type="grpo",
            loss_type="actor",
            group_size=2,
            update_epoch=1,
            loss_agg_func=agg,
            reward_type="action_level",
            logprob_type="action_level",
        )
        trainer = EmbodiedPPOTrainer(
            policy, alg, EmbodiedActorConfig(global_batch_size=32, micro_batch_size=32)
        )
        batch = _batch(c=2)
        batch["prev_logprobs"] = torch.full((8, 4, 2), -0.69)
        batch["loss_mask"] = torch.ones(8, 4, 2, dtype=torch.bool)
        batch["loss_mask_sum"] = torch.full((8, 4, 2), 8.0)
        batch = trainer.compute_advantages_and_returns(batch)
        losses.append(trainer.train(batch)["actor/policy_loss"])
    assert losses[1] == pytest.approx(2 * losses[0], rel=1e-4)


def test_proximal_logprobs_are_recomputed_for_stale_samples_only() -> None:
    trainer = _trainer(loss_type="decoupled_actor_critic")
    trainer.train_steps = 3
    batch = _batch()
    batch["versions"] = torch.full((8, 4), 3, dtype=torch.int64)
    batch["versions"][:, 2:] = 1  # envs 2-3: chosen by weights two updates old
    trainer.compute_proximal_logprobs(batch)
    prox = batch["proximal_logprobs"]
    assert prox.shape == batch["prev_logprobs"].shape
    assert torch.equal(prox[:, :2], batch["prev_logprobs"][:, :2])  # current version: the behaviour log-probs
    with torch.no_grad():
        logprobs, _, _ = trainer.policy(
            batch["obs"][:, 2:].reshape(16, 3), batch["actions"][:, 2:].reshape(16, 1)
        )
    torch.testing.assert_close(prox[:, 2:], logprobs.reshape(8, 2, 1))
    metrics = trainer.train(trainer.compute_advantages_and_returns(batch))
    assert metrics["actor/current_version"] == 4.0 and metrics["actor/average_version"] == 2.0
    assert metrics["actor/behav_approx_kl"] != 0.0  # the stale half is importance-weighted


def test_fresh_batches_skip_the_recomputation_and_missing_versions_are_explained() -> None:
    trainer = _trainer(loss_type="decoupled_actor_critic")
    batch = _batch()
    batch["versions"] = torch.zeros(8, 4, dtype=torch.int64)
    assert torch.equal(trainer.compute_proximal_logprobs(batch)["proximal_logprobs"], batch["prev_logprobs"])
    with pytest.raises(ValueError, match=r"versions \[T=8, E=4\]"):
        trainer.compute_proximal_logprobs(_batch())


def test_staleness_counts() -> None:
    from rlinf_models.embodied import STALENESS_BINS, staleness_counts

    counts = staleness_counts(torch.tensor([[5, 4], [3, -20]]), 5)
    assert counts["staleness/samples"] == 4 and counts["staleness/sum"] == 28
    assert counts["staleness/max"] == 25 and counts["staleness/min"] == 0
    assert [counts[f"staleness/count_{d}"] for d in range(STALENESS_BINS)] == [1, 1, 1, 0, 0, 0, 0, 1]


def test_value_lr_reaches_every_value_head() -> None:
    """``optim.value_lr`` applies to the critic of an MLP policy and to a value head nested in a model (VLAs)."""

    class Nested(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = torch.nn.Module()
            self.model.backbone = torch.nn.Linear(3, 4)
            self.model.value_head = torch.nn.Linear(4, 1)

    actor = EmbodiedActorConfig(
        global_batch_size=16, micro_batch_size=8, optim=OptimConfig(lr=1e-3, value_lr=5e-2)
    )
    nested = EmbodiedPPOTrainer(Nested(), AlgorithmConfig(), actor)  # type: ignore[arg-type]
    actor_group, critic_group = nested.optimizer.param_groups
    assert critic_group["lr"] == 5e-2 and len(critic_group["params"]) == 2  # value_head weight and bias
    assert actor_group["lr"] == 1e-3 and len(actor_group["params"]) == 2
    torch.manual_seed(0)
    mlp = EmbodiedPPOTrainer(build_policy(SPEC, PolicyConfig(hidden_sizes=(16,))), AlgorithmConfig(), actor)
    assert [g["lr"] for g in mlp.optimizer.param_groups] == [1e-3, 5e-2]
