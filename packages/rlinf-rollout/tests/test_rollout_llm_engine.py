from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

from rlinf_models.llm import LLMModelConfig, load_causal_lm
from rlinf_models.llm.testing import make_tiny_model_dir
from rlinf_rollout.llm import (
    GenerationEngine,
    HFGenerateEngine,
    LLMRolloutConfig,
    SamplingConfig,
    build_engine,
)

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model_dir(
        tmp_path_factory.mktemp("tiny_llm"), arch="qwen2", hidden_size=64, num_layers=2
    )


@pytest.fixture(scope="module")
def engine(model_dir: Path) -> HFGenerateEngine:
    eng = build_engine(
        LLMRolloutConfig(max_batch_size=2, device="cpu"), LLMModelConfig(model_path=str(model_dir))
    )
    assert isinstance(eng, HFGenerateEngine)
    return eng


@pytest.fixture(scope="module")
def prompts(engine: HFGenerateEngine) -> list[list[int]]:
    texts = ["What is 3 + 4?", "hello", "the answer is 12 apples and", "Compute 5 * 6 =", "cats"]
    return [engine.tokenizer.encode(t) for t in texts]


def _policy_logprobs(
    model: Any, prompts: list[list[int]], outs: list[Any], temperature: float
) -> list[torch.Tensor]:
    """``CausalLMPolicy`` logprobs of each output's tokens, on the actor's batch layout.

    One forward over ``[N, P + R]``: prompts left-padded to end at column ``P``, responses right-padded.
    """
    from rlinf_models.llm import CausalLMPolicy

    pad = 0
    width = max(len(p) for p in prompts)
    resp = max(len(o.token_ids) for o in outs)
    ids = torch.full((len(prompts), width + resp), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, (p, o) in enumerate(zip(prompts, outs, strict=True)):
        row = p + o.token_ids
        ids[r, width - len(p) : width - len(p) + len(row)] = torch.tensor(row)
        mask[r, width - len(p) : width + len(o.token_ids)] = 1
    with torch.no_grad():
        lp = CausalLMPolicy(model)(ids, mask, temperature=temperature)["logprobs"]
    return [lp[r, width : width + len(o.token_ids)] for r, o in enumerate(outs)]


def _assert_logprobs_match(model: Any, prompts: list[list[int]], outs: list[Any], temperature: float) -> None:
    refs = _policy_logprobs(model, prompts, outs, temperature)
    for o, ref in zip(outs, refs, strict=True):
        assert len(o.logprobs) == len(o.token_ids) >= 1
        torch.testing.assert_close(torch.tensor(o.logprobs), ref, atol=1e-4, rtol=1e-4)


def _assert_same(outs: list[Any], refs: list[Any]) -> None:
    """Same tokens, text and finish reasons; logprobs equal up to float rounding (CPU kernels may differ in
    the last bits between calls)."""
    assert [(o.token_ids, o.text, o.finish_reason) for o in outs] == [
        (r.token_ids, r.text, r.finish_reason) for r in refs
    ]
    for o, r in zip(outs, refs, strict=True):
        assert o.logprobs == pytest.approx(r.logprobs, abs=1e-5)


# ------------------------------------------------------------------------------------------- configs
def test_sampling_config_is_validated() -> None:
    for bad, field in [
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": 0}, "top_k"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"stop": ("",)}, "stop"),
    ]:
        with pytest.raises(ValueError, match=field):
            SamplingConfig(**bad)
    assert SamplingConfig(stop="</a>").stop == ("</a>",)
    assert SamplingConfig(stop=["x", "y"]).stop == ("x", "y")
    base = SamplingConfig(temperature=0.5)
    assert base.updated({"top_k": 3, "stop": ["z"]}) == SamplingConfig(temperature=0.5, top_k=3, stop=("z",))
    assert base.updated(None) is base
    with pytest.raises(ValueError, match=r"unknown sampling field\(s\) \['temprature'\]"):
        base.updated({"temprature": 1.0})
    assert SamplingConfig(temperature=0).greedy and SamplingConfig(temperature=0).logprob_temperature == 1.0


def test_rollout_config_is_validated() -> None:
    with pytest.raises(ValueError, match="engine"):
        LLMRolloutConfig(engine="tgi")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_batch_size"):
        LLMRolloutConfig(max_batch_size=0)
    with pytest.raises(ValueError, match="recv_timeout_s"):
        LLMRolloutConfig(recv_timeout_s=0)
    from rlinf_rollout.llm import VLLMOptions

    assert isinstance(LLMRolloutConfig().vllm, VLLMOptions)


def test_importing_the_package_does_not_load_transformers_torch_or_ray() -> None:
    code = (
        "import sys, rlinf_rollout, rlinf_rollout.llm\n"
        "rlinf_rollout.llm.SamplingConfig(); rlinf_rollout.llm.LLMRolloutConfig()\n"
        "print(sorted(m for m in ('transformers', 'torch', 'ray') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"


# -------------------------------------------------------------------------------------------- engine
def test_engine_satisfies_the_protocol(engine: HFGenerateEngine) -> None:
    assert isinstance(engine, GenerationEngine)


def test_greedy_matches_raw_generate_and_policy_logprobs(
    engine: HFGenerateEngine, prompts: list[list[int]]
) -> None:
    outs = engine.generate(prompts, SamplingConfig(temperature=0, max_new_tokens=12))
    assert [o.prompt_token_ids for o in outs] == prompts
    for p, o in zip(prompts, outs, strict=True):
        ids = torch.tensor([p])
        raw = engine.model.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=12
        )[0, len(p) :].tolist()
        assert o.token_ids == raw[: len(o.token_ids)]
    _assert_logprobs_match(engine.model, prompts, outs, 1.0)


@pytest.mark.parametrize("temperature", [0.7, 1.3])
def test_sampled_logprobs_equal_policy_logprobs_at_the_temperature(
    engine: HFGenerateEngine, prompts: list[list[int]], temperature: float
) -> None:
    # 5 prompts of different lengths, micro-batches of 2: left padding and batching must not change them.
    sampling = SamplingConfig(temperature=temperature, top_p=0.9, max_new_tokens=10, seed=3)
    outs = engine.generate(prompts, sampling)
    assert all(1 <= len(o.token_ids) <= 10 for o in outs)
    assert len({tuple(o.token_ids) for o in outs}) == len(outs)
    _assert_logprobs_match(engine.model, prompts, outs, temperature)


def test_seeded_sampling_is_reproducible(engine: HFGenerateEngine, prompts: list[list[int]]) -> None:
    sampling = SamplingConfig(max_new_tokens=8, seed=11)
    first = engine.generate(prompts, sampling)
    _assert_same(engine.generate(prompts, sampling), first)
    other = engine.generate(prompts, attrs_evolve(sampling, seed=12))
    assert [o.token_ids for o in other] != [o.token_ids for o in first]


def test_top_k_one_is_greedy(engine: HFGenerateEngine, prompts: list[list[int]]) -> None:
    greedy = engine.generate(prompts, SamplingConfig(temperature=0, max_new_tokens=8))
    top1 = engine.generate(prompts, SamplingConfig(temperature=0.8, top_k=1, max_new_tokens=8, seed=0))
    assert [o.token_ids for o in top1] == [o.token_ids for o in greedy]


def test_batch_size_does_not_change_greedy_outputs(model_dir: Path, prompts: list[list[int]]) -> None:
    cfg = LLMModelConfig(model_path=str(model_dir))
    one = HFGenerateEngine(cfg, max_batch_size=1, device="cpu")
    many = HFGenerateEngine(cfg, max_batch_size=8, device="cpu")
    sampling = SamplingConfig(temperature=0, max_new_tokens=8)
    a, b = one.generate(prompts, sampling), many.generate(prompts, sampling)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-4, rtol=1e-4)


