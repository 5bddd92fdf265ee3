"""The Megatron-core training backend of the LLM actor (CUDA only; ``rlinf-models[megatron,hf]``).

:class:`MegatronActorBackend` gives the LLM actor what :class:`~rlinf_models.llm.LLMActorWorker` computes with
FSDP2, on a megatron-core ``GPTModel`` split with tensor / pipeline / data parallelism:

- the model is built from a Hugging Face checkpoint directory (weights converted on load, see ``_convert``);
- :meth:`~MegatronActorBackend.compute_logprobs` scores token ids (and the frozen reference model's log-probs);
- :meth:`~MegatronActorBackend.run_training` / :meth:`~MegatronActorBackend.run_sft` take the same batch dict
  and the same loss (``rlinf_algos.policy_loss`` with ``task_type="reasoning"``, entropy bonus, KL to the
  reference) as the FSDP actor;
- :meth:`~MegatronActorBackend.export_hf_state_dict` gathers a full HF-named CPU state dict on global rank 0
  for the weight sync to rollout engines; :meth:`~MegatronActorBackend.save_hf` writes an HF directory.

Batch split (same contract as the FSDP actor): every rank is called with the SAME full batch; the ranks of one
model replica (tensor × pipeline group) process the same rows, and data-parallel replica ``d`` of ``D`` takes its
contiguous share. Nothing in this module has run on a GPU in this repository (see ``docs/gpu_backends.md``).
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from rlinf_algos import get_loss_agg_func, kl_penalty, policy_loss
from rlinf_core.checkpoint import replace_directory
from rlinf_core.config import AlgorithmConfig

try:
    from megatron.core import dist_checkpointing, parallel_state, tensor_parallel
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_layer_local_spec,
        get_gpt_layer_with_transformer_engine_spec,
    )
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.module import Float16Module
    from safetensors.torch import load_file, save_file
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        f'the Megatron backend needs megatron-core and safetensors ({e}): pip install "rlinf-models[megatron,hf]"'
    ) from e

from ...actor import MetricMeans, lr_scale, resumed_schedule_total, run_update, shuffled_minibatches
from .._batch import check_batch, corrected_advantages
from .._config import LLMActorConfig
from .._hf import resolve_model_path
from ._config import MegatronConfig
from ._convert import (
    HFArchitecture,
    globalize_layers,
    gpt_model_kwargs,
    hf_to_megatron,
    megatron_to_hf,
    merge_tp_shards,
    padded_vocab_size,
    parse_hf_config,
    shard_state_dict,
    stage_layers,
    transformer_config_kwargs,
)
from ._logprobs import aligned_token_logprobs, left_align

_LOG = logging.getLogger(__name__)


def _ignore(_msg: str) -> None:
    """A warning another rank already logs."""


__all__ = ["MegatronActorBackend", "initialize_model_parallel"]

_CRITIC_LOSSES = ("actor_critic", "decoupled_actor_critic")
_HF_SIDE_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)


def initialize_model_parallel(megatron: MegatronConfig, *, seed: int) -> None:
    """Join ``torch.distributed`` and create Megatron's tensor / pipeline / data-parallel groups.

    The default group comes from ``env://`` (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``); the
    CUDA device from ``LOCAL_RANK``. Megatron's CUDA RNG tracker is seeded with ``seed``.

    Idempotent: an existing default group or Megatron layout is reused (the layout must match).

    Raises:
        RuntimeError: without CUDA.
        ValueError: when ``TP × PP`` does not divide the world size, or an existing layout differs.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("the Megatron backend needs CUDA (no GPU is visible to this process)")
    if not dist.is_initialized():
        devices = torch.cuda.device_count()
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % devices)
        dist.init_process_group(
            backend=megatron.nccl_backend, timeout=timedelta(minutes=megatron.distributed_timeout_minutes)
        )
    world = dist.get_world_size()
    if world % megatron.model_parallel_size:
        raise ValueError(
            f"actor world size {world} is not a multiple of tensor_parallel_size × pipeline_parallel_size "
            f"({megatron.tensor_parallel_size} × {megatron.pipeline_parallel_size})"
        )
    if parallel_state.model_parallel_is_initialized():
        have = (
            parallel_state.get_tensor_model_parallel_world_size(),
            parallel_state.get_pipeline_model_parallel_world_size(),
        )
        want = (megatron.tensor_parallel_size, megatron.pipeline_parallel_size)
        if have != want:
            raise ValueError(f"Megatron is already initialised with (TP, PP) = {have}, not {want}")
    else:
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=megatron.tensor_parallel_size,
            pipeline_model_parallel_size=megatron.pipeline_parallel_size,
            distributed_timeout_minutes=megatron.distributed_timeout_minutes,
        )
    tensor_parallel.model_parallel_cuda_manual_seed(seed)


