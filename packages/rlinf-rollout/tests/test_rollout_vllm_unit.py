"""VLLMEngine parts that need no vLLM: options, weight-name mapping, and the server process life cycle.

The life-cycle tests start the real ``_vllm_server.py`` (or a stand-in executable) as the "vLLM python", so the
start-up handshake, crash reports with the log tail and timeouts are exercised without vLLM installed.
"""

from __future__ import annotations

import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from rlinf_models.llm import LLMModelConfig
from rlinf_rollout.llm._vllm import (
    SERVER_SCRIPT,
    VLLMEngine,
    VLLMServerError,
    _checkpoint_weight_names,
    _map_to_checkpoint,
    _prepare_tensors,
)
from rlinf_rollout.llm._vllm_options import VLLMOptions, default_vllm_python

torch.set_num_threads(1)


def _fake_checkpoint(path: Path, names: list[str]) -> Path:
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text("{}")
    save_file({n: torch.zeros(2) for n in names}, str(path / "model.safetensors"))
    return path


def _executable(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


# ------------------------------------------------------------------------------------------------ options
def test_options_validate_fields() -> None:
    with pytest.raises(ValueError, match="seed"):
        VLLMOptions(engine_args={"seed": 1})
    with pytest.raises(ValueError, match="kv_cache_space_gib"):
        VLLMOptions(kv_cache_space_gib=0)
    with pytest.raises(ValueError, match="dtype"):
        VLLMOptions(dtype="int8")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        VLLMOptions(gpu_memory_utilization=1.5)
    opts = VLLMOptions(engine_args={"max_num_batched_tokens": 512}, env={"VLLM_CPU_OMP_THREADS_BIND": "0"})
    assert opts.engine_args == {"max_num_batched_tokens": 512}


def test_default_python_order(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RLINF_VLLM_PYTHON", "/some/python")
    assert default_vllm_python() == "/some/python"
    monkeypatch.delenv("RLINF_VLLM_PYTHON")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    monkeypatch.setenv("RLINF_VLLM_VENV", str(venv))
    assert default_vllm_python() == str(venv / "bin" / "python")


# ---------------------------------------------------------------------------------------- weight names
def test_checkpoint_names_from_safetensors_headers(tmp_path: Path) -> None:
    ckpt = _fake_checkpoint(tmp_path / "m", ["model.embed_tokens.weight", "model.norm.weight"])
    assert _checkpoint_weight_names(ckpt) == {"model.embed_tokens.weight", "model.norm.weight"}
    with pytest.raises(FileNotFoundError, match="safetensors"):
        _checkpoint_weight_names(tmp_path)


def test_map_strips_wrapper_prefix_and_drops_extras() -> None:
    names = frozenset({"model.embed_tokens.weight", "model.norm.weight"})
    w = {n: torch.randn(2) for n in names}
    direct = {**w, "lm_head.weight": torch.randn(2)}
    assert set(_map_to_checkpoint(direct, names)) == names
    # CausalLMPolicy-style keys: the HF model under `model.`, plus a value head.
    wrapped = {"model." + k: v for k, v in w.items()} | {"value_head.weight": torch.randn(1, 2)}
    mapped = _map_to_checkpoint(wrapped, names)
    assert set(mapped) == names
    assert mapped["model.norm.weight"] is wrapped["model.model.norm.weight"]
    with pytest.raises(KeyError, match=r"lacks 1 of the checkpoint's 2 weights.*model.norm.weight"):
        _map_to_checkpoint({"model.embed_tokens.weight": torch.zeros(2)}, names)


def test_prepare_tensors_casts_and_unties() -> None:
    emb = torch.randn(4, 3)
    tensors = {"emb": emb, "head": emb, "step": torch.tensor([3]), "view": emb.t()}
    out = _prepare_tensors(tensors, "bfloat16")
    assert out["emb"].dtype == torch.bfloat16 and out["step"].dtype == torch.int64
    ptrs = [t.untyped_storage().data_ptr() for t in out.values()]
    assert len(set(ptrs)) == len(ptrs)
    assert out["view"].is_contiguous()
    torch.testing.assert_close(out["head"].float(), emb.bfloat16().float())
    # float32 tensors already contiguous and untied pass through (no copy needed)
    same = _prepare_tensors({"a": emb}, "float32")
    assert same["a"].data_ptr() == emb.data_ptr()


# ------------------------------------------------------------------------------------- server life cycle
def test_missing_python_names_the_setup_script(tmp_path: Path) -> None:
    ckpt = _fake_checkpoint(tmp_path / "m", ["w"])
    with pytest.raises(FileNotFoundError, match=r"setup_vllm_cpu\.sh"):
        VLLMEngine(LLMModelConfig(model_path=str(ckpt)), options=VLLMOptions(python=str(tmp_path / "nope")))


def test_server_without_vllm_reports_its_traceback(tmp_path: Path) -> None:
    # The real server script under this interpreter, which has no vLLM: start-up fails with its traceback.
    pytest.importorskip("safetensors")
    if _has_module("vllm"):
        pytest.skip("this interpreter has vLLM; the test needs one without")
    ckpt = _fake_checkpoint(tmp_path / "m", ["w"])
    t0 = time.monotonic()
    with pytest.raises(VLLMServerError, match=r"(?s)start-up.*No module named 'vllm'"):
        VLLMEngine(LLMModelConfig(model_path=str(ckpt)), options=VLLMOptions(python=sys.executable))
    assert time.monotonic() - t0 < 30


def test_crashing_server_raises_with_log_tail(tmp_path: Path) -> None:
    ckpt = _fake_checkpoint(tmp_path / "m", ["w"])
    python = _executable(tmp_path / "py", "echo 'fatal: marker-7731' >&2; exit 3")
    with pytest.raises(
        VLLMServerError, match=r"(?s)exited with code 3 while waiting for start-up.*marker-7731"
    ):
        VLLMEngine(LLMModelConfig(model_path=str(ckpt)), options=VLLMOptions(python=python))


def test_startup_timeout_kills_the_server(tmp_path: Path) -> None:
    ckpt = _fake_checkpoint(tmp_path / "m", ["w"])
    pid_file = tmp_path / "pid"
    python = _executable(tmp_path / "py", f"echo $$ > {pid_file}; exec sleep 60")
    t0 = time.monotonic()
    with pytest.raises(
        VLLMServerError, match=r"timed out after 1 s waiting for the vLLM server to answer start-up"
    ):
        VLLMEngine(
            LLMModelConfig(model_path=str(ckpt)), options=VLLMOptions(python=python, startup_timeout_s=1.0)
        )
    assert time.monotonic() - t0 < 20
    pid = int(pid_file.read_text())
    assert not Path(f"/proc/{pid}").exists() or "zombie" in _proc_state(pid)


def test_server_dies_with_the_engine_process(tmp_path: Path) -> None:
    # A stand-in `vllm` whose import blocks: the server is "loading the model" when its engine's process dies.
    fake = tmp_path / "fake" / "vllm"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("import time\ntime.sleep(120)\n")
    # The owner launches the server as VLLMEngine does (inherited socket, own session), sends `init`, and waits.
    code = (
        "import os, socket, subprocess, sys, time\n"
        "from multiprocessing.connection import Connection\n"
        "ours, theirs = socket.socketpair()\n"
        f"env = dict(os.environ, PYTHONPATH={str(fake.parent)!r})\n"
        f"subprocess.Popen([sys.executable, {str(SERVER_SCRIPT)!r}, '--fd', str(theirs.fileno())],\n"
        "    pass_fds=(theirs.fileno(),), env=env, start_new_session=True)\n"
        "Connection(ours.detach()).send(('init', {}))\n"
        "time.sleep(120)\n"
    )
    owner = subprocess.Popen([sys.executable, "-c", code])
    try:
        server = _wait_for(lambda: _child_running(owner.pid, "_vllm_server.py"), 60, "the server to start")
        time.sleep(1.0)  # let it reach `import vllm`
        owner.kill()
        owner.wait(timeout=10)
        _wait_for(lambda: not _alive(server), 20, "the orphaned server to exit")
    finally:
        owner.kill()
        owner.wait(timeout=10)


def test_server_script_imports_only_stdlib_at_top() -> None:
    # The server runs in vLLM's environment, where RLinf's packages are not installed.
    source = SERVER_SCRIPT.read_text()
    assert "rlinf" not in "\n".join(
        line for line in source.splitlines() if line.startswith(("import ", "from "))
    )


def _has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def _wait_for(fn: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def _child_running(ppid: int, needle: str) -> int | None:
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError, ValueError):
            continue
        if parent == ppid and needle in cmdline:
            return int(proc.name)
    return None


def _alive(pid: int) -> bool:
    return "zombie" not in _proc_state(pid)


def _proc_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().lower()
    except OSError:
        return "zombie"