def test_stop_strings_cut_the_generation(engine: HFGenerateEngine, prompts: list[list[int]]) -> None:
    greedy = SamplingConfig(temperature=0, max_new_tokens=16)
    (full,) = engine.generate(prompts[:1], greedy)
    assert full.finish_reason == "length" and len(full.text) > 6
    stop = full.text[3:6]  # a string the model writes after a few tokens
    start = full.text.find(stop)
    (kept,) = engine.generate(prompts[:1], attrs_evolve(greedy, stop=("never-there", stop)))
    assert kept.finish_reason == "stop"
    assert kept.text == full.text[: start + len(stop)]
    assert kept.token_ids == full.token_ids[: len(kept.token_ids)]  # the last token completes the stop string
    assert stop in engine.tokenizer.decode(kept.token_ids) and stop not in engine.tokenizer.decode(
        kept.token_ids[:-1]
    )
    assert kept.logprobs == pytest.approx(full.logprobs[: len(kept.token_ids)], abs=1e-5)
    (cut,) = engine.generate(
        prompts[:1], attrs_evolve(greedy, stop=(stop,), include_stop_str_in_output=False)
    )
    assert cut.text == full.text[:start] and cut.token_ids == kept.token_ids


def test_eos_ends_a_row_while_the_others_continue(model_dir: Path, prompts: list[list[int]]) -> None:
    eng = HFGenerateEngine(LLMModelConfig(model_path=str(model_dir)), max_batch_size=8, device="cpu")
    eos = eng.tokenizer.eos_token_id
    # Point the (tied) output row of eos along the first prompt's last hidden state: eos is its greedy token.
    with torch.no_grad():
        ids = torch.tensor([prompts[0]])
        hidden = eng.model(ids, output_hidden_states=True).hidden_states[-1][0, -1]
        state = {k: v.clone() for k, v in eng.model.state_dict().items()}
        state["model.embed_tokens.weight"][eos] = 50.0 * hidden / hidden.norm()
        if "lm_head.weight" in state:
            state["lm_head.weight"][eos] = state["model.embed_tokens.weight"][eos]
    eng.update_weights(state)
    outs = eng.generate(prompts, SamplingConfig(temperature=0, max_new_tokens=6))
    assert outs[0].token_ids == [eos] and outs[0].finish_reason == "stop" and outs[0].text == ""
    assert len(outs[0].logprobs) == 1 and outs[0].logprobs[0] > -1e-3  # ~probability 1
    for o in outs[1:]:
        assert eos not in o.token_ids[:-1]
        if o.finish_reason == "length":
            assert len(o.token_ids) == 6 and o.token_ids[-1] != eos
        else:
            assert o.token_ids[-1] == eos


