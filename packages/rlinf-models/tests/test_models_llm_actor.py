"""LLMActorWorker in-process (one rank, no Ray): GRPO/PPO updates, SFT, KL and critic, checkpoints, HF export."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch

pytest.importorskip("transformers")

from rlinf_core.config import AlgorithmConfig
from rlinf_models import OptimConfig
from rlinf_models.llm import CausalLMPolicy, LLMActorConfig, LLMActorWorker, LLMModelConfig, load_causal_lm
from rlinf_models.llm.testing import local_llm_actor, make_tiny_model_dir

torch.set_num_threads(1)

GRPO = AlgorithmConfig(
    adv_type="grpo", loss_type="actor", update_epoch=1, clip_ratio_low=0.2, clip_ratio_high=0.28
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny") / "m", arch="qwen2", seed=0)


def local_actor(cfg: LLMActorConfig, algorithm: AlgorithmConfig, **kwargs: Any) -> LLMActorWorker:
    """A one-rank actor in this process (the context a group launch would install)."""
    actor: LLMActorWorker = local_llm_actor(cfg, algorithm, **kwargs)
    return actor


def actor_cfg(model_dir: Path, **kwargs: Any) -> LLMActorConfig:
    model = LLMModelConfig(model_path=str(model_dir), add_value_head=kwargs.pop("add_value_head", False))
    defaults: dict[str, Any] = {
        "optim": OptimConfig(lr=1e-2, clip_grad=1.0),
        "global_batch_size": 8,
        "micro_batch_size": 4,
        "seed": 3,
        "temperature": 0.9,
    }
    defaults.update(kwargs)
    return LLMActorConfig(model=model, **defaults)


def make_batch(n: int = 8, prompt_len: int = 6, resp_len: int = 5, seed: int = 0) -> dict[str, torch.Tensor]:
    """Left-padded prompts ending at column P, right-padded responses; advantages +1 on even rows, -1 on odd."""
    g = torch.Generator().manual_seed(seed)
    t = prompt_len + resp_len
    ids = torch.full((n, t), 2, dtype=torch.long)
    attn = torch.zeros(n, t, dtype=torch.long)
    loss_mask = torch.zeros(n, t, dtype=torch.long)
    for i in range(n):
        p = prompt_len - (i % 3)  # prompts of different lengths, left-padded
        r = resp_len - (i % 2)  # responses of different lengths, right-padded
        ids[i, prompt_len - p : prompt_len] = torch.randint(3, 500, (p,), generator=g)
        ids[i, prompt_len : prompt_len + r] = torch.randint(3, 500, (r,), generator=g)
        attn[i, prompt_len - p : prompt_len + r] = 1
        loss_mask[i, prompt_len : prompt_len + r] = 1
    sign = torch.tensor([1.0 if i % 2 == 0 else -1.0 for i in range(n)])
    adv = sign[:, None] * loss_mask.float()
    return {"input_ids": ids, "attention_mask": attn, "loss_mask": loss_mask, "advantages": adv}


def masked_row_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum(1) / mask.sum(1)


def state(actor: LLMActorWorker) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in actor.backend.policy.state_dict().items()}


def test_grpo_update_raises_logprobs_of_rewarded_tokens(model_dir: Path) -> None:
    actor = local_actor(actor_cfg(model_dir), GRPO, total_steps=10)
    batch = make_batch()
    before = masked_row_mean(actor.compute_logprobs(batch)["logprobs"], batch["loss_mask"])
    for _ in range(3):
        metrics = actor.run_training(batch)
    after = masked_row_mean(actor.compute_logprobs(batch)["logprobs"], batch["loss_mask"])
    delta = after - before
    assert torch.all(delta[0::2] > 0.05), delta  # rewarded responses became more likely
    assert torch.all(delta[1::2] < -0.05), delta  # penalised ones less likely
    for key in (
        "actor/policy_loss",
        "actor/clip_fraction",
        "actor/approx_kl",
        "actor/entropy",
        "actor/grad_norm",
        "actor/lr",
    ):
        assert key in metrics and metrics[key] == metrics[key], key
    assert metrics["actor/num_optimizer_steps"] == 1.0
    assert actor.get_model_version() == 3


def test_on_policy_shortcut_equals_recomputed_old_logprobs(model_dir: Path) -> None:
    batch = make_batch(seed=1)
    a = local_actor(actor_cfg(model_dir), GRPO)
    b = local_actor(actor_cfg(model_dir), GRPO)
    ma = a.run_training(batch)  # single optimizer step: old log-probs = detached current ones
    old = b.compute_logprobs(batch)["logprobs"]
    mb = b.run_training({**batch, "old_logprobs": old, "rollout_logprobs": old + 0.5 * batch["loss_mask"]})
    assert mb["actor/rollout_logprob_diff"] == pytest.approx(0.5, abs=1e-6)
    assert ma["actor/policy_loss"] == pytest.approx(mb["actor/policy_loss"], abs=1e-6)
    sa, sb = state(a), state(b)
    for key in sa:
        torch.testing.assert_close(sa[key], sb[key], rtol=1e-5, atol=1e-7, msg=key)


def test_importance_sampling_fix_weights_each_tokens_advantage(model_dir: Path) -> None:
    """TIS: the update equals the plain one on advantages pre-multiplied by min(π_old/π_rollout, C)."""
    batch = make_batch(seed=2)
    fix = attrs.evolve(GRPO, importance_sampling_fix=True, importance_sampling_clip=1.5)
    a = local_actor(actor_cfg(model_dir), fix)
    b = local_actor(actor_cfg(model_dir), GRPO)
    old = b.compute_logprobs(batch)["logprobs"]
    g = torch.Generator().manual_seed(0)
    rollout = old + 0.6 * torch.randn(old.shape, generator=g) * batch["loss_mask"]  # the engine's mismatch
    with pytest.raises(ValueError, match="rollout_logprobs"):
        a.run_training(batch)  # the correction needs the rollout's log-probs
    ma = a.run_training({**batch, "rollout_logprobs": rollout})
    w = torch.exp(old - rollout).clamp(max=1.5)
    mb = b.run_training({**batch, "advantages": batch["advantages"] * w, "rollout_logprobs": rollout})
    assert ma["actor/policy_loss"] == pytest.approx(mb["actor/policy_loss"], abs=1e-6)
    sa, sb = state(a), state(b)
    for key in sa:
        torch.testing.assert_close(sa[key], sb[key], rtol=1e-5, atol=1e-7, msg=key)
    scored = batch["loss_mask"].bool()
    raw = torch.exp(old - rollout)[scored]
    assert ma["actor/is_clip_fraction"] == pytest.approx(float((raw > 1.5).float().mean()), abs=1e-6)
    assert 0 < ma["actor/is_clip_fraction"] < 1
    assert ma["actor/is_weight_mean"] == pytest.approx(float(raw.mean()), rel=1e-4)
    assert "actor/is_weight_mean" not in mb  # off unless asked for


def test_multi_epoch_minibatches_and_linear_lr(model_dir: Path) -> None:
    alg = AlgorithmConfig(
        adv_type="grpo", loss_type="actor", update_epoch=2, loss_agg_func="seq-mean-token-mean"
    )
    optim = OptimConfig(lr=1e-3, lr_schedule="linear")
    actor = local_actor(
        actor_cfg(model_dir, optim=optim, global_batch_size=4, micro_batch_size=2), alg, total_steps=4
    )
    batch = make_batch(n=8)
    m1 = actor.run_training(batch)
    m2 = actor.run_training(batch)
    assert m1["actor/num_optimizer_steps"] == 4.0  # 2 epochs x 2 mini-batches of 4
    assert m1["actor/lr"] == pytest.approx(1e-3) and m2["actor/lr"] == pytest.approx(0.75e-3)
    assert m2["actor/approx_kl"] != 0.0


def test_sft_reduces_cross_entropy(model_dir: Path) -> None:
    actor = local_actor(
        actor_cfg(model_dir, micro_batch_size=2, global_batch_size=8, sft_lr=5e-3, temperature=1.0), GRPO
    )
    batch = make_batch(seed=2)
    sft = {k: batch[k] for k in ("input_ids", "attention_mask", "loss_mask")}
    losses = [actor.run_sft(sft)["sft/loss"] for _ in range(6)]
    assert losses[-1] < losses[0] - 0.5, losses
    # The reported loss is the token-mean NLL of the batch before the step (temperature 1).
    lp = actor.compute_logprobs(sft)["logprobs"]
    m = sft["loss_mask"].float()
    nll = float(-(lp * m).sum() / m.sum())
    assert actor.run_sft(sft)["sft/loss"] == pytest.approx(nll, rel=1e-3)


def test_kl_entropy_and_critic_paths(model_dir: Path) -> None:
    alg = AlgorithmConfig(
        adv_type="gae",
        loss_type="actor_critic",
        update_epoch=1,
        kl_beta=0.1,
        kl_penalty="low_var_kl",
        entropy_bonus=0.01,
    )
    actor = local_actor(actor_cfg(model_dir, add_value_head=True), alg)
    batch = make_batch(seed=3)
    extra = actor.compute_logprobs(batch)
    assert set(extra) == {"logprobs", "ref_logprobs", "values"}
    torch.testing.assert_close(extra["ref_logprobs"], extra["logprobs"])  # the reference starts as the policy
    batch["returns"] = batch["advantages"] * 0.5
    m1 = actor.run_training(batch)
    assert m1["actor/kl_loss"] == pytest.approx(0.0, abs=1e-6)
    assert {"critic/value_loss", "critic/explained_variance"} <= m1.keys()
    m2 = actor.run_training(batch)
    assert m2["actor/kl_loss"] > 0
    extra2 = actor.compute_logprobs(batch)
    torch.testing.assert_close(extra2["ref_logprobs"], extra["ref_logprobs"])  # frozen
    assert not torch.equal(extra2["values"], extra["values"])  # the critic learned
    actor.update_reference_model()  # e.g. after an SFT warm-up: the reference becomes the current policy
    extra3 = actor.compute_logprobs(batch)
    torch.testing.assert_close(extra3["ref_logprobs"], extra3["logprobs"])
    with pytest.raises(ValueError, match="add_value_head"):
        local_actor(actor_cfg(model_dir), alg)


def test_checkpoint_round_trip_continues_exactly(model_dir: Path, tmp_path: Path) -> None:
    alg = AlgorithmConfig(adv_type="grpo", loss_type="actor", update_epoch=2)
    cfg = actor_cfg(model_dir, global_batch_size=4, micro_batch_size=2)
    a = local_actor(cfg, alg)
    a.run_training(make_batch(seed=4))
    a.save_checkpoint(str(tmp_path / "ck"))
    assert sorted(p.name for p in (tmp_path / "ck" / "actor").iterdir()) == [
        "model.pt", "optimizer.pt", "rng_rank0.pkl", "trainer.pt"
    ]  # fmt: skip
    ma = a.run_training(make_batch(seed=5))
    b = local_actor(actor_cfg(model_dir, global_batch_size=4, micro_batch_size=2, seed=77), alg)
    b.load_checkpoint(str(tmp_path / "ck"))
    assert b.get_model_version() == 1
    mb = b.run_training(make_batch(seed=5))
    assert ma == mb
    sa, sb = state(a), state(b)
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    with pytest.raises(FileNotFoundError, match="no actor checkpoint"):
        b.load_checkpoint(str(tmp_path / "nothing"))


def test_save_hf_exports_a_loadable_checkpoint(model_dir: Path, tmp_path: Path) -> None:
    actor = local_actor(actor_cfg(model_dir, add_value_head=True), GRPO)
    batch = make_batch(seed=6)
    actor.run_training(batch)
    out = tmp_path / "hf"
    (out).mkdir()
    (out / "stale.txt").write_text("replaced")
    actor.save_hf(str(out))
    assert not (out / "stale.txt").exists() and (out / "value_head.pt").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["hf"]  # no staging leftovers
    model = load_causal_lm(LLMModelConfig(model_path=str(out)))
    with torch.no_grad():
        got = CausalLMPolicy(model)(batch["input_ids"], batch["attention_mask"], temperature=0.9)["logprobs"]
    expected = actor.compute_logprobs(batch)["logprobs"]
    scored = batch["loss_mask"].bool()  # compute_logprobs scores the loss-mask positions only
    torch.testing.assert_close(got[scored], expected[scored], rtol=1e-5, atol=1e-5)
    assert torch.all(expected[~scored] == 0)
    no_mask = {k: batch[k] for k in ("input_ids", "attention_mask")}
    attn = batch["attention_mask"].bool()
    real = attn & torch.roll(attn, 1, dims=1)  # a token with a real token before it
    real[:, 0] = False
    torch.testing.assert_close(
        got[real], actor.compute_logprobs(no_mask)["logprobs"][real], rtol=1e-5, atol=1e-5
    )
    # The weight-sync state dict has exactly the HF model's keys.
    assert set(actor.backend.export_hf_state_dict()) == set(model.state_dict())


def test_batch_validation(model_dir: Path) -> None:
    actor = local_actor(actor_cfg(model_dir), GRPO)
    batch = make_batch()
    with pytest.raises(ValueError, match=r"missing \['advantages'\]"):
        actor.run_training({k: v for k, v in batch.items() if k != "advantages"})
    with pytest.raises(ValueError, match=r"batch\['loss_mask'\] must be \[N, T\]"):
        actor.run_training({**batch, "loss_mask": batch["loss_mask"][:, :-1]})
    with pytest.raises(ValueError, match=r"not a multiple of actor\.micro_batch_size"):
        actor.run_training({k: v[:6] for k, v in batch.items()})
    with pytest.raises(ValueError, match="selects no token"):
        actor.run_sft({**batch, "loss_mask": torch.zeros_like(batch["loss_mask"])})
    numpy_batch = {k: v.numpy() for k, v in batch.items()}  # numpy arrays are accepted too
    assert actor.compute_logprobs(numpy_batch)["logprobs"].shape == batch["input_ids"].shape


def test_gradient_checkpointing_makes_the_same_update(model_dir: Path) -> None:
    batch = make_batch(seed=7)
    plain = local_actor(actor_cfg(model_dir), GRPO)
    cfg = actor_cfg(model_dir)
    ckpt = local_actor(attrs.evolve(cfg, model=attrs.evolve(cfg.model, gradient_checkpointing=True)), GRPO)
    assert (
        ckpt.backend.policy.model.is_activation_checkpointing
        and not plain.backend.policy.model.is_activation_checkpointing
    )
    mp, mc = plain.run_training(batch), ckpt.run_training(batch)
    assert mc["actor/grad_norm"] == pytest.approx(mp["actor/grad_norm"], rel=1e-4)
    sp, sc = state(plain), state(ckpt)
    for key in sp:
        torch.testing.assert_close(sc[key], sp[key], rtol=1e-5, atol=1e-6, msg=key)


def test_remove_padding_makes_the_same_update_sft_and_scores(model_dir: Path) -> None:
    """Packed micro-batches: same loss, gradient norm, weights and log-probs as the padded path (PPO, 2 epochs)."""
    batch = make_batch(seed=11)
    alg = attrs.evolve(GRPO, update_epoch=2)
    # A small learning rate: Adam moves a weight by ~lr whatever its gradient's size, so at lr 1e-2 the float
    # noise of a near-zero gradient (other kernel shapes, other thread counts) shows as an lr-sized difference.
    slow = OptimConfig(lr=1e-5, clip_grad=1.0)
    padded = local_actor(
        actor_cfg(model_dir, add_value_head=True, optim=slow), attrs.evolve(alg, loss_type="actor_critic")
    )
    packed = local_actor(
        actor_cfg(model_dir, add_value_head=True, use_remove_padding=True, optim=slow),
        attrs.evolve(alg, loss_type="actor_critic"),
    )
    critic_batch = {**batch, "returns": batch["advantages"].clone()}
    mp, mk = padded.run_training(critic_batch), packed.run_training(critic_batch)
    for key in ("actor/policy_loss", "actor/grad_norm", "actor/entropy", "critic/value_loss"):
        assert mk[key] == pytest.approx(mp[key], rel=1e-4, abs=1e-6), key
    sp, sk = state(padded), state(packed)
    for key in sp:  # after 4 AdamW steps
        torch.testing.assert_close(sk[key], sp[key], rtol=1e-5, atol=1e-7, msg=key)
    assert packed.run_sft(batch)["sft/loss"] == pytest.approx(padded.run_sft(batch)["sft/loss"], rel=1e-5)
    lp_p, lp_k = padded.compute_logprobs(batch)["logprobs"], packed.compute_logprobs(batch)["logprobs"]
    torch.testing.assert_close(lp_k * batch["loss_mask"], lp_p * batch["loss_mask"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_token_budget_micro_batches_make_the_whole_mini_batch_update(model_dir: Path, agg: str) -> None:
    """max_tokens_per_mbs: micro-batches of unequal size weighted by their share = one micro-batch of all rows."""
    batch = make_batch(seed=13)
    alg = attrs.evolve(GRPO, loss_agg_func=agg)
    # A small learning rate: Adam's first step moves every weight by ~lr whatever its gradient's size, so the
    # float noise of near-zero gradients would show as lr-sized differences.
    slow = OptimConfig(lr=1e-5, clip_grad=1.0)
    whole = local_actor(actor_cfg(model_dir, micro_batch_size=8, optim=slow), alg)
    budget = local_actor(
        actor_cfg(model_dir, optim=slow, max_tokens_per_mbs=25, use_remove_padding=True), alg
    )
    assert len(budget.backend._micro_split(torch.arange(8), batch["attention_mask"])) > 1
    mw, mb = whole.run_training(batch), budget.run_training(batch)
    for key in ("actor/grad_norm", "actor/policy_loss", "actor/entropy"):
        assert mb[key] == pytest.approx(mw[key], rel=1e-4, abs=1e-6), key
    sw, sb = state(whole), state(budget)
    for key in sw:
        torch.testing.assert_close(sb[key], sw[key], rtol=1e-5, atol=1e-7, msg=key)
    assert budget.run_sft(batch)["sft/loss"] == pytest.approx(whole.run_sft(batch)["sft/loss"], rel=1e-5)


def test_remove_padding_is_refused_for_megatron(model_dir: Path) -> None:
    with pytest.raises(ValueError, match="use_remove_padding applies to training_backend: fsdp"):
        actor_cfg(model_dir, use_remove_padding=True, training_backend="megatron")
    with pytest.raises(ValueError, match="max_tokens_per_mbs applies to training_backend: fsdp"):
        actor_cfg(model_dir, max_tokens_per_mbs=64, training_backend="megatron")


def test_bfloat16_weights_train_and_offload_is_a_cpu_no_op(model_dir: Path) -> None:
    cfg = actor_cfg(model_dir, add_value_head=True, enable_offload=True)
    cfg = attrs.evolve(cfg, model=attrs.evolve(cfg.model, dtype="bfloat16"))
    alg = AlgorithmConfig(adv_type="gae", loss_type="actor_critic", update_epoch=1)
    actor = local_actor(cfg, alg)
    assert (
        actor.backend.policy.model.dtype == torch.bfloat16
        and actor.backend.policy.value_head.weight.dtype == torch.float32
    )
    batch = make_batch(seed=8)
    batch["returns"] = batch["advantages"].clone()
    before = actor.compute_logprobs(batch)
    assert before["logprobs"].dtype == torch.float32
    actor.offload()
    metrics = actor.run_training(batch)
    actor.onload()
    assert math.isfinite(metrics["actor/policy_loss"]) and math.isfinite(metrics["critic/value_loss"])
    after = actor.compute_logprobs(batch)
    assert not torch.equal(after["logprobs"], before["logprobs"])


def test_all_padding_columns_change_nothing(model_dir: Path) -> None:
    """Extra left/right padding columns (e.g. a batch padded to a longer width) give the same update."""
    alg = AlgorithmConfig(adv_type="gae", loss_type="actor_critic", update_epoch=2, kl_beta=0.1)
    batch = make_batch(seed=9)
    batch["returns"] = batch["advantages"] * 0.3
    left, right = 3, 4

    def widen(x: torch.Tensor, fill: int) -> torch.Tensor:
        n = x.shape[0]
        return torch.cat(
            [torch.full((n, left), fill, dtype=x.dtype), x, torch.full((n, right), fill, dtype=x.dtype)], 1
        )

    wide = {k: widen(v, 2 if k == "input_ids" else 0) for k, v in batch.items()}
    a = local_actor(actor_cfg(model_dir, add_value_head=True), alg)
    b = local_actor(actor_cfg(model_dir, add_value_head=True), alg)
    xa, xb = a.compute_logprobs(batch), b.compute_logprobs(wide)
    for key in xa:
        torch.testing.assert_close(xb[key][:, left:-right], xa[key], rtol=1e-5, atol=1e-6, msg=key)
        assert torch.all(xb[key][:, :left] == 0) and torch.all(xb[key][:, -right:] == 0)
    ma, mb = a.run_training(batch), b.run_training(wide)
    assert ma.keys() == mb.keys()
    for key in ma:
        assert mb[key] == pytest.approx(ma[key], rel=1e-4, abs=1e-6), key
    sa, sb = state(a), state(b)
    for key in sa:
        torch.testing.assert_close(sb[key], sa[key], rtol=1e-4, atol=1e-6, msg=key)
    sft = {k: wide[k] for k in ("input_ids", "attention_mask", "loss_mask")}
    narrow = {k: batch[k] for k in ("input_ids", "attention_mask", "loss_mask")}
    assert b.run_sft(sft)["sft/loss"] == pytest.approx(a.run_sft(narrow)["sft/loss"], rel=1e-5)


def test_non_finite_loss_skips_the_optimizer_step(model_dir: Path) -> None:
    actor = local_actor(actor_cfg(model_dir), GRPO)
    batch = make_batch(seed=10)
    col = int(batch["loss_mask"][0].nonzero()[0, 0])
    batch["advantages"][0, col] = float("nan")  # e.g. a broken reward: NaN gradients
    before = state(actor)
    metrics = actor.run_training(batch)
    assert math.isnan(metrics["actor/grad_norm"]) and metrics["actor/skipped_steps"] == 1.0
    after = state(actor)
    assert all(torch.equal(before[k], after[k]) for k in before)  # the weights are untouched


def test_streamed_micro_batches_make_run_trainings_update(model_dir: Path) -> None:
    """run_training_stream (the pipelined mode) over run_training's own micro-batches, fed one at a time: the
    same losses, KL to the reference, gradient norm and weights."""
    batch = make_batch(seed=21)
    alg = attrs.evolve(GRPO, kl_beta=0.05, kl_penalty="low_var_kl")
    slow = OptimConfig(lr=1e-5, clip_grad=1.0)
    whole = local_actor(actor_cfg(model_dir, optim=slow), alg)
    stream = local_actor(actor_cfg(model_dir, optim=slow), alg)
    # run_training draws one permutation from a generator seeded with actor.seed and cuts it into micro-batches
    perm = torch.randperm(8, generator=torch.Generator().manual_seed(3))
    micro = [{k: v[rows] for k, v in batch.items()} for rows in (perm[:4], perm[4:])]
    mw = whole.run_training(batch)
    ms = stream.backend.run_training_stream(iter(micro))
    assert ms["actor/num_micro_batches"] == 2 and ms["actor/num_optimizer_steps"] == 1
    for key in ("actor/grad_norm", "actor/policy_loss", "actor/entropy", "actor/kl_loss", "actor/approx_kl"):
        assert ms[key] == pytest.approx(mw[key], rel=1e-5, abs=1e-7), key
    sw, ss = state(whole), state(stream)
    for key in sw:
        torch.testing.assert_close(ss[key], sw[key], rtol=1e-5, atol=1e-7, msg=key)
    assert stream.get_model_version() == 1
    # an empty stream (every group filtered out) takes no step
    empty = stream.backend.run_training_stream(iter([]))
    assert empty["actor/num_optimizer_steps"] == 0 and "actor/policy_loss" not in empty
    assert stream.get_model_version() == 1
    two_epochs = local_actor(actor_cfg(model_dir), attrs.evolve(GRPO, update_epoch=2))
    with pytest.raises(ValueError, match="update_epoch must be 1"):
        two_epochs.backend.run_training_stream(iter(micro))
