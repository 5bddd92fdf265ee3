"""SGLangEngine on a real GPU with a tiny model. Skipped without CUDA or SGLang.

NOT RUN in this repository (no GPU on the development machine); see docs/gpu_backends.md. Run on a GPU host
after ``uv pip install "sglang>=0.5"`` with ``uv run pytest -m gpu packages/rlinf-rollout/tests/test_rollout_sglang_gpu.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
pytest.importorskip("sglang", reason="needs sglang")

from rlinf_models.llm import CausalLMPolicy, LLMModelConfig, load_causal_lm  # noqa: E402
from rlinf_models.llm.testing import make_tiny_model_dir  # noqa: E402
from rlinf_rollout.llm import SamplingConfig  # noqa: E402
from rlinf_rollout.llm._sglang import SGLangEngine  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp("m"), arch="qwen2", hidden_size=64, num_layers=2)


@pytest.fixture(scope="module")
def engine(tiny: Path) -> Iterator[SGLangEngine]:
    eng = SGLangEngine(
        LLMModelConfig(model_path=str(tiny)), max_batch_size=8, seed=0, mem_fraction_static=0.3
    )
    yield eng
    eng.shutdown()


def _policy_logprobs(
    model_path: Path, prompt: list[int], tokens: list[int], temperature: float
) -> torch.Tensor:
    policy = CausalLMPolicy(load_causal_lm(LLMModelConfig(model_path=str(model_path)))).eval()
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        lp = policy(ids, torch.ones_like(ids), temperature=temperature)["logprobs"]
    return lp[0, len(prompt) :]


def test_generate_returns_logprobs_under_the_sampling_temperature(engine: SGLangEngine, tiny: Path) -> None:
    prompts = [[5, 6, 7, 8], [9, 10]]
    outs = engine.generate(prompts, SamplingConfig(temperature=0.8, max_new_tokens=12, seed=1))
    assert [o.prompt_token_ids for o in outs] == prompts
    for p, o in zip(prompts, outs, strict=True):
        assert len(o.token_ids) == len(o.logprobs) >= 1
        ref = _policy_logprobs(tiny, p, o.token_ids, 0.8)
        torch.testing.assert_close(torch.tensor(o.logprobs), ref.float(), rtol=2e-2, atol=2e-2)


def test_greedy_stop_string_and_length(engine: SGLangEngine) -> None:
    out = engine.generate([[5, 6, 7]], SamplingConfig(temperature=0.0, max_new_tokens=5))[0]
    assert out.finish_reason in ("stop", "length") and len(out.token_ids) <= 5
    again = engine.generate([[5, 6, 7]], SamplingConfig(temperature=0.0, max_new_tokens=5))[0]
    assert again.token_ids == out.token_ids


def test_update_weights_changes_generation_and_offload_keeps_them(engine: SGLangEngine, tiny: Path) -> None:
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=6)
    model = load_causal_lm(LLMModelConfig(model_path=str(tiny)))
    before = engine.generate([[5, 6, 7]], greedy)[0]
    state = dict(model.state_dict())
    state["model.norm.weight"] = torch.zeros_like(state["model.norm.weight"])  # every logit 0: uniform
    engine.update_weights(state)
    out = engine.generate([[5, 6, 7]], greedy)[0]
    assert out.logprobs != pytest.approx(before.logprobs, abs=1e-3)
    assert max(out.logprobs) - min(out.logprobs) < 1e-3  # the new weights are in use: a uniform distribution
    engine.offload()
    engine.onload()
    assert engine.generate([[5, 6, 7]], greedy)[0].logprobs == pytest.approx(out.logprobs, abs=1e-3)
    engine.update_weights(model.state_dict())  # restore for other tests