def test_update_weights_changes_generation_and_maps_wrapper_keys(
    model_dir: Path, prompts: list[list[int]]
) -> None:
    cfg = LLMModelConfig(model_path=str(model_dir))
    eng = HFGenerateEngine(cfg, max_batch_size=4, device="cpu")
    greedy = SamplingConfig(temperature=0, max_new_tokens=8)
    before = eng.generate(prompts, greedy)
    other = load_causal_lm(cfg)
    torch.manual_seed(5)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.5 * torch.randn_like(p))
    # What the actor sends: its CausalLMPolicy's state dict ("model."-prefixed keys plus a value head).
    from rlinf_models.llm import CausalLMPolicy

    wrapped = CausalLMPolicy(other, add_value_head=True).state_dict()
    assert "value_head.weight" in wrapped and "model.lm_head.weight" in wrapped
    eng.update_weights(wrapped)
    after = eng.generate(prompts, greedy)
    assert [o.token_ids for o in after] != [o.token_ids for o in before]
    _assert_logprobs_match(other, prompts, after, 1.0)
    with pytest.raises(KeyError, match="lacks"):
        eng.update_weights({"model.norm.weight": torch.ones(64)})


def test_offload_onload_and_shutdown(model_dir: Path, prompts: list[list[int]]) -> None:
    eng = HFGenerateEngine(LLMModelConfig(model_path=str(model_dir)), max_batch_size=4, device="cpu")
    greedy = SamplingConfig(temperature=0, max_new_tokens=4)
    ref = eng.generate(prompts[:2], greedy)
    eng.offload()
    assert next(eng.model.parameters()).device.type == "cpu"
    with pytest.raises(RuntimeError, match="onload"):
        eng.generate(prompts[:2], greedy)
    eng.onload()
    _assert_same(eng.generate(prompts[:2], greedy), ref)
    eng.shutdown()
    eng.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        eng.generate(prompts[:2], greedy)


def test_bad_prompts_are_rejected(engine: HFGenerateEngine) -> None:
    assert engine.generate([], SamplingConfig()) == []
    with pytest.raises(ValueError, match=r"prompts\[1\] is empty"):
        engine.generate([[1, 2], []], SamplingConfig())
    with pytest.raises(ValueError, match=r"prompts\[0\] must hold integer token ids"):
        engine.generate([[1.5]], SamplingConfig())  # type: ignore[list-item]


def attrs_evolve(cfg: SamplingConfig, **changes: Any) -> SamplingConfig:
    return cfg.updated(changes)


def test_stop_check_sees_multibyte_stop_strings_spread_over_byte_tokens(engine: HFGenerateEngine) -> None:
    from rlinf_rollout.llm._hf import _StopOnStrings

    tok = engine.tokenizer
    prompt = tok.encode("hello")
    body = tok.encode(" so 北京大学清华大学 then")  # CJK text: several byte-level tokens per character
    stop = "北京大学清华大学"
    crit = _StopOnStrings(tok, (stop,), prompt_len=len(prompt), batch=1)
    first = None
    for n in range(1, len(body) + 1):
        done = crit(torch.tensor([prompt + body[:n]]), None)
        if first is None and bool(done[0]):
            first = n - 1
    assert first is not None and crit.stop_step == [first]
    assert stop in tok.decode(body[: first + 1]) and stop not in tok.decode(body[:first])
