"""The vLLM server process behind :class:`rlinf_rollout.llm.VLLMEngine` (run as a script, never imported).

It runs under the interpreter of the environment that has vLLM (on CPU: the venv of
``scripts/setup_vllm_cpu.sh``), so it imports only the standard library, ``vllm``, ``torch`` and
``safetensors`` — none of RLinf's packages, which need not be installed there.

Usage: ``<vllm python> _vllm_server.py --fd N``, where ``N`` is one end of a ``socket.socketpair`` inherited
from the engine. Messages are pickled tuples of builtins (``multiprocessing.connection`` framing):

- engine → server: ``("init", config)`` first, then ``(op, payload)`` with ``op`` one of ``generate``,
  ``update_weights``, ``sleep``, ``wake_up``, ``shutdown``;
- server → engine: ``("ready", info)`` / ``("ok", result)``, or ``("error", traceback_text)``.

The server exits on ``shutdown`` or when the engine's end of the socket closes (the engine died).
"""

from __future__ import annotations

import argparse
import gc
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any


def _load_safetensors_into_worker(worker: Any, path: str) -> int:
    """Runs in vLLM's worker: reload the model's weights in place from a safetensors file (HF names)."""
    from safetensors.torch import load_file

    state = load_file(path)
    # `reload_weights` maps checkpoint names (q/k/v, gate/up, ...) onto vLLM's fused parameters, like loading
    # the checkpoint from disk, and re-runs post-load weight processing.
    worker.reload_weights(weights_iterator=iter(state.items()), is_checkpoint_format=True)
    _retie_lm_head(worker)
    return len(state)


def _retie_lm_head(worker: Any) -> None:
    """Tie ``lm_head`` to the new input embeddings again after a layer-wise reload.

    With ``tie_word_embeddings`` the checkpoint has no ``lm_head.weight`` (vLLM's ``load_weights`` skips it),
    so vLLM 0.32's layer-wise reload restores the LM head's *previous* tensors while ``embed_tokens`` gets the
    new ones: the logits would come from stale weights. Share the embedding parameter again and redo the LM
    head's post-load processing (on CPU it prepacks the GEMM weight).
    """
    model = worker.model_runner.model
    text_config = worker.model_runner.model_config.hf_text_config
    if not getattr(text_config, "tie_word_embeddings", False):
        return
    lm_head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    if lm_head is None or embed is None or not hasattr(lm_head, "weight") or not hasattr(embed, "weight"):
        raise RuntimeError(
            f"{type(model).__name__} ties its embeddings but has no model.embed_tokens / lm_head to re-tie after "
            "a weight update"
        )
    lm_head.weight = embed.weight
    quant_method = getattr(lm_head, "quant_method", None)
    if quant_method is not None:
        quant_method.process_weights_after_loading(lm_head)


