"""SGLangEngine without a GPU: sampling-param translation, response parsing, and the engine's calls into a
recording stand-in for ``sglang.Engine`` (the real engine needs CUDA; see the gpu-marked module)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch
from rlinf_rollout.llm import (
    GenerationEngine,
    GenerationOutput,
    LLMRolloutConfig,
    SamplingConfig,
    SGLangOptions,
    build_engine,
)
from rlinf_rollout.llm import _sglang as sg
from rlinf_rollout.llm._sglang import SGLangEngine, parse_sglang_output, sglang_sampling_params

torch.set_num_threads(1)


def _response(
    ids: list[int], lps: list[float], *, kind: str = "length", matched: Any = None, text: str = "t"
):
    """A dict shaped like ``sglang.Engine.generate(..., return_logprob=True)`` returns for one request."""
    finish: dict[str, Any] = {"type": kind}
    if kind == "stop":
        finish["matched"] = matched
    return {
        "text": text,
        "output_ids": ids,
        "meta_info": {
            "id": "r0",
            "finish_reason": finish,
            "prompt_tokens": 3,
            "completion_tokens": len(ids),
            "output_token_logprobs": [(lp, t, None) for lp, t in zip(lps, ids, strict=True)],
        },
    }


# ------------------------------------------------------------------------------------------ translation
def test_sampling_params_translation() -> None:
    s = SamplingConfig(
        temperature=0.7, top_p=0.9, top_k=20, max_new_tokens=33, stop=("\n\n", "</answer>"), seed=5
    )
    p = sglang_sampling_params(s, index=3)
    assert p == {
        "max_new_tokens": 33,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 20,
        "stop": ["\n\n", "</answer>"],
        "no_stop_trim": True,
        "skip_special_tokens": True,
        "sampling_seed": 8,
    }
    greedy = sglang_sampling_params(SamplingConfig(temperature=0.0, include_stop_str_in_output=False))
    assert greedy["temperature"] == 0.0 and greedy["top_k"] == -1 and greedy["stop"] is None
    assert greedy["no_stop_trim"] is False and "sampling_seed" not in greedy


def test_sampling_params_are_valid_sglang_sampling_params(model_dir: Path) -> None:
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("sglang is not installed")
    try:
        from sglang.srt.sampling.sampling_params import SamplingParams
    except ImportError as e:  # an install without its runtime dependencies
        pytest.skip(f"sglang.srt.sampling does not import here: {e}")
    from rlinf_models.llm import load_tokenizer

    tokenizer = load_tokenizer(_model_cfg(model_dir))
    for s in (SamplingConfig(temperature=0.0), SamplingConfig(temperature=1.2, top_k=5, stop=("x",), seed=1)):
        params = SamplingParams(**sglang_sampling_params(s, index=1))
        params.normalize(tokenizer)
        params.verify(len(tokenizer))
        if s.greedy:
            assert params.top_k == 1  # SGLang's greedy
        else:
            assert params.temperature == 1.2 and params.top_k == 5 and params.sampling_seed == 2


# ---------------------------------------------------------------------------------------------- parsing
def test_parse_length_and_eos_stop() -> None:
    out = parse_sglang_output([1, 2, 3], _response([7, 8], [-0.5, -1.5]))
    assert out == GenerationOutput(
        prompt_token_ids=[1, 2, 3], token_ids=[7, 8], logprobs=[-0.5, -1.5], text="t", finish_reason="length"
    )
    eos = parse_sglang_output([1], _response([7, 2], [-0.1, -0.2], kind="stop", matched=2, text="ab"))
    assert eos.finish_reason == "stop" and eos.token_ids == [7, 2] and eos.text == "ab"


@pytest.mark.parametrize(("include", "expected"), [(True, "x = 4</answer>"), (False, "x = 4")])
def test_parse_stop_string_keeps_or_cuts_the_match(include: bool, expected: str) -> None:
    resp = _response(
        [5, 6, 9], [-1.0, -2.0, -3.0], kind="stop", matched="</answer>", text="x = 4</answer> tail"
    )
    out = parse_sglang_output([1], resp, stop=("</answer>",), include_stop=include)
    assert out.text == expected and out.token_ids == [5, 6, 9]


def test_parse_errors_are_explicit() -> None:
    with pytest.raises(RuntimeError, match="aborted the request: out of memory"):
        parse_sglang_output(
            [1],
            {"output_ids": [], "meta_info": {"finish_reason": {"type": "abort", "message": "out of memory"}}},
        )
    no_lp = _response([4], [-1.0])
    del no_lp["meta_info"]["output_token_logprobs"]
    with pytest.raises(RuntimeError, match="return_logprob=True"):
        parse_sglang_output([1], no_lp)
    bad = _response([4, 5], [-1.0, -1.0])
    bad["meta_info"]["output_token_logprobs"][1] = (-1.0, 6, None)
    with pytest.raises(RuntimeError, match="entry 1 is for token 6"):
        parse_sglang_output([1], bad)
    with pytest.raises(RuntimeError, match="unknown finish_reason"):
        parse_sglang_output([1], _response([4], [-1.0], kind="weird"))


def test_buckets_respect_the_byte_limit_and_order() -> None:
    sd = {f"w{i}": torch.zeros(10) for i in range(5)} | {"big": torch.zeros(100)}
    buckets = sg._buckets(sd, max_bytes=100)  # 40 bytes each -> 2 per bucket
    assert [[n for n, _ in b] for b in buckets] == [["w0", "w1"], ["w2", "w3"], ["w4"], ["big"]]


# ------------------------------------------------------------------------------ engine with a stand-in
class _FakeSGLang:
    """Records what :class:`SGLangEngine` asks of ``sglang.Engine`` and answers like it."""

    def __init__(self) -> None:
        self.instances: list[_FakeEngine] = []

    def Engine(self, **kwargs: Any) -> _FakeEngine:
        engine = _FakeEngine(kwargs)
        self.instances.append(engine)
        return engine


class _FakeEngine:
    def __init__(self, kwargs: dict[str, Any]) -> None:
        self.kwargs = kwargs
        self.calls: list[tuple[str, Any]] = []
        self.released = False

    def generate(
        self, *, input_ids: list[list[int]], sampling_params: list[dict], return_logprob: bool
    ) -> Any:
        assert not self.released and return_logprob
        self.calls.append(("generate", (input_ids, sampling_params)))
        out = []
        for ids, p in zip(input_ids, sampling_params, strict=True):
            n = min(p["max_new_tokens"], 2)
            toks = [(ids[-1] + k + 1) % 50 for k in range(n)]
            out.append(_response(toks, [-0.25 * (k + 1) for k in range(n)], text=f"{ids[-1]}"))
        return out[0] if len(out) == 1 else out

    def update_weights_from_tensor(self, *, named_tensors: list, flush_cache: bool) -> tuple[bool, str]:
        self.calls.append(("update", ([n for n, _ in named_tensors], flush_cache)))
        return True, "Succeeded to update model weights."

    def release_memory_occupation(self) -> None:
        self.calls.append(("release", None))
        self.released = True

    def resume_memory_occupation(self) -> None:
        self.calls.append(("resume", None))
        self.released = False

    def shutdown(self) -> None:
        self.calls.append(("shutdown", None))


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> _FakeSGLang:
    stand_in = _FakeSGLang()
    monkeypatch.setattr(sg, "sglang", stand_in)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(SGLangEngine, "_stage", lambda self, t: t)  # no GPU to stage weights on
    monkeypatch.delenv("SGLANG_RETURN_ORIGINAL_LOGPROB", raising=False)
    return stand_in


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rlinf_models.llm.testing import make_tiny_model_dir

    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny"), hidden_size=16, num_layers=1, vocab_size=300)


def _model_cfg(path: Path, **kw: Any):
    from rlinf_models.llm import LLMModelConfig

    return LLMModelConfig(model_path=str(path), **kw)


def test_engine_launches_sglang_with_translated_server_args(fake: _FakeSGLang, model_dir: Path) -> None:
    engine = SGLangEngine(
        _model_cfg(model_dir, dtype="bfloat16"),
        max_batch_size=3,
        seed=11,
        engine_kwargs={"attention_backend": "triton"},
    )
    assert isinstance(engine, GenerationEngine)
    kw = fake.instances[0].kwargs
    assert kw["model_path"] == str(model_dir) and kw["tokenizer_path"] == str(model_dir)
    assert (kw["dtype"], kw["random_seed"], kw["max_running_requests"], kw["tp_size"]) == (
        "bfloat16",
        11,
        3,
        1,
    )
    assert (
        kw["enable_memory_saver"] and kw["enable_weights_cpu_backup"] and kw["attention_backend"] == "triton"
    )


def test_generate_chunks_by_max_batch_size_and_keeps_order(fake: _FakeSGLang, model_dir: Path) -> None:
    engine = SGLangEngine(_model_cfg(model_dir), max_batch_size=2)
    prompts = [[1, 2, 3], [4], [5, 6], [7, 8, 9], [10]]
    outs = engine.generate(prompts, SamplingConfig(max_new_tokens=4, seed=100, temperature=0.9))
    gens = [c[1] for c in fake.instances[0].calls if c[0] == "generate"]
    assert [len(ids) for ids, _ in gens] == [2, 2, 1]
    seeds = [p["sampling_seed"] for _, params in gens for p in params]
    assert seeds == [100, 101, 102, 103, 104]  # identical prompts would still differ
    assert [o.prompt_token_ids for o in outs] == prompts
    assert [o.token_ids for o in outs] == [[4, 5], [5, 6], [7, 8], [10, 11], [11, 12]]
    assert all(o.logprobs == [-0.25, -0.5] and o.finish_reason == "length" for o in outs)
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        engine.generate([[1], []], SamplingConfig())


def test_seeded_top_p_needs_the_pytorch_sampling_backend(fake: _FakeSGLang, model_dir: Path) -> None:
    seeded = SamplingConfig(top_p=0.9, seed=1, max_new_tokens=1)
    with pytest.raises(ValueError, match="sampling_backend"):
        SGLangEngine(_model_cfg(model_dir)).generate([[1]], seeded)
    engine = SGLangEngine(_model_cfg(model_dir), engine_kwargs={"sampling_backend": "pytorch"})
    assert engine.generate([[1]], seeded)[0].token_ids == [2]
    plain = SGLangEngine(_model_cfg(model_dir))  # unseeded or untruncated sampling works on any backend
    assert plain.generate([[1]], SamplingConfig(top_p=0.9, max_new_tokens=1))[0].token_ids == [2]
    assert plain.generate([[1]], SamplingConfig(seed=1, max_new_tokens=1))[0].token_ids == [2]


def _untied_copy(model_dir: Path, dest: Path) -> Path:
    import json
    import shutil

    shutil.copytree(model_dir, dest)
    cfg = json.loads((dest / "config.json").read_text())
    (dest / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": False}))
    return dest


_SD = {
    "model.embed_tokens.weight": torch.zeros(4, 4),
    "model.norm.weight": torch.zeros(4),
    "lm_head.weight": torch.zeros(4, 4),
}


def test_update_weights_sends_buckets_and_flushes_once(
    fake: _FakeSGLang, model_dir: Path, tmp_path: Path
) -> None:
    engine = SGLangEngine(_model_cfg(_untied_copy(model_dir, tmp_path / "untied")), weight_bucket_bytes=64)
    engine.update_weights(_SD)
    updates = [c[1] for c in fake.instances[0].calls if c[0] == "update"]
    assert updates == [
        (["model.embed_tokens.weight"], False),
        (["model.norm.weight"], False),
        (["lm_head.weight"], True),
    ]


def test_update_weights_skips_lm_head_of_a_tied_model(fake: _FakeSGLang, model_dir: Path) -> None:
    engine = SGLangEngine(_model_cfg(model_dir), weight_bucket_bytes=64)  # the tiny model ties its embeddings
    engine.update_weights(_SD)
    updates = [c[1] for c in fake.instances[0].calls if c[0] == "update"]
    assert updates == [(["model.embed_tokens.weight"], False), (["model.norm.weight"], True)]


def test_update_weights_surfaces_a_rejection(
    fake: _FakeSGLang, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = SGLangEngine(_model_cfg(model_dir))
    monkeypatch.setattr(
        fake.instances[0], "update_weights_from_tensor", lambda **kw: (False, "shape mismatch for model.norm")
    )
    with pytest.raises(RuntimeError, match=r"shape mismatch for model\.norm"):
        engine.update_weights({"model.norm.weight": torch.zeros(2)})


def test_offload_onload_shutdown_lifecycle(fake: _FakeSGLang, model_dir: Path) -> None:
    engine = SGLangEngine(_model_cfg(model_dir))
    engine.offload()
    engine.offload()  # idempotent
    with pytest.raises(RuntimeError, match="offloaded"):
        engine.generate([[1]], SamplingConfig())
    engine.onload()
    assert engine.generate([[1]], SamplingConfig(max_new_tokens=1))[0].token_ids == [2]
    engine.shutdown()
    engine.shutdown()
    assert [c[0] for c in fake.instances[0].calls] == ["release", "resume", "generate", "shutdown"]
    with pytest.raises(RuntimeError, match="shut down"):
        engine.generate([[1]], SamplingConfig())


def test_offload_is_a_noop_without_the_memory_saver(fake: _FakeSGLang, model_dir: Path) -> None:
    engine = SGLangEngine(_model_cfg(model_dir), enable_memory_saver=False)
    engine.offload()
    assert engine.generate([[3]], SamplingConfig(max_new_tokens=1))[0].token_ids == [4]
    assert fake.instances[0].kwargs["enable_weights_cpu_backup"] is False


def test_build_engine_selects_sglang(fake: _FakeSGLang, model_dir: Path) -> None:
    engine = build_engine(LLMRolloutConfig(engine="sglang", max_batch_size=7, seed=3), _model_cfg(model_dir))
    assert isinstance(engine, SGLangEngine)
    assert (
        fake.instances[0].kwargs["max_running_requests"] == 7 and fake.instances[0].kwargs["random_seed"] == 3
    )


def test_constructor_errors(monkeypatch: pytest.MonkeyPatch, model_dir: Path) -> None:
    cfg = _model_cfg(model_dir)
    monkeypatch.setattr(sg, "sglang", None)
    with pytest.raises(ImportError, match="pip install"):
        SGLangEngine(cfg)
    monkeypatch.setattr(sg, "sglang", _FakeSGLang())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        SGLangEngine(cfg)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("SGLANG_RETURN_ORIGINAL_LOGPROB", "1")
    with pytest.raises(ValueError, match="SGLANG_RETURN_ORIGINAL_LOGPROB"):
        SGLangEngine(cfg)
    monkeypatch.delenv("SGLANG_RETURN_ORIGINAL_LOGPROB")
    with pytest.raises(ValueError, match="mem_fraction_static"):
        SGLangEngine(cfg, mem_fraction_static=1.5)


def _sglang_root() -> Path:
    spec = importlib.util.find_spec("sglang")
    if spec is None or spec.origin is None:
        pytest.skip("sglang is not installed")
    return Path(spec.origin).parent


def _server_args_fields(root: Path) -> set[str]:
    """Names of ``ServerArgs`` fields, read from the installed SGLang sources (without importing them)."""
    import ast

    fields: set[str] = set()
    for path in [root / "srt" / "server_args.py", *(root / "srt" / "arg_groups" / "fields").glob("*.py")]:
        if path.is_file():
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    fields.add(node.target.id)
    return fields


def test_calls_match_the_installed_sglang_engine_api() -> None:
    """Read (without importing: it needs CUDA libraries) the installed ``sglang.Engine`` and ``ServerArgs``
    sources and check every method, keyword and server argument the engine uses exists."""
    import ast

    root = _sglang_root()
    tree = ast.parse((root / "srt" / "entrypoints" / "engine.py").read_text())
    engine = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Engine")
    methods = {
        f.name: {a.arg for a in [*f.args.args, *f.args.kwonlyargs]}
        for f in engine.body
        if isinstance(f, ast.FunctionDef)
    }
    assert {"input_ids", "sampling_params", "return_logprob"} <= methods["generate"]
    assert {"named_tensors", "flush_cache"} <= methods["update_weights_from_tensor"]
    for name in ("release_memory_occupation", "resume_memory_occupation", "shutdown"):
        assert name in methods
    fields = _server_args_fields(root)
    used = {
        "model_path",
        "tokenizer_path",
        "dtype",
        "tp_size",
        "random_seed",
        "mem_fraction_static",
        "max_running_requests",
        "enable_memory_saver",
        "enable_weights_cpu_backup",
    }
    assert used <= fields, sorted(used - fields)


def test_server_args_names_exist_in_the_installed_sglang() -> None:
    """With SGLang's sources installed (a scratch venv), every ServerArgs name ``rollout.sglang`` produces exists."""
    fields = _server_args_fields(_sglang_root())
    options = SGLangOptions(
        dtype="bfloat16",
        attention_backend="triton",
        sampling_backend="pytorch",
        context_length=8,
        disable_cuda_graph=True,
    )
    assert set(options.server_args()) <= fields, sorted(set(options.server_args()) - fields)