def _load_hf_weights(path: Path) -> dict[str, torch.Tensor]:
    """All ``*.safetensors`` tensors of an HF checkpoint directory (CPU)."""
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(
            f"{path} has no *.safetensors weights (the Megatron backend reads safetensors)"
        )
    out: dict[str, torch.Tensor] = {}
    for f in files:
        out |= load_file(str(f), device="cpu")
    return out


_FLOAT_KEYS = ("advantages", "old_logprobs", "ref_logprobs", "rollout_logprobs")


def _check_batch(batch: Mapping[str, Any], required: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """Validate the ``[N, T]`` keys this backend reads and convert them to CPU tensors."""
    return check_batch(batch, required, float_keys=_FLOAT_KEYS)


def _move_optimizer_tensors(optimizer: Any, keep: set[int]) -> list[tuple[Any, str | None]]:
    """Move a megatron optimizer's CUDA tensors to the host, except those whose storage is in ``keep``.

    Covers the parameters of each inner ``torch.optim`` optimizer (fp32 main copies; views into a DDP buffer
    are in ``keep``) and every CUDA tensor of their state. Returns what was moved, as ``(tensor, None)`` for a
    parameter (moved through ``.data``, so the optimizer keeps its key) and ``(state dict, key)`` for a state
    entry, so that the reverse move restores exactly these and nothing that lived on the host before (Adam's
    ``step`` counters).
    """
    moved: list[tuple[Any, str | None]] = []
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(opt, "optimizer", None)
        if inner is None or getattr(opt, "is_stub_optimizer", False):
            continue
        for group in inner.param_groups:
            for p in group["params"]:
                if p.is_cuda and p.untyped_storage().data_ptr() not in keep:
                    p.data = p.data.cpu()
                    moved.append((p, None))
        for state in inner.state.values():
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and value.is_cuda:
                    state[key] = value.cpu()
                    moved.append((state, key))
    return moved


class MegatronActorBackend:
    """A causal LM from an HF checkpoint trained with megatron-core (TP / PP / DP, distributed optimizer).

    Construct it on every rank of the actor group after ``RANK`` / ``WORLD_SIZE`` / ``MASTER_ADDR`` /
    ``MASTER_PORT`` are set (the RLinf scheduler sets them for a worker group; ``torchrun`` does too); it
    calls :func:`initialize_model_parallel`. All public methods are collective.

    Args:
        cfg: the ``actor:`` config (model path, dtype, optimizer, batch sizes, temperature, seed).
        megatron: the parallel layout (``actor.megatron``).
        algorithm: the ``algorithm:`` config (loss type, clip ratios, entropy bonus, KL, epochs).
        total_steps: training steps of the run (for ``actor.optim.lr_schedule: linear``).

    Raises:
        ValueError: for a critic loss (no value head on the Megatron path), ``add_value_head``, or batch sizes
            that do not divide over the data-parallel ranks.
    """

    def __init__(
        self,
        cfg: LLMActorConfig,
        megatron: MegatronConfig,
        algorithm: AlgorithmConfig,
        *,
        total_steps: int | None = None,
    ) -> None:
        if algorithm.loss_type in _CRITIC_LOSSES or cfg.model.add_value_head:
            raise ValueError(
                "the Megatron backend trains the policy only: algorithm.loss_type must not be a critic loss "
                f"({list(_CRITIC_LOSSES)}) and actor.model.add_value_head must be false"
            )
        self.cfg, self.megatron, self.algorithm, self.total_steps = cfg, megatron, algorithm, total_steps
        self.model_path = resolve_model_path(cfg.model.model_path)
        self.arch: HFArchitecture = parse_hf_config(self.model_path)
        initialize_model_parallel(megatron, seed=cfg.seed)
        self.dp_size = parallel_state.get_data_parallel_world_size()
        self.dp_rank = parallel_state.get_data_parallel_rank()
        self.tp_rank = parallel_state.get_tensor_model_parallel_rank()
        self.pp_rank = parallel_state.get_pipeline_model_parallel_rank()
        if cfg.global_batch_size % (cfg.micro_batch_size * self.dp_size):
            raise ValueError(
                f"actor.global_batch_size ({cfg.global_batch_size}) must be a multiple of actor.micro_batch_size "
                f"({cfg.micro_batch_size}) × data-parallel size ({self.dp_size})"
            )
        self.device = torch.device("cuda", torch.cuda.current_device())
        self.padded_vocab = padded_vocab_size(
            self.arch.vocab_size,
            tensor_parallel_size=megatron.tensor_parallel_size,
            divisible_by=megatron.make_vocab_size_divisible_by,
        )
        self.te = megatron.transformer_impl == "transformer_engine"
        self.tconfig = TransformerConfig(
            **transformer_config_kwargs(
                self.arch,
                tensor_parallel_size=megatron.tensor_parallel_size,
                pipeline_parallel_size=megatron.pipeline_parallel_size,
                sequence_parallel=megatron.sequence_parallel,
                dtype=cfg.model.dtype,
                recompute=megatron.recompute_activations,
            )
        )
        hf_weights = _load_hf_weights(self.model_path)
        self._initial = self._local_shard(hf_weights)
        del hf_weights

        gpt = self._build_gpt()
        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=megatron.grad_reduce_in_fp32,
            overlap_grad_reduce=False,
            use_distributed_optimizer=megatron.use_distributed_optimizer,
        )
        self.model = DistributedDataParallel(config=self.tconfig, ddp_config=ddp_config, module=gpt)
        optim = cfg.optim
        self.optimizer = get_megatron_optimizer(
            OptimizerConfig(
                optimizer="adam",
                lr=optim.lr,
                min_lr=0.0,
                weight_decay=optim.weight_decay,
                adam_beta1=optim.adam_beta1,
                adam_beta2=optim.adam_beta2,
                adam_eps=optim.adam_eps,
                clip_grad=optim.clip_grad if optim.clip_grad is not None else 0.0,
                bf16=cfg.model.dtype == "bfloat16",
                params_dtype=self.tconfig.params_dtype,
                use_distributed_optimizer=megatron.use_distributed_optimizer,
            ),
            [self.model],
        )
        # What megatron's own training loop wires up: gradient reduction over data-parallel ranks (and the
        # embedding group for tied weights across pipeline stages) after the last micro-batch.
        self.tconfig.finalize_model_grads_func = finalize_model_grads
        self.tconfig.grad_scale_func = self.optimizer.scale_loss
        self.ref_model: torch.nn.Module | None = None
        if algorithm.kl_beta > 0 or getattr(algorithm, "reinpp_kl_beta", 0.0) > 0:
            self.ref_model = self._build_gpt(frozen=True)
        del self._initial

        self._loss_agg = get_loss_agg_func(algorithm.loss_agg_func)
        self.generator = torch.Generator().manual_seed(cfg.seed)
        self.version = self.train_steps = self.sft_steps = self.optimizer_steps = 0
        self._offloaded = False
        self._moved_optimizer_tensors: list[tuple[Any, str | None]] = []
        if cfg.enable_offload:
            self.offload()

    # ------------------------------------------------------------------------------------------ building
    def _local_shard(self, hf_weights: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """This rank's Megatron weights (its pipeline stage, its tensor-parallel slice)."""
        pp = self.megatron.pipeline_parallel_size
        full = hf_to_megatron(
            hf_weights,
            self.arch,
            padded_vocab=self.padded_vocab,
            te_layernorm=self.te,
            output_layer_copy=self.arch.tie_word_embeddings and pp > 1,
        )
        local = stage_layers(
            full,
            num_layers=self.arch.num_layers,
            pp_size=pp,
            pp_rank=self.pp_rank,
            tied=self.arch.tie_word_embeddings,
        )
        return shard_state_dict(
            local, self.arch, tp_size=self.megatron.tensor_parallel_size, tp_rank=self.tp_rank
        )

    def _layer_spec(self) -> Any:
        if self.te:
            return get_gpt_layer_with_transformer_engine_spec(qk_layernorm=self.arch.qk_layernorm)
        return get_gpt_layer_local_spec(qk_layernorm=self.arch.qk_layernorm, normalization="RMSNorm")

    def _build_gpt(self, *, frozen: bool = False) -> torch.nn.Module:
        """A ``GPTModel`` for this rank's stage holding the converted HF weights (``Float16Module`` for bf16)."""
        gpt = GPTModel(
            config=self.tconfig,
            transformer_layer_spec=self._layer_spec(),
            pre_process=parallel_state.is_pipeline_first_stage(),
            post_process=parallel_state.is_pipeline_last_stage(),
            **gpt_model_kwargs(self.arch, padded_vocab=self.padded_vocab),
        )
        result = gpt.load_state_dict(self._initial, strict=False)
        missing = [k for k in result.missing_keys if not k.endswith("_extra_state")]
        if missing or result.unexpected_keys:
            raise RuntimeError(
                f"converted weights do not match GPTModel: missing {missing[:6]}, unexpected {result.unexpected_keys[:6]}"
            )
        gpt.cuda(self.device)
        module: torch.nn.Module = Float16Module(self.tconfig, gpt) if self.tconfig.bf16 else gpt
        if frozen:
            module.requires_grad_(False)
            module.eval()
        return module

    def _gpt(self, module: Any) -> Any:
        """The bare ``GPTModel`` inside the DDP / ``Float16Module`` wrappers (megatron-core types: ``Any``)."""
        while not isinstance(module, GPTModel):
            module = module.module
        return module

    # ------------------------------------------------------------------------------------------ forward
    def _micro_batches(
        self, b: Mapping[str, torch.Tensor], rows: torch.Tensor
    ) -> list[dict[str, torch.Tensor]]:
        """Left-aligned micro-batches of ``rows`` on the GPU (``T`` padded to a multiple of TP under SP)."""
        mbs = self.cfg.micro_batch_size
        out = []
        for s in range(0, rows.numel(), mbs):
            sel = rows[s : s + mbs]
            mb = {k: v[sel].to(self.device) for k, v in b.items()}
            aligned, shifts = left_align(mb["input_ids"], mb["attention_mask"])
            t = aligned.shape[1]
            if self.tconfig.sequence_parallel:
                t_pad = math.ceil(t / self.megatron.tensor_parallel_size) * self.megatron.tensor_parallel_size
                aligned = torch.nn.functional.pad(aligned, (0, t_pad - t))
            mb |= {"aligned_ids": aligned, "shifts": shifts}
            out.append(mb)
        return out

    def _token_stats(
        self, logits: torch.Tensor, mb: Mapping[str, torch.Tensor], *, entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``[B, T]`` log-probs (and entropy) in the batch's original column layout from ``[B, T', V/TP]`` logits."""
        return aligned_token_logprobs(
            logits,
            mb["aligned_ids"],
            mb["shifts"],
            mb["attention_mask"],
            vocab_start=self.tp_rank * logits.shape[-1],
            vocab_size=self.arch.vocab_size,
            temperature=self.cfg.temperature,
            compute_entropy=entropy,
            group=parallel_state.get_tensor_model_parallel_group(),
        )

    def _forward_step(
        self, data_iterator: Iterator[dict[str, torch.Tensor]], model: torch.nn.Module, *, loss: Any
    ) -> tuple[torch.Tensor, Callable[[torch.Tensor], Any]]:
        mb = next(data_iterator)
        ids = mb["aligned_ids"]
        t = ids.shape[1]
        positions = torch.arange(t, device=ids.device).unsqueeze(0).expand_as(ids)
        # Explicit causal mask (True = masked): left-aligned rows need nothing else.
        causal = torch.triu(torch.ones(t, t, dtype=torch.bool, device=ids.device), diagonal=1)[None, None]
        output = model(ids, positions, causal)
        return output, partial(loss, mb)

    def _run(
        self, module: torch.nn.Module, micro: list[dict[str, torch.Tensor]], loss: Any, *, forward_only: bool
    ) -> list[dict[str, Any]]:
        if not micro:
            return []
        fwd_bwd = get_forward_backward_func()
        return list(
            fwd_bwd(
                forward_step_func=partial(self._forward_step, loss=loss),
                data_iterator=iter(micro),
                model=[module],
                num_microbatches=len(micro),
                seq_length=micro[0]["aligned_ids"].shape[1],
                micro_batch_size=micro[0]["aligned_ids"].shape[0],
                forward_only=forward_only,
            )
        )

    def _collect_logprobs(
        self, mb: Mapping[str, torch.Tensor], logits: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        lp, _ = self._token_stats(logits, mb, entropy=False)
        return logits.new_zeros(()), {"logprobs": lp.detach().float()}

    def _score(self, module: torch.nn.Module, b: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """``[N, T]`` log-probs of the whole batch on every rank (DP shares, gathered; PP last stage broadcast)."""
        n = b["input_ids"].shape[0]
        mbs = self.cfg.micro_batch_size
        share = math.ceil(math.ceil(n / self.dp_size) / mbs) * mbs
        rows = torch.arange(self.dp_rank * share, (self.dp_rank + 1) * share).clamp_max(n - 1)
        module.eval()
        with torch.no_grad():
            outputs = self._run(
                module, self._micro_batches(b, rows), self._collect_logprobs, forward_only=True
            )
        t = b["input_ids"].shape[1]
        local = (
            torch.cat([o["logprobs"] for o in outputs])
            if parallel_state.is_pipeline_last_stage()
            else torch.empty(share, t, device=self.device)
        )
        pp_group = parallel_state.get_pipeline_model_parallel_group()
        if self.megatron.pipeline_parallel_size > 1:
            dist.broadcast(local, src=parallel_state.get_pipeline_model_parallel_last_rank(), group=pp_group)
        if self.dp_size > 1:
            parts = [torch.empty_like(local) for _ in range(self.dp_size)]
            dist.all_gather(parts, local.contiguous(), group=parallel_state.get_data_parallel_group())
            local = torch.cat(parts)
        return local[:n].cpu()

    # ------------------------------------------------------------------------------------------ the API
    def get_model_version(self) -> int:
        """Completed :meth:`run_training` / :meth:`run_sft` calls (0 = the HF weights)."""
        return self.version

    def compute_logprobs(self, batch: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        """Score ``batch`` with the current weights (and the reference model); collective, same batch everywhere.

        Args:
            batch: ``input_ids [N, T]`` and ``attention_mask [N, T]`` (each row's ones contiguous).

        Returns:
            On every rank, CPU float32 ``[N, T]``: ``"logprobs"`` (at ``actor.temperature``; column ``t`` is
            ``log p(input_ids[:, t] | input_ids[:, :t])``, 0 at column 0 and on padding) and ``"ref_logprobs"``
            when a reference model exists.
        """
        b = _check_batch(batch, ("input_ids", "attention_mask"))
        self.onload()
        try:
            out = {"logprobs": self._score(self.model, b)}
            if self.ref_model is not None:
                out["ref_logprobs"] = self._score(self.ref_model, b)
            return out
        finally:
            if self.cfg.enable_offload:
                self.offload()

    def _ppo_loss(
        self, on_policy: bool, mb: Mapping[str, torch.Tensor], logits: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        alg = self.algorithm
        mask = mb["loss_mask"].bool()
        logprobs, entropy = self._token_stats(logits, mb, entropy=True)
        assert entropy is not None
        old = logprobs.detach() if on_policy else mb["old_logprobs"]
        advantages, is_metrics = corrected_advantages(alg, old, mb, mask)
        kwargs: dict[str, Any] = {
            "task_type": "reasoning",
            "loss_type": alg.loss_type,
            "loss_agg_func": self._loss_agg,
            "logprobs": logprobs,
            "old_logprobs": old,
            "advantages": advantages,
            "loss_mask": mask,
            "clip_ratio_low": alg.clip_ratio_low,
            "clip_ratio_high": alg.clip_ratio_high,
        }
        if alg.clip_ratio_c is not None:
            kwargs["clip_ratio_c"] = alg.clip_ratio_c
        loss, raw = policy_loss(**kwargs)
        # clones: the pipeline schedule divides the returned loss in place by the micro-batch count
        metrics = {k: v.detach().float().clone() for k, v in (raw | is_metrics).items()}
        ent = self._loss_agg(entropy, mask, None)
        metrics["actor/entropy"] = ent.detach().clone()
        if alg.entropy_bonus > 0:
            loss = loss - alg.entropy_bonus * ent
        if alg.kl_beta > 0:
            kl = self._loss_agg(kl_penalty(logprobs, mb["ref_logprobs"], alg.kl_penalty), mask, None)
            loss = loss + alg.kl_beta * kl
            metrics["actor/kl_loss"] = kl.detach().clone()
        metrics["actor/total_loss"] = loss.detach().clone()
        return loss, metrics

    def _sft_loss(
        self, scale: float, mb: Mapping[str, torch.Tensor], logits: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        logprobs, _ = self._token_stats(logits, mb, entropy=False)
        nll = -(logprobs * mb["loss_mask"].float()).sum()
        # the schedule divides by the number of micro-batches; `scale` turns the sum into the global token mean
        return nll * scale, {"sft/nll_sum": nll.detach().clone()}

    def _set_lr(self, *, sft: bool) -> float:
        optim = self.cfg.optim
        lr = optim.lr
        if sft and self.cfg.sft_lr is not None:
            lr = self.cfg.sft_lr
        elif not sft:
            lr = optim.lr * lr_scale(optim.lr_schedule, self.train_steps, self.total_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    def _optimizer_step(
        self, micro: list[dict[str, torch.Tensor]], loss: Any
    ) -> tuple[list[dict[str, Any]], float]:
        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()
        self.model.train()
        outputs = self._run(self.model, micro, loss, forward_only=False)
        _ok, grad_norm, _zeros = self.optimizer.step()
        self.optimizer_steps += 1
        return outputs, float(grad_norm) if grad_norm is not None else 0.0

    def _reduce_metrics(self, sums: Mapping[str, float], counts: Mapping[str, float]) -> dict[str, float]:
        """Mean of each metric over the last pipeline stage's data-parallel ranks, on every rank."""
        mine = {k: (sums[k], counts[k]) for k in sums} if parallel_state.is_pipeline_last_stage() else {}
        everyone: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine if self.tp_rank == 0 else {})
        total: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        for part in everyone:
            for k, (s, c) in part.items():
                total[k][0] += s
                total[k][1] += c
        return {k: s / c if c else 0.0 for k, (s, c) in sorted(total.items())}

    def run_training(self, batch: Mapping[str, Any]) -> dict[str, float]:
        """PPO-style update: ``algorithm.update_epoch`` passes of mini-batch optimizer steps over the batch.

        The split and the loss match :meth:`LLMActorWorker.run_training`: one seeded permutation per epoch cut
        into mini-batches of ``global_batch_size`` rows, replica ``d`` of ``D`` taking block ``d`` of each;
        ``old_logprobs`` are recomputed when absent (except for a single on-policy step), ``ref_logprobs`` when
        KL is on. ``N`` must be a multiple of ``micro_batch_size × D``.

        Returns:
            ``actor/*`` metrics of ``rlinf_algos.policy_loss`` plus ``actor/entropy``, ``actor/kl_loss`` (KL on),
            ``actor/total_loss``, ``actor/grad_norm``, ``actor/lr``, ``actor/num_optimizer_steps``.
        """
        alg = self.algorithm
        required: tuple[str, ...] = ("input_ids", "attention_mask", "loss_mask", "advantages")
        if alg.importance_sampling_fix:
            required = (*required, "rollout_logprobs")
        b = _check_batch(batch, required)
        n, d, mbs, gbs = (
            b["input_ids"].shape[0],
            self.dp_size,
            self.cfg.micro_batch_size,
            self.cfg.global_batch_size,
        )
        if n % (d * mbs):
            raise ValueError(
                f"run_training: the batch has {n} sequences, not a multiple of actor.micro_batch_size ({mbs}) × "
                f"data-parallel size ({d})"
            )
        self.onload()
        on_policy = "old_logprobs" not in b and alg.update_epoch == 1 and n <= gbs
        if "old_logprobs" not in b and not on_policy:
            b["old_logprobs"] = self._score(self.model, b)
        if alg.kl_beta > 0 and "ref_logprobs" not in b:
            if self.ref_model is None:
                raise RuntimeError("no reference model: set algorithm.kl_beta > 0")
            b["ref_logprobs"] = self._score(self.ref_model, b)
        lr = self._set_lr(sft=False)
        metrics = MetricMeans()
        grad_norms: list[float] = []

        def step(rows: torch.Tensor) -> None:
            # Megatron's pipeline schedule runs the micro-batches and accumulates their gradients itself.
            outputs, norm = self._optimizer_step(
                self._micro_batches(b, rows), partial(self._ppo_loss, on_policy)
            )
            grad_norms.append(norm)
            for values in outputs:
                metrics.add({k: float(val) for k, val in values.items()})

        steps = run_update(
            epochs=alg.update_epoch,
            minibatches=lambda: shuffled_minibatches(
                n, global_batch_size=gbs, rank=self.dp_rank, world_size=d, generator=self.generator
            ),
            step=step,
        )
        self.train_steps += 1
        self.version += 1
        out = self._reduce_metrics(metrics.weighted_sums(), metrics.counts)
        out |= {
            "actor/grad_norm": sum(grad_norms) / max(len(grad_norms), 1),
            "actor/lr": lr,
            "actor/num_optimizer_steps": float(steps),
        }
        if self.cfg.enable_offload:
            self.offload()
        return out

    def run_sft(self, batch: Mapping[str, Any]) -> dict[str, float]:
        """One supervised optimizer step: token-mean cross-entropy on the ``loss_mask`` tokens (column 0 ignored).

        Replica ``d`` takes rows ``[d·N/D, (d+1)·N/D)`` (``N`` a multiple of ``D × micro_batch_size``).

        Returns:
            ``sft/loss``, ``sft/grad_norm``, ``sft/lr``, ``sft/num_tokens``.
        """
        b = _check_batch(batch, ("input_ids", "attention_mask", "loss_mask"))
        n, d, mbs = b["input_ids"].shape[0], self.dp_size, self.cfg.micro_batch_size
        if n % (d * mbs):
            raise ValueError(
                f"run_sft: the batch has {n} sequences, not a multiple of actor.micro_batch_size ({mbs}) × "
                f"data-parallel size ({d})"
            )
        b["loss_mask"] = b["loss_mask"].clone()
        b["loss_mask"][:, 0] = 0
        total = float(b["loss_mask"].sum())
        if total == 0:
            raise ValueError("run_sft: loss_mask selects no token (after column 0)")
        self.onload()
        lr = self._set_lr(sft=True)
        share = n // d
        rows = torch.arange(self.dp_rank * share, (self.dp_rank + 1) * share)
        micro = self._micro_batches(b, rows)
        # DDP averages gradients over D replicas and the schedule divides by the micro-batch count.
        scale = d * len(micro) / total
        outputs, norm = self._optimizer_step(micro, partial(self._sft_loss, scale))
        nll = sum(float(o["sft/nll_sum"]) for o in outputs)
        reduced = self._reduce_metrics({"nll": nll}, {"nll": 1})
        self.sft_steps += 1
        self.version += 1
        if self.cfg.enable_offload:
            self.offload()
        return {
            "sft/loss": reduced.get("nll", 0.0) * d / total,
            "sft/grad_norm": norm,
            "sft/lr": lr,
            "sft/num_tokens": total,
        }

    def update_reference_model(self) -> None:
        """Copy the current policy weights into the frozen reference model (e.g. after an SFT warm-up)."""
        if self.ref_model is None:
            raise RuntimeError("no reference model: set algorithm.kl_beta > 0")
        self._gpt(self.ref_model).load_state_dict(self._gpt(self.model).state_dict())

    # ---------------------------------------------------------------------------------------- export
    def export_hf_state_dict(self) -> dict[str, torch.Tensor]:
        """The full HF-named CPU state dict on global rank 0 (``{}`` elsewhere); collective.

        Tensor-parallel slices are all-gathered and merged, pipeline stages gathered to the first stage, then
        renamed / split back to HF layout (``q/k/v_proj``, ``gate/up_proj``, vocabulary padding removed).
        """
        self.onload()
        local = {
            k: v.detach()
            for k, v in self._gpt(self.model).state_dict().items()
            if not k.endswith("_extra_state") and isinstance(v, torch.Tensor)
        }
        result: dict[str, torch.Tensor] = {}
        if self.dp_rank == 0:
            tp_group = parallel_state.get_tensor_model_parallel_group()
            tp = self.megatron.tensor_parallel_size
            shards: list[dict[str, torch.Tensor]] = [{} for _ in range(tp)]
            for name, t in local.items():
                parts = [torch.empty_like(t) for _ in range(tp)]
                dist.all_gather(parts, t.contiguous(), group=tp_group)
                for r, p in enumerate(parts):
                    shards[r][name] = p.cpu()
            stage = merge_tp_shards(shards)
            if self.tp_rank == 0:
                pp_group = parallel_state.get_pipeline_model_parallel_group()
                stages: list[Any] = [None] * self.megatron.pipeline_parallel_size
                if self.megatron.pipeline_parallel_size > 1:
                    dst = dist.get_global_rank(pp_group, 0)
                    dist.gather_object(stage, stages if self.pp_rank == 0 else None, dst=dst, group=pp_group)
                else:
                    stages = [stage]
                if dist.get_rank() == 0:
                    full = globalize_layers(
                        stages, num_layers=self.arch.num_layers, tied=self.arch.tie_word_embeddings
                    )
                    result = megatron_to_hf(full, self.arch, te_layernorm=self.te)
        if self.cfg.enable_offload:
            self.offload()
        return result

    def save_hf(self, path: str | os.PathLike[str]) -> str:
        """Write an HF checkpoint directory (``model.safetensors`` + the source's config / tokenizer files).

        Collective; global rank 0 writes into a staging directory renamed into place (replacing ``path``).
        """
        state = self.export_hf_state_dict()
        target = Path(path)
        if dist.get_rank() == 0:

            def fill(staging: Path) -> None:
                save_file({k: v.contiguous() for k, v in state.items()}, str(staging / "model.safetensors"))
                for name in _HF_SIDE_FILES:
                    if (self.model_path / name).is_file():
                        shutil.copy2(self.model_path / name, staging / name)

            replace_directory(target, fill)
        dist.barrier()
        return str(target)

    # ----------------------------------------------------------------------------------- checkpoints
    def _sharded_state(self, *, loading: bool) -> dict[str, Any]:
        model_sd = self._gpt(self.model).sharded_state_dict()
        # Name the distributed optimizer's layout: megatron-core's default ("fully_sharded_model_space") is
        # deprecated and refused by its own dist_checkpointing in 0.16 ("ShardedTensor.flattened_range is not
        # supported", seen on an H100).
        metadata = {
            "distrib_optim_sharding_type": self.megatron.optimizer_checkpoint_format,
            "chained_optim_avoid_prefix": True,
        }
        return {
            "model": model_sd,
            "optimizer": self.optimizer.sharded_state_dict(model_sd, is_loading=loading, metadata=metadata),
        }

    def save_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """Write a Megatron distributed checkpoint under ``<path>/actor/``; collective.

        Model and optimizer go through ``megatron.core.dist_checkpointing`` (loadable at another TP / PP / DP
        layout); counters and the shuffle generator to ``trainer.pt``.
        """
        self.onload()
        root = Path(path) / "actor"
        (root / "megatron").mkdir(parents=True, exist_ok=True)  # dist_checkpointing.save needs it to exist
        dist_checkpointing.save(self._sharded_state(loading=False), str(root / "megatron"))
        if dist.get_rank() == 0:
            trainer = {
                "version": self.version,
                "train_steps": self.train_steps,
                "total_steps": self.total_steps,
                "sft_steps": self.sft_steps,
                "optimizer_steps": self.optimizer_steps,
                "generator": self.generator.get_state(),
            }
            torch.save(trainer, root / "trainer.pt")
            (root / "layout.json").write_text(
                json.dumps(
                    {"tp": self.megatron.tensor_parallel_size, "pp": self.megatron.pipeline_parallel_size}
                )
            )
        dist.barrier()
        if self.cfg.enable_offload:
            self.offload()

    def load_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """Restore what :meth:`save_checkpoint` wrote (any TP / PP / DP layout); collective."""
        root = Path(path) / "actor"
        if not (root / "trainer.pt").is_file():
            raise FileNotFoundError(
                f"load_checkpoint: {root} holds no Megatron actor checkpoint (no trainer.pt)"
            )
        self.onload()
        loaded = dist_checkpointing.load(self._sharded_state(loading=True), str(root / "megatron"))
        self._gpt(self.model).load_state_dict(loaded["model"])
        with torch.no_grad():  # fp32 weights: the optimizer's parameters are views of leaves that need grad
            self.optimizer.load_state_dict(loaded["optimizer"])
        trainer = torch.load(root / "trainer.pt", map_location="cpu", weights_only=True)
        self.version, self.train_steps = int(trainer["version"]), int(trainer["train_steps"])
        self.sft_steps, self.optimizer_steps = int(trainer["sft_steps"]), int(trainer["optimizer_steps"])
        self.total_steps = resumed_schedule_total(
            trainer.get("total_steps"),
            self.total_steps,
            reset=self.cfg.optim.reset_lr_schedule_on_resume,
            warn=_LOG.warning if dist.get_rank() == 0 else _ignore,
        )
        self.generator.set_state(trainer["generator"])
        if self.cfg.enable_offload:
            self.offload()

    # --------------------------------------------------------------------------------- offload / onload
    def offload(self) -> None:
        """Free GPU memory between phases (collocated runs).

        Parameter and gradient buffers go to pinned host memory (megatron's ``_ParamAndGradBuffer.offload_to_cpu``),
        the optimizer's own tensors (its state, and fp32 main parameters that are copies) to the host, and so do
        parameters outside the buffers and the reference model.

        Not ``MegatronOptimizer.offload_to_cpu``: it moves every optimizer parameter with ``p.data = p.data.cpu()``,
        and with fp32 weights the distributed optimizer's parameters are views into the DDP parameter buffer.
        After the buffer is freed that copy fails (``CUDA error: invalid argument``, seen on an H100 with
        megatron-core 0.16.1); done before it, the views would come back as separate tensors and optimizer steps
        would no longer reach the model. Views into the buffers stay where they are: the buffer carries them.
        """
        if self._offloaded:
            return
        torch.cuda.synchronize()
        buffers = self.model.buffers + self.model.expert_parallel_buffers
        in_buffers = {
            t.untyped_storage().data_ptr()
            for b in buffers
            for t in (b.param_data, b.grad_data)
            if t is not None and t.untyped_storage().size() > 0
        }
        self._moved_optimizer_tensors = _move_optimizer_tensors(self.optimizer, in_buffers)
        for buffer in buffers:
            buffer.offload_to_cpu(move_params=True, move_grads=True)
        for p in self.model.parameters():  # parameters that do not live in a DDP buffer
            if p.is_cuda and p.untyped_storage().size() > 0:
                p.data = p.data.cpu()
        if self.ref_model is not None:
            self.ref_model.cpu()
        torch.cuda.empty_cache()
        self._offloaded = True

    def onload(self) -> None:
        """Undo :meth:`offload`."""
        if not self._offloaded:
            return
        for buffer in self.model.buffers + self.model.expert_parallel_buffers:
            buffer.reload_from_cpu(move_params=True, move_grads=True)
        for p in self.model.parameters():
            if not p.is_cuda:
                p.data = p.data.to(self.device)
        for holder, key in self._moved_optimizer_tensors:
            if key is None:
                holder.data = holder.data.to(self.device)
            else:
                holder[key] = holder[key].to(self.device)
        self._moved_optimizer_tensors = []
        if self.ref_model is not None:
            self.ref_model.to(self.device)
        torch.cuda.synchronize()
        self._offloaded = False