class _Server:
    def __init__(self, config: dict[str, Any]) -> None:
        import vllm
        from vllm.platforms import current_platform

        self.vllm = vllm
        self.on_cpu = bool(current_platform.is_cpu())
        sleep_mode = config["enable_sleep_mode"]
        if sleep_mode is None:
            sleep_mode = bool(current_platform.is_cuda_alike())
        self.sleep_mode = bool(sleep_mode) and not self.on_cpu
        kv_gib = config["kv_cache_space_gib"]
        if kv_gib is None and self.on_cpu:
            kv_gib = 1.0
        kwargs: dict[str, Any] = dict(config["engine_args"])
        kwargs.update(
            model=config["model"],
            tokenizer=config["tokenizer"],
            dtype=config["dtype"],
            seed=config["seed"],
            max_num_seqs=config["max_num_seqs"],
            # Logprobs after temperature (and top-k/top-p): the distribution the token was drawn from.
            logprobs_mode="processed_logprobs",
            enforce_eager=config["enforce_eager"],
            gpu_memory_utilization=config["gpu_memory_utilization"],
            tensor_parallel_size=config["tensor_parallel_size"],
        )
        if config["max_model_len"] is not None:
            kwargs["max_model_len"] = config["max_model_len"]
        if kv_gib is not None:
            kwargs["kv_cache_memory_bytes"] = int(kv_gib * (1 << 30))
        if self.sleep_mode:
            kwargs["enable_sleep_mode"] = True
        self.llm = vllm.LLM(**kwargs)
        self.asleep = False
        self.weights_awake = True

    def info(self) -> dict[str, Any]:
        import torch

        model_config = self.llm.llm_engine.model_config
        return {
            "vllm_version": self.vllm.__version__,
            "torch_version": torch.__version__,
            "platform": "cpu" if self.on_cpu else "accelerator",
            "sleep_mode": self.sleep_mode,
            "max_model_len": int(model_config.max_model_len),
            "pid": os.getpid(),
        }

    # ------------------------------------------------------------------------------------------- ops
    def generate(self, payload: dict[str, Any]) -> list[dict[str, Any]]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        prompts: list[list[int]] = payload["prompts"]
        s: dict[str, Any] = payload["sampling"]
        common = {
            "n": 1,
            "temperature": float(s["temperature"]),
            "top_p": float(s["top_p"]),
            "top_k": max(int(s["top_k"]), 0),  # vLLM: 0 disables top-k
            "max_tokens": int(s["max_new_tokens"]),
            "stop": list(s["stop"]) or None,
            "include_stop_str_in_output": bool(s["include_stop_str_in_output"]),
            "logprobs": 0,  # only the sampled token's logprob
            "skip_special_tokens": True,
        }
        seed = s["seed"]
        if seed is None:
            params: Any = SamplingParams(**common)
        else:  # one seed per prompt: identical prompts (a GRPO group) still get different samples
            params = [SamplingParams(seed=int(seed) + i, **common) for i in range(len(prompts))]
        requests = [TokensPrompt(prompt_token_ids=p) for p in prompts]
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        results = []
        for out in outputs:
            completion = out.outputs[0]
            token_ids = [int(t) for t in completion.token_ids]
            logprobs = []
            per_token = completion.logprobs
            if per_token is None or len(per_token) != len(token_ids):
                raise RuntimeError(
                    f"vLLM returned {0 if per_token is None else len(per_token)} logprob entries for "
                    f"{len(token_ids)} tokens (request {out.request_id})"
                )
            for pos, token in enumerate(token_ids):
                logprobs.append(float(per_token[pos][token].logprob))
            reason = completion.finish_reason
            if reason not in ("stop", "length"):
                raise RuntimeError(f"vLLM request {out.request_id} ended with finish_reason={reason!r}")
            results.append(
                {
                    "token_ids": token_ids,
                    "logprobs": logprobs,
                    "text": completion.text,
                    "finish_reason": reason,
                }
            )
        return results

    def update_weights(self, payload: dict[str, Any]) -> int:
        if self.asleep and not self.weights_awake:
            self.llm.wake_up(tags=["weights"])
            self.weights_awake = True
        loaded = self.llm.collective_rpc(_load_safetensors_into_worker, args=(payload["path"],))
        # Cached prefixes were computed with the old weights.
        self.llm.reset_prefix_cache()
        return int(loaded[0])

    def sleep(self, payload: dict[str, Any]) -> bool:
        if not self.sleep_mode:
            return False
        if not self.asleep:
            self.llm.sleep(level=int(payload.get("level", 1)))
            self.asleep = True
            self.weights_awake = False
        return True

    def wake_up(self, payload: dict[str, Any]) -> bool:
        if not self.sleep_mode:
            return False
        if self.asleep:
            # After a weight update while asleep the weights are already back: wake the KV cache only.
            self.llm.wake_up(tags=["kv_cache"] if self.weights_awake else None)
            self.asleep = False
            self.weights_awake = True
        return True

    def close(self) -> None:
        engine = getattr(self.llm, "llm_engine", None)
        core = getattr(engine, "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
        del self.llm
        gc.collect()


def _serve(conn: Connection) -> int:
    kind, config = conn.recv()
    if kind != "init":
        conn.send(("error", f"expected an 'init' message first, got {kind!r}"))
        return 2
    try:
        server = _Server(config)
        conn.send(("ready", server.info()))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        return 1
    ops = {
        "generate": server.generate,
        "update_weights": server.update_weights,
        "sleep": server.sleep,
        "wake_up": server.wake_up,
    }
    try:
        while True:
            try:
                op, payload = conn.recv()
            except EOFError:  # the engine is gone
                return 0
            if op == "shutdown":
                conn.send(("ok", None))
                return 0
            handler = ops.get(op)
            if handler is None:
                conn.send(("error", f"unknown op {op!r}; known: {sorted([*ops, 'shutdown'])}"))
                continue
            try:
                result = handler(payload)
            except Exception:
                conn.send(("error", traceback.format_exc()))
            else:
                conn.send(("ok", result))
    finally:
        server.close()


def _exit_with_parent(poll_s: float = 1.0) -> None:
    """Kill this process group (the server and vLLM's processes) as soon as the engine's process is gone.

    The engine starts the server as the leader of its own process group. A server busy loading the model or
    generating would notice a dead engine only at its next socket read, so a daemon thread watches the parent.
    """
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent:  # re-parented: the engine's process died
                if os.getpgid(0) == os.getpid():  # group leader (started by the engine): take vLLM along
                    os.killpg(os.getpid(), signal.SIGKILL)
                os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="rlinf-parent-watch", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    """Serve one engine over the inherited socket ``--fd``; returns the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--fd", type=int, required=True, help="inherited socket file descriptor")
    args = parser.parse_args(argv)
    # Weight updates run a function inside vLLM's worker process through `LLM.collective_rpc`, which pickles it
    # (cloudpickle) on the channel between vLLM's own local processes; vLLM refuses that unless this is set.
    # Set before vLLM starts its processes, which inherit it.
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    # The engine stops a server it gives up on with SIGTERM, possibly from a process that is itself about to be
    # killed (a Ray actor being shut down): take vLLM's processes along at once, before anything else.
    signal.signal(signal.SIGTERM, _on_sigterm)
    _exit_with_parent()
    _start_group_reaper()
    sock = socket.socket(fileno=args.fd)
    conn = Connection(sock.detach())
    try:
        return _serve(conn)
    finally:
        conn.close()
        _kill_own_group()


def _start_group_reaper() -> None:
    """Start a tiny process that kills this server's process group once the server is gone.

    A server killed with SIGKILL (e.g. by Ray, which kills the children of an actor it shuts down) runs no
    handler, and vLLM's engine-core process does not notice its parent's death: this reaper, a member of the
    group and a child of the server, does.
    """
    me = os.getpid()
    if os.getpgid(0) != me:
        return
    code = (
        "import os, signal, time\n"
        f"while os.getppid() == {me}:\n"
        "    time.sleep(0.5)\n"
        f"os.killpg({me}, signal.SIGKILL)\n"
    )
    subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        close_fds=True,  # must not hold the engine's socket open
    )


def _on_sigterm(signum: int, frame: Any) -> None:
    _kill_own_group()
    os._exit(128 + signum)


def _kill_own_group() -> None:
    """SIGKILL every other process of this server's process group (vLLM's engine core, workers, trackers).

    vLLM stops them on a clean shutdown; this covers the exits where it does not (the engine vanished
    mid-request, an exception during shutdown). Only when this process leads its group, as the engine starts it.
    """
    me = os.getpid()
    if os.getpgid(0) != me:
        return
    try:
        entries = list(os.scandir("/proc"))
    except OSError:  # no procfs (not Linux)
        return
    for entry in entries:
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[2]) == me:  # fields: state, ppid, pgrp, ...
                os.kill(int(entry.name), signal.SIGKILL)
        except (OSError, IndexError, ValueError):
            continue


if __name__ == "__main__":  # vLLM spawns processes: everything runs under this guard
    sys.exit(main())
