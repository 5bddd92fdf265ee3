"""ReasoningRunner's loop logic against fake actor / rollout / reward groups (no Ray, no model)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rlinf_core.checkpoint import is_complete
from rlinf_core.config import AlgorithmConfig
from rlinf_core.data import DataConfig, PromptDataset, PromptExample
from rlinf_core.metrics import read_metrics
from rlinf_runners import LoggerConfig, ReasoningRunner, RunnerConfig, SFTConfig


class _Done:
    def __init__(self, results: list[Any]) -> None:
        self.results = results

    def wait(self, timeout: float | None = None) -> list[Any]:
        assert timeout is not None, "every wait needs a timeout"
        return self.results


def _share(items: list[Any], rank: int, world_size: int) -> list[Any]:
    base, extra = divmod(len(items), world_size)
    start = rank * base + min(rank, extra)
    return items[start : start + base + (1 if rank < extra else 0)]


class FakeGroup:
    """Records ``group.method`` calls; ``handlers[method](rank, *args)`` answers for each rank."""

    def __init__(
        self, name: str, log: list[str], handlers: dict[str, Callable[..., Any]], world_size: int = 1
    ):
        self.name, self.log, self.handlers, self.world_size = name, log, handlers, world_size

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> _Done:
        assert fn.__module__ == "rlinf_core.protocols._roles", f"runners call role methods, not {fn!r}"
        method = fn.__name__
        self.log.append(f"{self.name}.{method}")
        handler = self.handlers.get(method)
        return _Done([handler(r, *args) if handler else None for r in range(self.world_size)])

    def execute_on(self, *ranks: int) -> _Subset:
        return _Subset(self, ranks)


class _Subset:
    """``group.execute_on(...)``: logged as ``name[ranks].method``."""

    def __init__(self, group: FakeGroup, ranks: tuple[int, ...]) -> None:
        self.group, self.ranks = group, ranks

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> _Done:
        assert fn.__module__ == "rlinf_core.protocols._roles", f"runners call role methods, not {fn!r}"
        self.group.log.append(f"{self.group.name}{list(self.ranks)}.{fn.__name__}")
        handler = self.group.handlers.get(fn.__name__)
        return _Done([handler(r, *args) if handler else None for r in self.ranks])


class FakeEncoder:
    """Prompt ids = the numbers in the question (one token each), plus a marker token 1."""

    pad_token_id = 0

    def encode_prompt(self, example: PromptExample) -> list[int]:
        return [int(x) for x in example.prompt_text.split()] + [1]

    def encode_completion(self, text: str) -> list[int]:
        return [int(x) for x in text.split()] + [2]


def _dataset(n: int, *, solution: bool = False) -> PromptDataset:
    rows = []
    for i in range(n):
        a, b = 3 + i % 5, 4 + i % 3
        rows.append(
            PromptExample(
                messages=({"role": "user", "content": f"{a} {b}"},),
                answers=(str(a + b),),
                solution=f"{a + b}" if solution else None,
            )
        )
    return PromptDataset(rows, "fake")


class World:
    """Fake groups around a 'model' that answers correctly with probability ``skill`` per sample."""

    def __init__(
        self, *, rollout_ws: int = 1, reward_ws: int = 1, response_len: Callable[[int], int] | None = None
    ):
        self.log: list[str] = []
        self.version = 0
        self.batches: list[dict[str, Any]] = []
        self.sft_batches: list[dict[str, Any]] = []
        self.gen_calls: list[tuple[int, int, dict[str, Any]]] = []
        self.sample = 0
        self.response_len = response_len or (lambda i: 3)
        self.correct_of: Callable[[int], bool] = lambda i: i % 2 == 0
        self.actor = FakeGroup(
            "actor",
            self.log,
            {
                "run_training": self._train,
                "run_sft": self._sft,
                "compute_logprobs": self._logprobs,
                "save_checkpoint": self._save,
                "load_checkpoint": self._load,
            },
        )
        self.rollout = FakeGroup("rollout", self.log, {"generate": self._generate}, world_size=rollout_ws)
        self.reward = FakeGroup("reward", self.log, {"compute": self._reward}, world_size=reward_ws)

    def _train(self, rank: int, batch: dict[str, Any]) -> dict[str, float]:
        if rank == 0:
            self.version += 1
            self.batches.append(batch)
        return {"actor/policy_loss": 1.0 / self.version}

    def _sft(self, rank: int, batch: dict[str, Any]) -> dict[str, float]:
        if rank == 0:
            self.sft_batches.append(batch)
        return {"loss": 2.0}

    def _logprobs(self, rank: int, batch: dict[str, Any]) -> dict[str, Any]:
        n, t = batch["input_ids"].shape
        return {
            "logprobs": np.full((n, t), -1.0, dtype=np.float32),
            "ref_logprobs": np.full((n, t), -1.5, dtype=np.float32),
            "values": np.full((n, t), 0.25, dtype=np.float32),
        }

    def _save(self, rank: int, path: str) -> None:
        (Path(path) / "actor.json").write_text(json.dumps({"version": self.version}))

    def _load(self, rank: int, path: str) -> None:
        self.version = json.loads((Path(path) / "actor.json").read_text())["version"]

    def _generate(
        self, rank: int, prompts: list[list[int]], sampling: dict[str, Any]
    ) -> list[dict[str, Any]]:
        prompts = _share(prompts, rank, self.rollout.world_size)
        self.gen_calls.append((rank, len(prompts), sampling))
        out = []
        for p in prompts:
            i = self.sample
            self.sample += 1
            answer = sum(p[:-1]) if self.correct_of(i) else -1
            n = self.response_len(i)
            limit = int(sampling.get("max_new_tokens", 100))
            n = min(n, limit)
            out.append(
                {
                    "token_ids": [5] * n,
                    "logprobs": [-0.5] * n,
                    "text": f"the answer is \\boxed{{{answer}}}",
                    "finish_reason": "length" if n >= limit else "stop",
                }
            )
        return out

    def _reward(self, rank: int, texts: list[str], refs: list[list[str]]) -> dict[str, Any]:
        texts, refs = _share(texts, rank, self.reward.world_size), _share(refs, rank, self.reward.world_size)
        ok = [t.endswith(f"{{{r[0]}}}") for t, r in zip(texts, refs, strict=True)]
        return {"rewards": [1.0 if c else 0.0 for c in ok], "correct": ok}


def _runner(
    tmp_path: Path,
    world: World,
    *,
    algorithm: AlgorithmConfig | None = None,
    data: DataConfig | None = None,
    sft: SFTConfig | None = None,
    n_train: int = 12,
    sampling: dict[str, Any] | None = None,
    eval_chunk: int | None = None,
    progress_bar: bool = False,
    **cfg: Any,
) -> ReasoningRunner:
    config = RunnerConfig(
        progress_bar=progress_bar, logger=LoggerConfig(log_path=str(tmp_path), logger_backends=()), **cfg
    )
    return ReasoningRunner(
        config,
        actor=world.actor,
        rollout=world.rollout,
        reward=world.reward,
        algorithm=algorithm or AlgorithmConfig(adv_type="grpo", loss_type="actor", group_size=4),
        data=data or DataConfig(train_path="x", rollout_batch_size=2, max_prompt_length=8),
        encoder=FakeEncoder(),
        train_data=_dataset(n_train),
        eval_data=_dataset(5),
        sampling=sampling or {"temperature": 1.0, "max_new_tokens": 8},
        sft=sft,
        sft_data=_dataset(6, solution=True),
        eval_chunk=eval_chunk,
    )


def test_loop_order_eval_metrics_and_checkpoints(tmp_path: Path) -> None:
    world = World()
    result = _runner(tmp_path, world, max_epochs=3, val_check_interval=2, save_interval=2).run()
    assert result.global_step == 3
    first = world.log[: world.log.index("actor.run_training") + 1]
    assert first == [
        "rollout.sync_model_from_actor" if first[0].startswith("rollout") else "actor.sync_model_to_rollout",
        *first[1:2],
        "rollout.generate",  # evaluation at step 0
        "reward.compute",
        "rollout.generate",  # training rollout
        "reward.compute",
        "actor.run_training",
    ]
    assert {first[0], first[1]} == {"actor.sync_model_to_rollout", "rollout.sync_model_from_actor"}
    records = read_metrics(tmp_path)
    evals = [r for r in records if "eval/accuracy" in r]
    assert [r["step"] for r in evals] == [0, 2, 3]  # every 2 steps and once at the end
    # 5 eval prompts, greedy, samples 0..4 of the fake are correct when even → 3/5
    assert evals[0]["eval/accuracy"] == pytest.approx(3 / 5)
    assert world.gen_calls[0][2]["temperature"] == 0.0
    train = [r for r in records if "train/actor/policy_loss" in r]
    assert [r["step"] for r in train] == [1, 2, 3]
    assert all(r["rollout/num_samples"] == 8 for r in train)
    assert all(r["rollout/accuracy"] == pytest.approx(0.5) for r in train)
    ckpts = sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if is_complete(p))
    assert ckpts == ["global_step_2", "global_step_3"]
    # every evaluation's samples, one JSON line each: prompt, response, reward, correct, reference answers
    files = sorted(p.name for p in (tmp_path / "samples").iterdir())
    assert files == ["eval_step0.jsonl", "eval_step2.jsonl", "eval_step3.jsonl"]
    rows = [json.loads(line) for line in (tmp_path / "samples" / "eval_step2.jsonl").read_text().splitlines()]
    assert len(rows) == 5 and all(r["step"] == 2 for r in rows)
    assert {"prompt", "response", "reward", "correct", "answers", "finish_reason"} <= set(rows[0])
    assert sum(r["correct"] for r in rows) / 5 == pytest.approx(evals[1]["eval/accuracy"])
    assert all(r["reward"] == (1.0 if r["correct"] else 0.0) for r in rows), rows


def test_grpo_batch_layout_and_advantages(tmp_path: Path) -> None:
    world = World(response_len=lambda i: 1 + i % 3)
    alg = AlgorithmConfig(adv_type="grpo", loss_type="actor", group_size=4, normalize_advantages=False)
    _runner(tmp_path, world, algorithm=alg, max_epochs=1, val_check_interval=-1, save_interval=-1).run()
    (batch,) = world.batches
    ids, mask, adv = batch["input_ids"], batch["loss_mask"], batch["advantages"]
    n, t = ids.shape
    assert n == 8 and batch["rewards"].shape == (8,)
    lengths = mask.sum(axis=1)
    assert list(lengths) == [1 + i % 3 for i in range(8)]
    p_len = t - int(lengths.max())
    # every prompt ends at column P with the marker token, responses start there
    assert (ids[:, p_len - 1] == 1).all() and (ids[:, p_len] == 5).all()
    assert (batch["attention_mask"][:, :p_len].sum(1) > 0).all()
    assert not mask[:, :p_len].any()
    assert batch["rollout_logprobs"][mask].tolist() == [-0.5] * int(mask.sum())
    # GRPO: within each group of 4, rewards 1,0,1,0 → ±(0.5 / std) on every response token, 0 elsewhere
    rewards = batch["rewards"].reshape(2, 4)
    expect = (rewards - rewards.mean(1, keepdims=True)) / (rewards.std(1, ddof=1, keepdims=True) + 1e-6)
    seq_adv = np.array([adv[i][mask[i]][0] for i in range(n)])
    assert np.allclose(seq_adv, expect.reshape(-1), atol=1e-5)
    assert (adv[~mask] == 0).all()
    for i in range(n):
        assert np.allclose(adv[i][mask[i]], seq_adv[i])
    # normalize_advantages: then standardised over all trained tokens (RLinf's masked_normalization)
    world2 = World(response_len=lambda i: 1 + i % 3)
    _runner(tmp_path / "n", world2, max_epochs=1, val_check_interval=-1, save_interval=-1).run()
    adv2, mask2 = world2.batches[0]["advantages"], world2.batches[0]["loss_mask"]
    assert abs(adv2[mask2].mean()) < 1e-5 and adv2[mask2].std() == pytest.approx(1.0, abs=1e-3)


def test_dynamic_sampling_drops_equal_groups_and_caps_generation(tmp_path: Path) -> None:
    world = World()
    # sample i is correct when its group (of 4) is odd: even groups all wrong → dropped
    world.correct_of = lambda i: (i // 4) % 2 == 1 and i % 4 != 0
    alg = AlgorithmConfig(
        adv_type="grpo", loss_type="actor", group_size=4, dynamic_sampling=True, max_num_gen_batches=3
    )
    _runner(tmp_path, world, algorithm=alg, max_epochs=1, val_check_interval=-1, save_interval=-1).run()
    (batch,) = world.batches
    assert batch["input_ids"].shape[0] == 8  # 2 kept groups of 4
    assert len(world.gen_calls) == 2  # one batch gives one kept group; the second completes the quota
    rec = next(r for r in read_metrics(tmp_path) if "dapo/kept_groups" in r)
    assert rec["dapo/kept_groups"] == 2 and rec["dapo/num_gen_batches"] == 2
    assert rec["rollout/num_samples"] == 16
    # nothing kept at all: the step is skipped after max_num_gen_batches batches
    world2 = World()
    world2.correct_of = lambda i: False
    _runner(
        tmp_path / "b", world2, algorithm=alg, max_epochs=1, val_check_interval=-1, save_interval=-1
    ).run()
    assert world2.batches == [] and len(world2.gen_calls) == 3
    rec2 = next(r for r in read_metrics(tmp_path / "b") if "train/skipped" in r)
    assert rec2["train/skipped"] == 1.0


def test_dynamic_sampling_trims_to_whole_actor_batches(tmp_path: Path) -> None:
    world = World()
    world.correct_of = lambda i: (i // 4) % 2 == 1 and i % 4 != 0  # one kept group per generation batch
    alg = AlgorithmConfig(
        adv_type="grpo", loss_type="actor", group_size=4, dynamic_sampling=True, max_num_gen_batches=3
    )
    data = DataConfig(train_path="x", rollout_batch_size=3, max_prompt_length=8)
    runner = _runner(
        tmp_path, world, algorithm=alg, data=data, max_epochs=1, val_check_interval=-1, save_interval=-1
    )
    runner.batch_multiple = 8
    runner.run()
    # 2 batches keep 1 + 2 groups = 12 sequences; the actor takes multiples of 8 → 2 groups
    (batch,) = world.batches
    assert batch["input_ids"].shape[0] == 8 and len(world.gen_calls) == 2


def test_overlong_filter_and_penalty(tmp_path: Path) -> None:
    world = World(response_len=lambda i: 8 if i % 4 == 0 else 2)
    alg = AlgorithmConfig(
        adv_type="grpo",
        loss_type="actor",
        group_size=4,
        overlong_filter=True,
        overlong_buffer_len=4,
        overlong_penalty_factor=0.5,
        normalize_advantages=False,
    )
    _runner(tmp_path, world, algorithm=alg, max_epochs=1, val_check_interval=-1, save_interval=-1).run()
    (batch,) = world.batches
    truncated = np.array([i % 4 == 0 for i in range(8)])
    assert not batch["loss_mask"][truncated].any()
    assert batch["loss_mask"][~truncated].sum(1).tolist() == [2] * 6
    # |y| = 8 = L_max → penalty (4 - 8) / 4 = -1, times 0.5; |y| = 2 → 0
    raw = np.array([1.0 if i % 2 == 0 else 0.0 for i in range(8)])
    assert np.allclose(batch["rewards"], raw - 0.5 * truncated)


def test_gae_uses_actor_values_and_fills_returns(tmp_path: Path) -> None:
    world = World(response_len=lambda i: 2)
    alg = AlgorithmConfig(
        adv_type="gae",
        loss_type="actor_critic",
        group_size=4,
        gamma=1.0,
        gae_lambda=1.0,
        normalize_advantages=False,
    )
    _runner(tmp_path, world, algorithm=alg, max_epochs=1, val_check_interval=-1, save_interval=-1).run()
    assert "actor.compute_logprobs" in world.log
    (batch,) = world.batches
    mask = batch["loss_mask"]
    # values 0.25 everywhere, reward at the last token, γ = λ = 1 → returns = reward, advantages = reward - 0.25
    rewards = batch["rewards"]
    for i in range(8):
        assert np.allclose(batch["returns"][i][mask[i]], rewards[i])
        assert np.allclose(batch["advantages"][i][mask[i]], rewards[i] - 0.25)
    assert np.allclose(batch["values"], 0.25) and "old_logprobs" in batch


def test_reinpp_with_kl_and_baseline(tmp_path: Path) -> None:
    world = World(response_len=lambda i: 2)
    alg = AlgorithmConfig(
        adv_type="reinpp",
        loss_type="actor",
        group_size=4,
        use_reinpp_baseline=True,
        reinpp_kl_beta=0.1,
        kl_penalty="kl",
    )
    _runner(tmp_path, world, algorithm=alg, max_epochs=1, val_check_interval=-1, save_interval=-1).run()
    (batch,) = world.batches
    mask, adv = batch["loss_mask"], batch["advantages"]
    # baseline-centred reward on the last token minus 0.1 * (logprob - ref) = 0.05 per token, reward-to-go,
    # then standardised over valid tokens
    centred = batch["rewards"] - batch["rewards"].reshape(2, 4).mean(1).repeat(4)
    r2g = np.stack([centred - 0.05 * 2, centred - 0.05], axis=1)  # token 0, token 1
    expect = (r2g - r2g.mean()) / r2g.std()
    got = np.stack([adv[i][mask[i]] for i in range(8)])
    assert np.allclose(got, expect, atol=1e-5)


def test_sft_warm_up_runs_first_and_trains_only_the_solution(tmp_path: Path) -> None:
    world = World()
    sft = SFTConfig(steps=3, batch_size=4, eval_before=True)
    runner = _runner(tmp_path, world, sft=sft, max_epochs=1, val_check_interval=1, save_interval=-1)
    runner.refresh_reference = True
    runner.run()
    assert (
        world.log.index("actor.update_reference_model")
        == len(world.log) - 1 - world.log[::-1].index("actor.run_sft") + 1
    )
    assert world.log.count("actor.run_sft") == 3
    first_gen = world.log.index("rollout.generate")
    assert world.log.index("actor.run_sft") > first_gen  # the pre-SFT evaluation comes first
    assert world.log[first_gen + 2 :].index("actor.run_sft") == 0
    batch = world.sft_batches[0]
    assert set(batch) == {"input_ids", "attention_mask", "loss_mask"}
    ids, mask = batch["input_ids"], batch["loss_mask"]
    for i in range(ids.shape[0]):
        trained = ids[i][mask[i]].tolist()
        assert trained[-1] == 2 and len(trained) == 2  # the answer token + end of turn
    records = read_metrics(tmp_path)
    assert any("eval_pre_sft/accuracy" in r for r in records)
    assert [r["sft/step"] for r in records if "sft/step" in r] == [1, 2, 3]


def _prompts(batches: list[dict[str, Any]]) -> list[list[int]]:
    out = []
    for b in batches:
        keep = (b["attention_mask"] == 1) & ~b["response_mask"]
        out += [row[k].tolist() for row, k in zip(b["input_ids"], keep, strict=True)]
    return out


def test_resume_continues_at_the_next_step_with_the_sampler_state(tmp_path: Path) -> None:
    world = World()
    sft = SFTConfig(steps=2, batch_size=2)
    _runner(tmp_path, world, sft=sft, max_epochs=2, val_check_interval=-1, save_interval=1).run()
    # a fresh run of 4 steps, for reference
    ref = World()
    _runner(tmp_path / "ref", ref, sft=sft, max_epochs=4, val_check_interval=-1, save_interval=-1).run()
    world2 = World()
    world2.sample = world.sample
    runner = _runner(
        tmp_path, world2, sft=sft, max_epochs=4, val_check_interval=-1, save_interval=1, resume_dir="auto"
    )
    result = runner.run()
    assert result.global_step == 4
    assert world2.log.count("actor.run_sft") == 0  # the warm-up is not repeated
    assert world2.version == 2 + 2  # loaded version 2, then two more updates
    assert _prompts(world.batches + world2.batches) == _prompts(ref.batches)


def test_shards_over_rollout_and_reward_ranks(tmp_path: Path) -> None:
    world = World(rollout_ws=3, reward_ws=2)
    _runner(tmp_path, world, max_epochs=1, val_check_interval=1, save_interval=-1).run()
    # evaluation: 5 prompts over 3 ranks → 2, 2, 1; training: 8 samples → 3, 3, 2
    assert [(r, n) for r, n, _ in world.gen_calls[:3]] == [(0, 2), (1, 2), (2, 1)]
    assert [(r, n) for r, n, _ in world.gen_calls[3:6]] == [(0, 3), (1, 3), (2, 2)]
    rec = next(r for r in read_metrics(tmp_path) if "eval/accuracy" in r)
    assert rec["eval/accuracy"] == pytest.approx(3 / 5)


def test_bad_inputs_are_clear_errors(tmp_path: Path) -> None:
    world = World()
    with pytest.raises(ValueError, match=r"adv_type 'grpo_video'.*allowed: grpo, reinpp, gae"):
        _runner(tmp_path, world, algorithm=AlgorithmConfig(adv_type="grpo_video", loss_type="actor"))
    with pytest.raises(ValueError, match=r"longer than data\.max_prompt_length=2"):
        _runner(tmp_path, world, data=DataConfig(train_path="x", max_prompt_length=2))
    config = RunnerConfig(progress_bar=False, logger=LoggerConfig(log_path=str(tmp_path), logger_backends=()))
    with pytest.raises(ValueError, match=r"sft\.steps > 0 needs SFT demonstrations"):
        ReasoningRunner(
            config,
            actor=world.actor,
            rollout=world.rollout,
            reward=world.reward,
            algorithm=AlgorithmConfig(adv_type="grpo", loss_type="actor"),
            data=DataConfig(train_path="x"),
            encoder=FakeEncoder(),
            train_data=_dataset(2),
            sampling={},
            sft=SFTConfig(steps=1),
        )


def test_dynamic_scaling_grows_the_actor_after_generation_and_shrinks_it_before(tmp_path: Path) -> None:
    """Elastic actor rank 1 (on the rollout's device): the rollout releases the device after generating, rank 1
    loads onto it and trains with rank 0, then gives it back before the rollout reloads and generates again."""
    world = World()
    world.actor.world_size = 2
    runner = _runner(tmp_path, world, max_epochs=2, val_check_interval=-1)
    runner.elastic_actor_ranks = (1,)
    runner.run()
    log = [e for e in world.log if not e.startswith(("reward.", "actor.save", "rollout.save"))]
    step = [
        "rollout.generate",
        "rollout.offload",  # the rollout releases its device ...
        "actor[1].onload",  # ... and the elastic rank takes it
        "actor.run_training",  # both ranks train
        "actor[1].offload",  # the device goes back
    ]
    sync = ["rollout.onload", "actor.sync_model_to_rollout", "rollout.sync_model_from_actor"]
    assert log == [*sync, *step, *sync, *step], log
    train = [r for r in read_metrics(tmp_path) if "train/actor/policy_loss" in r]
    assert all(
        r["scaling/actor_ranks"] == 2 and r["scaling/grow_s"] >= 0 and r["scaling/shrink_s"] >= 0
        for r in train
    )


def test_elastic_ranks_are_checked(tmp_path: Path) -> None:
    world = World()
    world.actor.world_size = 2
    config = RunnerConfig(progress_bar=False, logger=LoggerConfig(log_path=str(tmp_path), logger_backends=()))
    kwargs: dict[str, Any] = {
        "actor": world.actor,
        "rollout": world.rollout,
        "reward": world.reward,
        "algorithm": AlgorithmConfig(adv_type="grpo", loss_type="actor", group_size=4),
        "data": DataConfig(train_path="x", rollout_batch_size=2, max_prompt_length=8),
        "encoder": FakeEncoder(),
        "train_data": _dataset(4),
        "sampling": {"temperature": 1.0},
    }
    for bad in ([0], [2], [1, 1]):
        with pytest.raises(
            ValueError, match=r"elastic_actor_ranks .*expected distinct actor ranks in 1\.\.1"
        ):
            ReasoningRunner(config, elastic_actor_ranks=bad, **kwargs)
    with pytest.raises(ValueError, match="no collocated offload"):
        ReasoningRunner(config, elastic_actor_ranks=[1], offload=True, **kwargs)


class _FakeChannel:
    """Records what the driver puts, per key (the pipelined mode's rollout → actor channel)."""

    def __init__(self) -> None:
        self.items: dict[str, list[Any]] = {}
        self.closed = False

    def put(self, item: Any, *, key: str) -> None:
        self.items.setdefault(key, []).append(item)

    def shutdown(self) -> None:
        self.closed = True


class _Streamed:
    """The actor's streamed update: ``wait`` consumes each rank's items up to its end marker."""

    def __init__(self, world: World, channel: _FakeChannel, key: str, fail: bool) -> None:
        self.world, self.channel, self.key, self.fail = world, channel, key, fail

    def done(self) -> bool:
        return self.fail

    def wait(self, timeout: float | None = None) -> list[dict[str, float]]:
        assert timeout is not None, "every wait needs a timeout"
        if self.fail:
            raise RuntimeError("actor rank 0 failed: CUDA out of memory")
        items = self.channel.items[f"{self.key}/0"]
        assert items[-1] is None, "the driver ends every rank's stream"
        self.world.batches += items[:-1]
        return [{"actor/policy_loss": 0.5, "actor/num_micro_batches": float(len(items) - 1)}]


def _pipelined(
    tmp_path: Path, world: World, *, fail: bool = False, **kwargs: Any
) -> tuple[ReasoningRunner, _FakeChannel]:
    runner = _runner(tmp_path, world, **kwargs)
    runner.pipeline = True
    channel = _FakeChannel()
    runner._stream = channel  # type: ignore[assignment]  # the fake stands in for a Ray channel
    base_call = world.actor.call

    def call(fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        if fn.__name__ == "run_training_stream":
            world.log.append("actor.run_training_stream")
            return _Streamed(world, args[0], args[1], fail)
        return base_call(fn, *args, **kw)

    world.actor.call = call  # type: ignore[method-assign]
    return runner, channel


def test_pipelined_step_streams_scored_groups_into_micro_batches(tmp_path: Path) -> None:
    """One request per prompt (4 samples), scored as it finishes; every 4 kept sequences (micro-batch 2 x
    2 ranks would be 4; here batch_multiple 4) go to the actor with their group's GRPO advantages; one end
    marker per rank after the last generation batch."""
    world = World()
    world.correct_of = lambda i: i % 4 in (0, 1)  # every group of 4: two right, two wrong
    runner, channel = _pipelined(tmp_path, world, max_epochs=1, val_check_interval=-1, save_interval=-1)
    runner.batch_multiple = 4
    runner.chunk_prompts = 1
    metrics = runner.pipelined_step()
    assert world.log == [
        "actor.run_training_stream",
        "rollout.generate",
        "rollout.generate",  # requested before the first chunk is scored: the rollout never waits
        "reward.compute",
        "reward.compute",
    ]
    (queue,) = channel.items.values()  # one actor rank: one queue, two micro-batches and the end marker
    assert len(queue) == 3 and queue[-1] is None
    micro = world.batches
    assert len(micro) == 2 and all(b["input_ids"].shape[0] == 4 for b in micro)
    for b in micro:
        rewards = b["rewards"]
        adv = b["advantages"][b["loss_mask"].astype(bool)]
        assert sorted(rewards.tolist()) == [0.0, 0.0, 1.0, 1.0]
        # GRPO over the group: (r - mean) / (unbiased std + eps) = ±0.866
        assert np.allclose(np.abs(adv), 0.5 / np.std([0, 0, 1, 1], ddof=1), atol=1e-4)
    assert metrics["train/num_sequences"] == 8 and metrics["train/actor/num_micro_batches"] == 2
    assert metrics["rollout/num_samples"] == 8 and metrics["train/skipped"] == 0.0
    assert metrics["adv/mean"] == pytest.approx(0.0, abs=1e-6)
    runner.release()
    assert channel.closed


def test_pipelined_step_with_dynamic_sampling_drops_flat_groups_and_keeps_generating(tmp_path: Path) -> None:
    world = World()
    world.correct_of = lambda i: i < 4  # the first group all right (no signal), then all wrong
    alg = AlgorithmConfig(
        adv_type="grpo", loss_type="actor", group_size=4, dynamic_sampling=True, max_num_gen_batches=2
    )
    runner, _channel = _pipelined(tmp_path, world, algorithm=alg, max_epochs=1)
    runner.batch_multiple, runner.chunk_prompts = 4, 1
    metrics = runner.pipelined_step()
    assert metrics["dapo/num_gen_batches"] == 2 and metrics["dapo/kept_groups"] == 0
    assert metrics["train/skipped"] == 1.0 and metrics["train/num_sequences"] == 0
    assert world.log.count("rollout.generate") == 4 and world.batches == []  # 2 batches x 2 prompts


def test_pipelined_step_raises_a_failed_update_at_once(tmp_path: Path) -> None:
    """An actor that failed mid-stream ends the step at the next chunk, not after all generation."""
    world = World()
    data = DataConfig(train_path="x", rollout_batch_size=4, max_prompt_length=8)  # 4 chunks of one prompt
    runner, _channel = _pipelined(tmp_path, world, fail=True, data=data, max_epochs=1)
    runner.batch_multiple, runner.chunk_prompts = 4, 1
    with pytest.raises(RuntimeError, match="CUDA out of memory"):
        runner.pipelined_step()
    assert world.log.count("rollout.generate") == 2  # the first chunk's result and the next request, not 4


def test_pipeline_refuses_what_it_cannot_stream(tmp_path: Path) -> None:
    world = World()
    with pytest.raises(ValueError, match=r"runner\.pipeline needs algorithm\.adv_type 'grpo'"):
        ReasoningRunner(
            RunnerConfig(progress_bar=False, logger=LoggerConfig(log_path=str(tmp_path), logger_backends=())),
            pipeline=True,
            actor=world.actor,
            rollout=world.rollout,
            reward=world.reward,
            algorithm=AlgorithmConfig(adv_type="reinpp", loss_type="actor", group_size=4),
            data=DataConfig(train_path="x", rollout_batch_size=2, max_prompt_length=8),
            encoder=FakeEncoder(),
            train_data=_dataset(4),
            sampling={"temperature": 1.0, "max_new_tokens": 8},
        )


def test_evaluation_in_chunks_shows_progress_and_keeps_the_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """eval_chunk=2 over 5 prompts on 2 rollout ranks: 3 calls of <= 2 prompts, results as one call gives."""
    whole = _runner(tmp_path / "whole", World(rollout_ws=2)).evaluate()
    world = World(rollout_ws=2)
    runner = _runner(tmp_path / "chunked", world, eval_chunk=2, progress_bar=True)
    chunked = runner.evaluate()
    # 3 calls x 2 ranks; each call's prompts are split over the ranks (2 -> 1+1, the last 1 -> 1+0)
    assert [n for _, n, _ in world.gen_calls] == [1, 1, 1, 1, 1, 0]
    assert {k: v for k, v in chunked.items() if not k.startswith("time/")} == {
        k: v for k, v in whole.items() if not k.startswith("time/")
    }
    bar = capsys.readouterr().err
    assert "eval:" in bar and "/5 [" in bar and "prompt/s" in bar  # tqdm throttles the later redraws
    with pytest.raises(ValueError, match="eval_chunk must be >= 1"):
        _runner(tmp_path / "bad", World(), eval_chunk=0)
