"""AgentRunner (multi-turn RL) against fake actor / agent-rollout / reward groups (no Ray, no model)."""

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
from rlinf_runners import (
    AgentRunner,
    LoggerConfig,
    RunnerConfig,
    SFTConfig,
    TurnRewardConfig,
    turn_advantages,
)


class _Done:
    def __init__(self, results: list[Any]) -> None:
        self.results = results

    def wait(self, timeout: float | None = None) -> list[Any]:
        assert timeout is not None, "every wait needs a timeout"
        return self.results


class _Group:
    def __init__(self, name: str, handlers: dict[str, Callable[..., Any]], world_size: int = 1) -> None:
        self.name, self.handlers, self.world_size = name, handlers, world_size
        self.calls: list[tuple[str, int, dict[str, Any]]] = []

    def _one(self, method: str, rank: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self.calls.append((method, rank, kwargs))
        handler = self.handlers.get(method)
        return handler(rank, *args, **kwargs) if handler else None

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> _Done:
        assert fn.__module__ == "rlinf_core.protocols._roles", f"runners call role methods, not {fn!r}"
        method = fn.__name__
        return _Done([self._one(method, r, args, kwargs) for r in range(self.world_size)])

    def execute_on(self, *ranks: int) -> Any:
        group = self

        class _R:
            def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> _Done:
                assert fn.__module__ == "rlinf_core.protocols._roles", (
                    f"runners call role methods, not {fn!r}"
                )
                method = fn.__name__
                return _Done([group._one(method, ranks[0], args, kwargs)])

        return _R()


class _Encoder:
    pad_token_id = 0

    def encode_prompt(self, example: PromptExample) -> list[int]:
        return [int(x) for x in example.prompt_text.split()] + [1]

    def encode_completion(self, text: str) -> list[int]:
        raise AssertionError("the agent runner builds demonstrations on the rollout group")


def _data(n: int, offset: int = 0) -> PromptDataset:
    rows = [
        PromptExample(
            messages=({"role": "user", "content": f"{10 + i + offset} {20 + i}"},),
            answers=(str(i + offset),),
            extra={"kind": "calc" if i % 2 else "search", "demo": ["CALL", f"ANS {i + offset}"]},
        )
        for i in range(n)
    ]
    return PromptDataset(rows, "fake")


def _episode(prompt: list[int], answer: str, *, error: bool, sample: int) -> dict[str, Any]:
    """Prompt, a 3-token tool-call turn, 2 tool tokens, a 2-token answer turn."""
    p = len(prompt)
    ids = [*prompt, 5, 6, 7, 90, 91, 8, 9]
    mask = [0] * p + [1, 1, 1, 0, 0, 1, 1]
    lps = [0.0] * p + [-0.1, -0.2, -0.3, 0.0, 0.0, -0.4, -0.5]
    turns = [
        {"start": p, "end": p + 3, "num_errors": int(error), "text": "CALL"},
        {"start": p + 5, "end": p + 7, "num_errors": 0},
    ]
    return {
        "prompt_ids": prompt,
        "token_ids": ids,
        "loss_mask": mask,
        "rollout_logprobs": lps,
        "turns": turns,
        "response_text": f"<answer>{answer}</answer>",
        "finish_reason": "answer",
        "num_tool_calls": 1,
        "num_tool_errors": int(error),
        "sample": sample,
    }


class World:
    def __init__(self, rollout_ws: int = 1) -> None:
        self.train_batches: list[dict[str, Any]] = []
        self.sft_batches: list[dict[str, Any]] = []
        self.n = 0
        self.actor = _Group(
            "actor",
            {
                "run_training": lambda r, b: self._record(self.train_batches, r, b, 1.0),
                "run_sft": lambda r, b: self._record(self.sft_batches, r, b, 2.0),
                "save_checkpoint": lambda r, path: (Path(path) / "actor.txt").write_text("x"),
                "load_checkpoint": lambda r, path: None,
            },
        )
        self.rollout = _Group(
            "rollout",
            {"run_episodes": self._episodes, "build_demonstrations": self._demos},
            world_size=rollout_ws,
        )
        self.reward = _Group("reward", {"compute": self._reward})

    @staticmethod
    def _record(
        store: list[dict[str, Any]], rank: int, batch: dict[str, Any], loss: float
    ) -> dict[str, float]:
        if rank == 0:
            store.append(batch)
        return {"loss": loss}

    def _share(self, rank: int, items: list[Any]) -> list[Any]:
        ws = self.rollout.world_size
        per = -(-len(items) // ws)
        return items[rank * per : (rank + 1) * per]

    def _episodes(self, rank: int, requests: list[dict[str, Any]], sampling: dict[str, Any]) -> Any:
        # Position k in the call: even positions answer right; position 0 has a tool error.
        positions = self._share(rank, list(range(len(requests))))
        return [
            _episode(requests[k]["prompt_ids"], "ok" if k % 2 == 0 else "no", error=k == 0, sample=k)
            for k in positions
        ]

    def _demos(self, rank: int, requests: list[dict[str, Any]]) -> Any:
        assert all(r["demo"] for r in requests)
        return [
            {
                "prompt_ids": r["prompt_ids"],
                "token_ids": [*r["prompt_ids"], 5, 90, 6],
                "loss_mask": [0] * len(r["prompt_ids"]) + [1, 0, 1],
            }
            for r in self._share(rank, requests)
        ]

    @staticmethod
    def _reward(rank: int, texts: list[str], refs: list[list[str]]) -> dict[str, Any]:
        rewards = [1.0 if "ok" in t else 0.0 for t in texts]
        return {"rewards": rewards, "correct": [r > 0 for r in rewards]}


def _runner(world: World, tmp_path: Path, **kw: Any) -> AgentRunner:
    cfg = RunnerConfig(
        max_epochs=kw.pop("steps", 2),
        val_check_interval=1,
        save_interval=1,
        progress_bar=False,
        step_timeout_s=5.0,
        logger=LoggerConfig(log_path=str(tmp_path), logger_backends=()),
    )
    return AgentRunner(
        cfg,
        actor=world.actor,
        rollout=world.rollout,
        reward=world.reward,
        algorithm=kw.pop(
            "algorithm", AlgorithmConfig(adv_type="grpo_dynamic", loss_type="actor", group_size=2)
        ),
        data=DataConfig(train_path="x", rollout_batch_size=2, shuffle=False),
        encoder=_Encoder(),
        train_data=_data(4),
        sampling={"temperature": 1.0},
        eval_data=_data(3, offset=100),
        sft=SFTConfig(steps=2, batch_size=2),
        sft_data=_data(4),
        turn_reward=TurnRewardConfig(tool_error_penalty=0.5),
        **kw,
    )


def test_turn_advantages_follow_grpo_dynamic() -> None:
    eps = [{"turns": [{"num_errors": 1}, {"num_errors": 0}]}, {"turns": [{"num_errors": 0}]}]
    adv, rewards = turn_advantages(eps, [1.0, 0.0], group_size=2, tool_error_penalty=0.5)
    assert rewards == [0.5, 1.0, 0.0]
    r = np.asarray(rewards)
    expected = (r - r.mean()) / (r.std(ddof=1) + 1e-6)
    assert np.allclose([a for ep in adv for a in ep], expected)
    adv_t, _ = turn_advantages(
        eps, [1.0, 0.0], group_size=2, advantage_mode="trajectory", tool_error_penalty=0.5
    )
    per_traj = np.asarray([0.75, 0.0])
    norm = (per_traj - per_traj.mean()) / (per_traj.std(ddof=1) + 1e-6)
    assert np.allclose(adv_t[0], [norm[0]] * 2) and np.allclose(adv_t[1], [norm[1]])
    adv_g, _ = turn_advantages(eps, [1.0, 0.0], group_size=2, adv_type="grpo")
    assert adv_g[0][0] == adv_g[0][1] > 0 > adv_g[1][0]
    with pytest.raises(ValueError, match="allowed"):
        turn_advantages(eps, [1.0, 0.0], group_size=2, adv_type="gae")


@pytest.mark.parametrize("rollout_ws", [1, 2])
def test_runner_trains_model_turns_only_with_per_turn_advantages(tmp_path: Path, rollout_ws: int) -> None:
    world = World(rollout_ws)
    result = _runner(world, tmp_path).run()
    assert result.global_step == 2 and is_complete(result.last_checkpoint)
    # SFT: demonstrations built once, the loss mask is the demonstration's (tool token 90 untrained).
    assert sum(1 for c in world.rollout.calls if c[0] == "build_demonstrations") == rollout_ws
    assert len(world.sft_batches) == 2
    sft = world.sft_batches[0]
    assert (sft["input_ids"][sft["loss_mask"]] != 90).all() and sft["loss_mask"].sum() == 4
    # RL: 2 prompts x group 2 = 4 episodes per step; advantages sit on the model turns only.
    batch = world.train_batches[0]
    assert batch["input_ids"].shape[0] == 4
    mask = batch["loss_mask"]
    assert mask.sum() == 4 * 5
    assert (batch["input_ids"][mask] < 90).all()  # tool tokens 90, 91 are never trained
    assert (batch["advantages"][~mask] == 0).all()
    assert np.allclose(batch["rollout_logprobs"][mask].reshape(4, 5)[0], [-0.1, -0.2, -0.3, -0.4, -0.5])
    # Episode 0: right but its first turn errored -> its first turn's advantage is below its second's.
    row = batch["advantages"][0][mask[0]]
    assert row[0] < row[3] and row[0] == row[1] == row[2] and row[3] == row[4]
    # Episode 1: wrong -> negative advantages.
    assert (batch["advantages"][1][mask[1]] < 0).all()
    records = read_metrics(result.metrics_file)
    evals = [r for r in records if "eval/success_rate" in r]
    assert [r["step"] for r in evals] == [0, 1, 2]
    assert all(r["eval/num_episodes"] == 3 for r in evals)
    assert "eval/success_rate_calc" in evals[0] and "eval/success_rate_search" in evals[0]
    dumped = (tmp_path / "episodes" / "eval_step2.jsonl").read_text().splitlines()
    assert len(dumped) == 3 and json.loads(dumped[0])["turns"][0]["text"] is not None
    train = [r for r in records if "train/loss" in r]
    assert len(train) == 2 and all(r["rollout/success_rate"] == 0.5 for r in train)
    assert all(r["rollout/num_episodes"] == 4 and r["rollout/tool_calls_mean"] == 1 for r in train)


def test_dynamic_sampling_drops_groups_without_signal(tmp_path: Path) -> None:
    world = World()
    world._reward = lambda rank, texts, refs: {"rewards": [0.0] * len(texts), "correct": [False] * len(texts)}  # type: ignore[method-assign]
    world.reward.handlers["compute"] = world._reward
    alg = AlgorithmConfig(adv_type="grpo_dynamic", loss_type="actor", group_size=2, dynamic_sampling=True)
    runner = _runner(world, tmp_path, steps=1, algorithm=alg)
    runner.turn_reward = TurnRewardConfig(tool_error_penalty=0.0)
    runner.sft_done = True
    metrics = runner.train_step()
    assert metrics["train/skipped"] == 1.0 and metrics["dapo/kept_groups"] == 0 and world.train_batches == []


def test_bad_settings_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not supported by the agent runner"):
        _runner(World(), tmp_path, algorithm=AlgorithmConfig(adv_type="gae"))
    with pytest.raises(ValueError, match="'demo'"):
        AgentRunner(
            RunnerConfig(logger=LoggerConfig(log_path=str(tmp_path), logger_backends=())),
            actor=World().actor,
            rollout=World().rollout,
            reward=World().reward,
            algorithm=AlgorithmConfig(adv_type="grpo_dynamic", group_size=2),
            data=DataConfig(train_path="x"),
            encoder=_Encoder(),
            train_data=_data(2),
            sampling={},
            sft=SFTConfig(steps=1),
            sft_data=PromptDataset(
                [PromptExample(messages=({"role": "user", "content": "1"},))], "demo-less"
            ),
        )


def test_evaluation_runs_in_chunks_in_order(tmp_path: Path) -> None:
    """eval_chunk=2 over the 3 held-out tasks: two run_episodes calls (2 + 1), episodes in task order."""
    world = World()
    seen: list[list[list[int]]] = []
    answer = world.rollout.handlers["run_episodes"]

    def record(rank: int, requests: list[dict[str, Any]], sampling: dict[str, Any]) -> Any:
        seen.append([r["prompt_ids"] for r in requests])
        return answer(rank, requests, sampling)

    world.rollout.handlers["run_episodes"] = record
    runner = _runner(world, tmp_path, eval_chunk=2)
    metrics = runner.evaluate()
    assert [len(s) for s in seen] == [2, 1]
    assert [p for s in seen for p in s] == runner._eval_ids
    # positions 0 of each call answer right: tasks 0 and 2 succeed, task 1 fails
    assert metrics["eval/success_rate"] == pytest.approx(2 / 3)
