"""``SGLangEngine``: the :class:`GenerationEngine` on SGLang's offline engine (``sglang.Engine``; GPU only).

SGLang has no CPU path, so nothing here has run in this repository: the engine is written against SGLang's
public ``Engine`` API (checked against sglang 0.5.23: ``Engine(**ServerArgs fields)``,
``generate(input_ids=..., sampling_params=..., return_logprob=True)``, ``update_weights_from_tensor``,
``release_memory_occupation`` / ``resume_memory_occupation``, ``shutdown``), and the pure parts — sampling-param
translation and response parsing — are tested on CPU with responses shaped like SGLang's. See
``docs/gpu_backends.md``.

What SGLang returns and how it maps to :class:`GenerationOutput`:

- ``output_ids``: every generated token, including the end-of-sequence token or the token that completed a stop
  string (SGLang trims only the *text*); → ``token_ids``.
- ``meta_info["output_token_logprobs"]``: ``(logprob, token_id, text_or_None)`` per generated token. SGLang's
  sampler returns ``log_softmax(logits / T)`` of the sampled token (before top-k / top-p renormalisation) and
  ``log_softmax(logits)`` for greedy requests — the contract of ``GenerationOutput.logprobs`` — unless the
  environment sets ``SGLANG_RETURN_ORIGINAL_LOGPROB`` (refused here).
- ``meta_info["finish_reason"]``: ``{"type": "stop" | "length" | "abort", "matched": ...}``; ``no_stop_trim``
  (= ``include_stop_str_in_output``) keeps the matched stop string at the end of ``text``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch

try:
    import sglang
except ImportError:  # the constructor names the missing extra; the pure helpers below need no SGLang
    sglang = None

from rlinf_models.llm import LLMModelConfig, resolve_model_path

from ._types import GenerationOutput, SamplingConfig

__all__ = ["SGLangEngine", "parse_sglang_output", "sglang_sampling_params"]

_INSTALL = 'pip install "sglang>=0.5" (GPU machines; see docs/gpu_backends.md)'
_DEFAULT_BUCKET_BYTES = 512 << 20


def sglang_sampling_params(sampling: SamplingConfig, *, index: int = 0) -> dict[str, Any]:
    """SGLang ``sampling_params`` for one request of a :class:`SamplingConfig` batch.

    Args:
        sampling: the batch's sampling settings.
        index: the request's position in the ``generate`` call. With ``sampling.seed`` set, request ``i`` gets
            ``sampling_seed = seed + i``: reproducible per call, yet identical prompts (a GRPO group) still
            draw different samples.

    Returns:
        A dict of SGLang ``SamplingParams`` fields (``temperature == 0`` is SGLang's greedy decoding too).
    """
    params: dict[str, Any] = {
        "max_new_tokens": sampling.max_new_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k,
        "stop": list(sampling.stop) or None,
        "no_stop_trim": sampling.include_stop_str_in_output,
        "skip_special_tokens": True,
    }
    if sampling.seed is not None:
        params["sampling_seed"] = sampling.seed + index
    return params


def parse_sglang_output(
    prompt: Sequence[int], response: Mapping[str, Any], *, stop: Sequence[str] = (), include_stop: bool = True
) -> GenerationOutput:
    """Turn one SGLang ``generate`` result dict into a :class:`GenerationOutput`.

    Args:
        prompt: the request's prompt token ids.
        response: ``{"text", "output_ids", "meta_info": {"finish_reason", "output_token_logprobs", ...}}``.
        stop: the request's stop strings (to cut ``text`` if SGLang left more after the match).
        include_stop: keep the stop string at the end of ``text``.

    Raises:
        RuntimeError: for an aborted request (SGLang's message quoted), or logprobs that do not line up with
            ``output_ids`` (missing ``return_logprob=True``).
    """
    meta = response.get("meta_info") or {}
    finish = meta.get("finish_reason") or {}
    kind = finish.get("type") if isinstance(finish, Mapping) else finish
    if kind == "abort":
        raise RuntimeError(f"SGLang aborted the request: {finish.get('message', finish)}")
    if kind not in ("stop", "length"):
        raise RuntimeError(
            f"SGLang returned an unknown finish_reason {finish!r} (expected 'stop' or 'length')"
        )
    token_ids = [int(t) for t in response.get("output_ids") or []]
    entries = meta.get("output_token_logprobs")
    if entries is None or len(entries) != len(token_ids):
        got = "none" if entries is None else len(entries)
        raise RuntimeError(
            f"SGLang returned {got} output_token_logprobs for {len(token_ids)} output_ids "
            "(generate must be called with return_logprob=True)"
        )
    logprobs: list[float] = []
    for i, (entry, tok) in enumerate(zip(entries, token_ids, strict=True)):
        lp, lp_tok = float(entry[0]), int(entry[1])
        if lp_tok != tok:
            raise RuntimeError(f"SGLang logprob entry {i} is for token {lp_tok}, output_ids has {tok}")
        logprobs.append(lp)
    text = str(response.get("text") or "")
    matched = finish.get("matched") if isinstance(finish, Mapping) else None
    if isinstance(matched, str) and stop:
        pos = text.find(matched)
        if pos != -1:
            text = text[: pos + len(matched)] if include_stop else text[:pos]
    return GenerationOutput(
        prompt_token_ids=[int(t) for t in prompt],
        token_ids=token_ids,
        logprobs=logprobs,
        text=text,
        finish_reason=kind,
    )


def _buckets(state_dict: Mapping[str, torch.Tensor], max_bytes: int) -> list[list[tuple[str, torch.Tensor]]]:
    """Split a state dict into consecutive ``(name, tensor)`` lists of at most ``max_bytes`` each.

    A single tensor larger than ``max_bytes`` gets a list of its own.
    """
    out: list[list[tuple[str, torch.Tensor]]] = []
    current: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, t in state_dict.items():
        nbytes = t.numel() * t.element_size()
        if current and size + nbytes > max_bytes:
            out.append(current)
            current, size = [], 0
        current.append((name, t))
        size += nbytes
    if current:
        out.append(current)
    return out


class SGLangEngine:
    """Generation on an in-process ``sglang.Engine`` (its scheduler runs in child processes on the GPU).

    Args:
        model_cfg: the model (``model_path`` / ``tokenizer_path`` / ``dtype``; aliases resolved like the actor).
        max_batch_size: most requests SGLang runs together (``max_running_requests``); ``generate`` submits
            prompts in chunks of this size.
        seed: SGLang's ``random_seed``.
        tp_size: tensor-parallel GPUs of the engine.
        mem_fraction_static: fraction of GPU memory for weights + KV cache (leave room for a collocated actor).
        enable_memory_saver: allow :meth:`offload` / :meth:`onload` (SGLang's ``enable_memory_saver`` with a CPU
            backup of the weights, so an onloaded engine serves the same weights).
        weight_bucket_bytes: most bytes per ``update_weights_from_tensor`` call.
        engine_kwargs: further ``sglang.ServerArgs`` fields (e.g. ``attention_backend``).

    Raises:
        ImportError: when SGLang is not installed (the message says how to install it).
        RuntimeError: without CUDA.
        ValueError: when ``SGLANG_RETURN_ORIGINAL_LOGPROB`` is set (logprobs would ignore the temperature).
    """

    def __init__(
        self,
        model_cfg: LLMModelConfig,
        *,
        max_batch_size: int = 64,
        seed: int = 0,
        tp_size: int = 1,
        mem_fraction_static: float = 0.5,
        enable_memory_saver: bool = True,
        weight_bucket_bytes: int = _DEFAULT_BUCKET_BYTES,
        engine_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if sglang is None:
            raise ImportError(f"the SGLang engine needs the sglang package: {_INSTALL}")
        if not torch.cuda.is_available():
            raise RuntimeError(
                "the SGLang engine needs a CUDA GPU (SGLang has no CPU path); use engine: hf or vllm"
            )
        if os.environ.get("SGLANG_RETURN_ORIGINAL_LOGPROB", "").lower() in ("1", "true", "yes"):
            raise ValueError(
                "SGLANG_RETURN_ORIGINAL_LOGPROB is set: SGLang would return logprobs without the sampling "
                "temperature, which the actor does not recompute; unset it"
            )
        if max_batch_size < 1 or tp_size < 1 or weight_bucket_bytes < 1:
            raise ValueError(
                f"max_batch_size, tp_size and weight_bucket_bytes must be >= 1, got "
                f"{max_batch_size}, {tp_size}, {weight_bucket_bytes}"
            )
        if not 0.0 < mem_fraction_static < 1.0:
            raise ValueError(f"mem_fraction_static must be in (0, 1), got {mem_fraction_static}")
        self.model_cfg = model_cfg
        self.max_batch_size = max_batch_size
        self.weight_bucket_bytes = weight_bucket_bytes
        model_path = resolve_model_path(model_cfg.model_path)
        tokenizer_path = (
            resolve_model_path(model_cfg.tokenizer_path) if model_cfg.tokenizer_path else model_path
        )
        kwargs: dict[str, Any] = {
            "model_path": str(model_path),
            "tokenizer_path": str(tokenizer_path),
            "dtype": model_cfg.dtype,
            "tp_size": tp_size,
            "random_seed": seed,
            "mem_fraction_static": mem_fraction_static,
            "max_running_requests": max_batch_size,
            "enable_memory_saver": enable_memory_saver,
            "enable_weights_cpu_backup": enable_memory_saver,
        }
        kwargs |= dict(engine_kwargs or {})
        config = model_path / "config.json"
        # A tied model has no separate lm_head in SGLang (it would log "not found" for every update).
        self._tied = config.is_file() and bool(
            json.loads(config.read_text()).get("tie_word_embeddings", False)
        )
        self._memory_saver = bool(kwargs["enable_memory_saver"])
        self._sampling_backend = kwargs.get("sampling_backend")
        self._engine: Any = sglang.Engine(**kwargs)
        self._offloaded = False
        self._closed = False

    # ---------------------------------------------------------------------------------------------- API
    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig) -> list[GenerationOutput]:
        """One continuation per prompt (token ids), in order, with per-token logprobs.

        Raises:
            RuntimeError: after :meth:`shutdown`, while offloaded, or for an aborted request.
        ValueError: for an empty prompt, or a seeded top-p / top-k request without the pytorch sampling backend.
        """
        self._check_usable()
        truncated = sampling.top_p < 1.0 or sampling.top_k != -1
        if (
            sampling.seed is not None
            and not sampling.greedy
            and truncated
            and self._sampling_backend != "pytorch"
        ):
            # SGLang's flashinfer top-k/top-p kernels assert that no per-request seed is given.
            raise ValueError(
                "sampling.seed with top_p < 1 or top_k != -1 needs SGLang's pytorch sampling kernels: build the "
                "engine with engine_kwargs={'sampling_backend': 'pytorch'} (or drop the seed)"
            )
        batch = [[int(t) for t in p] for p in prompts]
        for i, p in enumerate(batch):
            if not p:
                raise ValueError(f"prompt {i} is empty")
        outputs: list[GenerationOutput] = []
        for start in range(0, len(batch), self.max_batch_size):
            chunk = batch[start : start + self.max_batch_size]
            params = [sglang_sampling_params(sampling, index=start + i) for i in range(len(chunk))]
            responses = self._engine.generate(input_ids=chunk, sampling_params=params, return_logprob=True)
            if isinstance(responses, Mapping):  # a single request comes back as one dict
                responses = [responses]
            outputs.extend(
                parse_sglang_output(
                    p, r, stop=sampling.stop, include_stop=sampling.include_stop_str_in_output
                )
                for p, r in zip(chunk, responses, strict=True)
            )
        return outputs

    def update_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Load HF-named weights into the running engine (``Engine.update_weights_from_tensor``, in buckets).

        Tensors go to this process's GPU first (SGLang then maps them by CUDA IPC, without a host copy); the
        prefix cache is flushed after the last bucket. ``lm_head.weight`` is not sent for a model with tied
        embeddings (SGLang ties it to ``model.embed_tokens.weight``).
        """
        self._check_usable()
        if self._tied:
            state_dict = {k: v for k, v in state_dict.items() if k != "lm_head.weight"}
        buckets = _buckets(state_dict, self.weight_bucket_bytes)
        for i, bucket in enumerate(buckets):
            named = [(name, self._stage(t)) for name, t in bucket]
            result = self._engine.update_weights_from_tensor(
                named_tensors=named, flush_cache=i == len(buckets) - 1
            )
            ok, message = (result[0], result[1]) if isinstance(result, tuple) else (True, "")
            if not ok:
                raise RuntimeError(
                    f"SGLang rejected the weight update (bucket {i + 1}/{len(buckets)}): {message}"
                )

    def offload(self) -> None:
        """Release the GPU memory of weights, KV cache and CUDA graphs (weights backed up on the host)."""
        self._check_open()
        if self._offloaded or not self._memory_saver:
            return
        self._engine.release_memory_occupation()
        self._offloaded = True

    def onload(self) -> None:
        """Re-allocate what :meth:`offload` released and restore the weights."""
        self._check_open()
        if not self._offloaded:
            return
        self._engine.resume_memory_occupation()
        self._offloaded = False

    def shutdown(self) -> None:
        """Stop SGLang's processes (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._engine.shutdown()

    # ---------------------------------------------------------------------------------------- helpers
    def _stage(self, tensor: torch.Tensor) -> torch.Tensor:
        """A copy of ``tensor`` on this process's GPU, ready to be shared with SGLang's scheduler by CUDA IPC."""
        device = torch.device("cuda", torch.cuda.current_device())
        out = tensor.detach().to(device, non_blocking=True)
        torch.cuda.synchronize(device)
        return out

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("SGLangEngine is shut down")

    def _check_usable(self) -> None:
        self._check_open()
        if self._offloaded:
            raise RuntimeError("SGLangEngine is offloaded: call onload() first")
