"""The FSDP2 training backend of the LLM actor (:class:`FSDPActorBackend`, hosted by ``LLMActorWorker``).

Batch contract (``N`` sequences of ``T`` tokens; torch tensors or numpy arrays; extra keys are ignored):

- ``input_ids [N, T]`` int, ``attention_mask [N, T]`` (1 = token), prompts LEFT-padded, responses RIGHT-padded;
- ``loss_mask [N, T]`` (1 on trained response tokens; 0 on prompt, padding, tool outputs);
- ``advantages [N, T]`` float (token level; broadcast sequence advantages first) — ``run_training`` only;
- optional ``old_logprobs [N, T]`` (behaviour log-probs for the PPO ratio; recomputed when absent),
  ``ref_logprobs [N, T]`` (computed when absent and ``algorithm.kl_beta > 0``), ``values``/``prev_values [N, T]``
  (computed when absent and the loss has a critic), ``returns [N, T]`` (required by critic losses),
  ``rollout_logprobs [N, T]`` (only for the ``actor/rollout_logprob_diff`` metric);
- a vision-language model's (Qwen2.5-VL) packed prompt images: ``images [N, K, H, W, 3]`` uint8 and
  ``image_sizes [N, K, 2]`` (:func:`rlinf_core.data.pack_images`), sliced by rows with the rest.

Index ``t`` of every per-token tensor belongs to ``input_ids[:, t]`` (log-prob of that token given the ones
before; see :class:`~rlinf_models.llm.CausalLMPolicy`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from rlinf_algos import (
    compute_critic_explained_variance_from_stats,
    get_loss_agg_func,
    kl_penalty,
    policy_loss,
)
from rlinf_core.checkpoint import replace_directory
from rlinf_core.config import AlgorithmConfig
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

from .._fsdp import (
    full_model_state_dict,
    full_optimizer_state_dict,
    init_distributed,
    load_full_model_state_dict,
    load_full_optimizer_state_dict,
    load_rank_rng,
    move_training_state,
    save_checkpoint_files,
    save_rank_rng,
    select_device,
)
from ..actor import (
    MetricMeans,
    accumulate_gradients,
    check_layout,
    clip_gradients,
    loss_shares,
    lr_scale,
    mean_over_ranks,
    micro_batches,
    resumed_schedule_total,
    run_update,
    shuffled_minibatches,
    token_budget_micro_batches,
)
from ._batch import check_batch, corrected_advantages
from ._config import LLMActorConfig
from ._hf import load_causal_lm, load_tokenizer
from ._lora import ADAPTER_DIR, apply_lora, merge_lora_state, write_peft_adapter
from ._policy import CausalLMPolicy
from ._varlen import use_varlen_sdpa
from ._vlm import VLMPolicy, images_of, is_vision_language, load_image_processor

__all__ = ["CHECKPOINT_SUBDIR", "FSDPActorBackend"]

_LOG = logging.getLogger(__name__)

CHECKPOINT_SUBDIR = "actor"
"""Directory inside a checkpoint (``global_step_<N>/actor/``) holding the actor's files."""

_CRITIC_LOSSES = ("actor_critic", "decoupled_actor_critic")


def _shard(policy: CausalLMPolicy, mesh: Any, *, cpu_offload: bool) -> None:
    """FSDP2: one unit per decoder layer, one for the value head, the rest (embeddings, norm, LM head) in the root."""
    kwargs: dict[str, Any] = {"mesh": mesh}
    if cpu_offload and mesh.device_type == "cuda":
        kwargs["offload_policy"] = CPUOffloadPolicy()
    decoder = policy.model.get_decoder()
    for layer in getattr(decoder, "layers", []):
        fully_shard(layer, **kwargs)
    visual = getattr(getattr(policy.model, "model", None), "visual", None)
    if (
        visual is not None
    ):  # a vision-language model: one unit per vision block, one for the rest of the tower
        for block in getattr(visual, "blocks", []):
            fully_shard(block, **kwargs)
        fully_shard(visual, **kwargs)
    if policy.value_head is not None:
        # Its own unit: the float32 head never shares an all-gather with bfloat16 model weights.
        fully_shard(policy.value_head, **kwargs)
    fully_shard(policy, **kwargs)


def _hf_keys(
    state: Mapping[str, torch.Tensor], policy: CausalLMPolicy, lora_scaling: float | None = None
) -> dict[str, torch.Tensor]:
    """Policy state dict → the wrapped HF model's keys (``model.`` prefix stripped, value head dropped).

    With LoRA (``lora_scaling`` set) the adapters are merged into the weights they wrap: the plain model's keys.
    """
    out = {k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")}
    if lora_scaling is not None:
        out = merge_lora_state(out, lora_scaling)
    if getattr(policy.config, "tie_word_embeddings", False) and "lm_head.weight" not in out:
        emb = policy.model.get_input_embeddings()
        for name, param in policy.model.named_parameters():
            if param is emb.weight and name in out:
                out["lm_head.weight"] = out[name]
                break
    return out


def _live_columns(attention_mask: torch.Tensor) -> slice:
    """Columns ``[lo, hi)`` holding a token in some row (at least 2): the rest is padding in every row.

    Dropping all-padding columns at both ends changes no score of a real token (positions come from the mask,
    attention is causal and masked), and saves the compute and activation memory of the padding.
    """
    t = attention_mask.shape[1]
    cols = attention_mask.bool().any(0).nonzero().squeeze(-1)
    if cols.numel() == 0:
        return slice(0, t)
    lo, hi = int(cols[0]), int(cols[-1]) + 1
    if hi - lo < 2:
        lo, hi = (lo, lo + 2) if lo + 2 <= t else (t - 2, t)
    return slice(lo, hi)


_IMAGE_KEYS = ("images", "image_sizes")
"""A vision-language batch's packed images: row-aligned, but not ``[N, T]`` (never cut by columns)."""

_FLOAT_KEYS = (
    "advantages",
    "old_logprobs",
    "ref_logprobs",
    "values",
    "prev_values",
    "returns",
    "rollout_logprobs",
)
"""Float ``[N, T]`` keys this backend reads (the megatron backend reads a subset: no critic)."""


class FSDPActorBackend:
    """Trains a :class:`~rlinf_models.llm.CausalLMPolicy` (PPO/GRPO/Reinforce++ updates, SFT); FSDP2 over ranks.

    Construct it on every rank of the actor group (with more than one rank, after ``RANK`` / ``WORLD_SIZE`` /
    ``MASTER_ADDR`` / ``MASTER_PORT`` are set: it joins the default process group). All public methods are
    collective.

    **How the batch is split across ranks.** Every rank is called with the SAME full batch of ``N`` sequences
    (the runner passes one batch to the group call) and returns the same global result:

    - :meth:`compute_logprobs`: rank ``r`` scores rows ``[r*S, (r+1)*S)`` with ``S = ceil(N / W)`` (the last
      share padded), then the shares are all-gathered, so every rank returns the full ``[N, T]`` tensors.
    - :meth:`run_training`: every epoch draws one permutation of the ``N`` rows from a generator seeded with
      ``actor.seed`` (identical on all ranks) and cuts it into mini-batches of ``global_batch_size`` rows (the
      last one may be smaller); rank ``r`` takes the contiguous block ``r`` (``1/W`` of the rows) of each
      mini-batch and splits it into micro-batches of ``micro_batch_size`` rows; gradients are averaged over
      ranks by FSDP, so W ranks make the update one rank makes on the same batch. ``N`` must be a multiple of
      ``W * micro_batch_size``.
    - :meth:`run_sft`: rank ``r`` takes rows ``[r*N/W, (r+1)*N/W)`` (``N`` a multiple of ``W``), one optimizer
      step, loss normalised by the number of trained tokens of the whole batch.

    Metrics are averaged over ranks (identical on every rank).

    Args:
        cfg: the ``actor:`` config.
        algorithm: the ``algorithm:`` config (loss type, clip ratios, entropy bonus, KL, epochs).
        rank: this rank of the actor group.
        world_size: ranks of the actor group.
        total_steps: training steps of the run (for ``actor.optim.lr_schedule: linear``).
        log_warning: ``%``-style warning logger (a skipped optimizer step, a checkpoint without this rank's RNG).
    """

    def __init__(
        self,
        cfg: LLMActorConfig,
        algorithm: AlgorithmConfig,
        *,
        rank: int = 0,
        world_size: int = 1,
        total_steps: int | None = None,
        log_warning: Callable[..., None] = _LOG.warning,
    ) -> None:
        critic = algorithm.loss_type in _CRITIC_LOSSES
        if critic and not cfg.model.add_value_head:
            raise ValueError(
                f"algorithm.loss_type={algorithm.loss_type!r} trains a critic: set actor.model.add_value_head: true"
            )
        check_layout(rank, world_size, cfg.global_batch_size, cfg.micro_batch_size)
        world = world_size
        self.cfg = cfg
        self.algorithm = algorithm
        self.rank = rank
        self.world_size = world_size
        self.total_steps = total_steps
        self.log_warning = log_warning
        self.critic = critic
        self.device = select_device()
        self.distributed = world > 1
        self._mesh = init_distributed(self.device) if self.distributed else None

        self._lora_scaling = cfg.model.lora_scaling if cfg.model.is_lora else None
        torch.manual_seed(cfg.seed)  # the value head (and LoRA's A) start identical on every rank
        self.policy = self._build_policy(trainable=True)
        self.ref_policy: CausalLMPolicy | None = None
        if algorithm.kl_beta > 0 or algorithm.reinpp_kl_beta > 0:
            self.ref_policy = self._build_policy(trainable=False)

        optim = cfg.optim
        value_params = [p for n, p in self.policy.named_parameters() if n.startswith("value_head.")]
        value_ids = {id(p) for p in value_params}
        groups = [
            {
                # frozen parameters (a LoRA run's base weights) get no optimizer state
                "params": [p for p in self.policy.parameters() if id(p) not in value_ids and p.requires_grad],
                "lr": optim.lr,
                "initial_lr": optim.lr,
            }
        ]
        if value_params:
            value_lr = optim.value_lr or optim.lr
            groups.append({"params": value_params, "lr": value_lr, "initial_lr": value_lr})
        self.optimizer = torch.optim.AdamW(
            groups,
            betas=(optim.adam_beta1, optim.adam_beta2),
            eps=optim.adam_eps,
            weight_decay=optim.weight_decay,
        )
        self.generator = torch.Generator().manual_seed(cfg.seed)
        self.train_steps = 0
        self.sft_steps = 0
        self.optimizer_steps = 0
        self.skipped_steps = 0
        self.version = 0
        self._loss_agg = get_loss_agg_func(algorithm.loss_agg_func)
        self._offloaded = False
        if cfg.enable_offload:
            self.offload()

    def _build_policy(self, *, trainable: bool) -> CausalLMPolicy:
        model = load_causal_lm(self.cfg.model)
        vlm = is_vision_language(self.cfg.model.model_path)
        if self.cfg.use_remove_padding and not vlm:
            use_varlen_sdpa(model)  # per-sequence attention in packed rows instead of one dense block mask
        if trainable and self.cfg.model.is_lora:
            model = apply_lora(model, self.cfg.model)  # the reference model stays the base model
        value_head = self.cfg.model.add_value_head and trainable
        policy = (
            VLMPolicy(
                model,
                load_image_processor(self.cfg.model),
                add_value_head=value_head,
                logprob_chunk_size=self.cfg.logprob_chunk_size,
            )
            if vlm
            else CausalLMPolicy(
                model, add_value_head=value_head, logprob_chunk_size=self.cfg.logprob_chunk_size
            )
        ).to(self.device)
        if not trainable:
            policy.requires_grad_(False)
            policy.eval()
        if self._mesh is not None:
            _shard(policy, self._mesh, cpu_offload=self.cfg.enable_offload)
        return policy

    # ------------------------------------------------------------------------------------------ helpers
    def _all_reduce_sum(self, x: torch.Tensor) -> torch.Tensor:
        if not self.distributed:
            return x
        out = x.detach().to(self.device).clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out.cpu()

    def _batch(self, batch: Mapping[str, Any], required: tuple[str, ...]) -> dict[str, torch.Tensor]:
        """Validate and convert the keys this backend reads (all ``[N, T]``) to CPU tensors."""
        out = check_batch(batch, required, float_keys=_FLOAT_KEYS)
        if "values" in out and "prev_values" not in out:
            out["prev_values"] = out.pop("values")
        return out

    def _score(
        self,
        policy: CausalLMPolicy,
        ids: torch.Tensor,
        mask: torch.Tensor,
        *,
        values: bool,
        score_mask: torch.Tensor | None = None,
        vision: Mapping[str, torch.Tensor] | None = None,
    ) -> dict[str, torch.Tensor]:
        """No-grad log-probs (and values) of ``ids`` (with their packed images) in micro-batches on this rank."""
        mbs = self.cfg.micro_batch_size
        lps, vals = [], []
        policy.eval()
        with torch.no_grad():
            for s in range(0, ids.shape[0], mbs):
                cols = _live_columns(mask[s : s + mbs])
                sel = None if score_mask is None else score_mask[s : s + mbs, cols].to(self.device)
                out = policy(
                    ids[s : s + mbs, cols].to(self.device),
                    mask[s : s + mbs, cols].to(self.device),
                    temperature=self.cfg.temperature,
                    compute_values=values,
                    score_mask=sel,
                    remove_padding=self.cfg.use_remove_padding,
                    vision=images_of(vision or {}, slice(s, s + mbs)),
                )
                rows = min(mbs, ids.shape[0] - s)
                lp = out["logprobs"].new_zeros((rows, ids.shape[1]))
                lp[:, cols] = out["logprobs"].float()
                lps.append(lp)
                if values:
                    v = lp.new_zeros((rows, ids.shape[1]))
                    v[:, cols] = out["values"].float()
                    vals.append(v)
        if self.distributed:
            # FSDP2 keeps the root unit unsharded after a forward (it expects the backward next); without one,
            # reshard explicitly so state-dict calls see sharded parameters again.
            policy.reshard()  # type: ignore[operator]
        res = {"logprobs": torch.cat(lps)}
        if values:
            res["values"] = torch.cat(vals)
        return res

    def _gather_rows(self, local: torch.Tensor, n: int) -> torch.Tensor:
        if not self.distributed:
            return local[:n].cpu()
        local = local.to(self.device).contiguous()
        parts = [torch.empty_like(local) for _ in range(self.world_size)]
        dist.all_gather(parts, local)
        return torch.cat(parts)[:n].cpu()

    def _compute(self, b: Mapping[str, torch.Tensor], *, ref: bool, values: bool) -> dict[str, torch.Tensor]:
        ids, mask = b["input_ids"], b["attention_mask"]
        n = ids.shape[0]
        share = math.ceil(n / self.world_size)
        rows = torch.arange(self.rank * share, (self.rank + 1) * share).clamp_max(
            n - 1
        )  # pad: repeat the last row
        ids_l, mask_l = ids[rows], mask[rows]
        # Only loss-mask positions are ever used: skip the vocabulary projection elsewhere.
        sel = b["loss_mask"][rows] if "loss_mask" in b else None
        vision = images_of(b, rows)
        out = self._score(self.policy, ids_l, mask_l, values=values, score_mask=sel, vision=vision)
        result = {"logprobs": self._gather_rows(out["logprobs"], n)}
        if values:
            result["values"] = self._gather_rows(out["values"], n)
        if ref:
            if self.ref_policy is None:
                raise RuntimeError("no reference model: set algorithm.kl_beta (or reinpp_kl_beta) > 0")
            result["ref_logprobs"] = self._gather_rows(
                self._score(self.ref_policy, ids_l, mask_l, values=False, score_mask=sel, vision=vision)[
                    "logprobs"
                ],
                n,
            )
        return result

    # ------------------------------------------------------------------------------------ offload / lr
    def offload(self) -> None:
        """Move weights and optimizer state to the CPU (one-rank CUDA runs; FSDP2 ranks use CPUOffloadPolicy).

        A no-op on CPU runs, and for FSDP2 groups (their parameters and optimizer state already live on the CPU
        between uses when ``actor.enable_offload`` is set).
        """
        if self.device.type != "cuda" or self.distributed or self._offloaded:
            return
        move_training_state(self._modules(), self.optimizer, torch.device("cpu"))
        self._offloaded = True

    def onload(self) -> None:
        """Bring weights and optimizer state back after :meth:`offload`."""
        if not self._offloaded:
            return
        move_training_state(self._modules(), self.optimizer, self.device)
        self._offloaded = False

    def _modules(self) -> list[nn.Module]:
        return [self.policy] if self.ref_policy is None else [self.policy, self.ref_policy]

    def _set_lr(self, *, sft: bool) -> float:
        optim = self.cfg.optim
        scale = 1.0 if sft else lr_scale(optim.lr_schedule, self.train_steps, self.total_steps)
        for i, group in enumerate(self.optimizer.param_groups):
            base = group["initial_lr"]
            if sft and i == 0 and self.cfg.sft_lr is not None:
                base = self.cfg.sft_lr
            group["lr"] = base * scale
        return float(self.optimizer.param_groups[0]["lr"])

    def _step(self) -> float:
        grad_norm = clip_gradients(self.policy.parameters(), self.cfg.optim.clip_grad)
        if not math.isfinite(grad_norm):
            # NaN/inf gradients (e.g. from a NaN advantage) must not reach the weights: skip this step on every
            # rank (the norm is global, so all ranks agree).
            self.optimizer.zero_grad(set_to_none=True)
            self.skipped_steps += 1
            self.log_warning("non-finite gradient norm (%s): optimizer step skipped", grad_norm)
            return grad_norm
        self.optimizer.step()
        self.optimizer_steps += 1
        return grad_norm

    # ---------------------------------------------------------------------------------------- the API
    def get_model_version(self) -> int:
        """Number of completed :meth:`run_training` / :meth:`run_sft` calls (0 = initial weights)."""
        return self.version

    def compute_logprobs(self, batch: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        """Score the batch with the current weights (no gradient); call on every rank with the same batch.

        Args:
            batch: ``input_ids [N, T]`` and ``attention_mask [N, T]``; with ``loss_mask [N, T]`` only those
                positions are scored (log-probs elsewhere are 0; values are computed everywhere). Other keys
                are ignored.

        Returns:
            On every rank, CPU float32 ``[N, T]`` tensors: ``"logprobs"`` (at ``actor.temperature``),
            ``"ref_logprobs"`` (when a reference model exists: ``algorithm.kl_beta`` or ``reinpp_kl_beta`` > 0)
            and ``"values"`` (when the policy has a value head). Column 0 is 0.
        """
        b = self._batch(batch, ("input_ids", "attention_mask"))
        self.onload()
        try:
            return self._compute(
                b, ref=self.ref_policy is not None, values=self.policy.value_head is not None
            )
        finally:
            if self.cfg.enable_offload:
                self.offload()

    def _micro_loss(
        self,
        mb: Mapping[str, torch.Tensor],
        *,
        on_policy: bool,
        has_loss_tokens: bool = True,
        vision: Mapping[str, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, dict[str, float | torch.Tensor]]:
        alg = self.algorithm
        mask = mb["loss_mask"].bool()
        out = self.policy(
            mb["input_ids"],
            mb["attention_mask"],
            temperature=self.cfg.temperature,
            compute_entropy=True,
            compute_values=self.critic,
            score_mask=mb["loss_mask"],
            remove_padding=self.cfg.use_remove_padding,
            vision=vision,
        )
        logprobs = out["logprobs"]
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
            "critic_warmup": self.optimizer_steps < alg.critic_warmup_steps,
        }
        if alg.clip_ratio_c is not None:
            kwargs["clip_ratio_c"] = alg.clip_ratio_c
        if self.critic:
            kwargs.update(
                values=out["values"],
                returns=mb["returns"],
                prev_values=mb["prev_values"],
                value_clip=alg.value_clip,
                huber_delta=alg.huber_delta,
            )
        loss, raw = policy_loss(**kwargs)
        # ``__sum__/`` keys are explained-variance statistics: MetricMeans sums them instead of averaging.
        # Metrics stay 0-d tensors: turning them into floats here would make the host wait for the GPU before
        # every backward pass; MetricMeans reads them back once per update.
        metrics: dict[str, float | torch.Tensor] = {
            key: val.detach() if isinstance(val, torch.Tensor) else float(val)
            for key, val in (raw | is_metrics).items()
        }
        entropy = self._loss_agg(out["entropy"], mask, None)
        metrics["actor/entropy"] = entropy.detach()
        if "rollout_logprobs" in mb and has_loss_tokens:
            # Trainer-vs-rollout mismatch of the behaviour log-probs (0 up to float error when both agree).
            metrics["actor/rollout_logprob_diff"] = (old.detach() - mb["rollout_logprobs"]).abs()[mask].mean()
        if alg.entropy_bonus > 0:
            loss = loss - alg.entropy_bonus * entropy
        if alg.kl_beta > 0:
            # KL(π || π_ref) estimated on the sampled tokens: kl_penalty(logprob, ref_logprob) (Megatron order).
            kld = kl_penalty(logprobs, mb["ref_logprobs"], alg.kl_penalty)
            kl_loss = self._loss_agg(kld, mask, None)
            loss = loss + alg.kl_beta * kl_loss
            metrics["actor/kl_loss"] = kl_loss.detach()
        metrics["actor/total_loss"] = loss.detach()
        return loss, metrics

    def _micro_split(
        self, rows: torch.Tensor, attention_mask: torch.Tensor, *, keep_remainder: bool = False
    ) -> list[torch.Tensor]:
        """This rank's micro-batches of ``rows``: ``micro_batch_size`` rows each, or ``max_tokens_per_mbs``.

        Fixed sizes drop a remainder of fewer rows unless ``keep_remainder``. With a token budget every rank makes as many micro-batches as the rank that needs the most (FSDP2's
        collectives need the same number of forward and backward passes on every rank).
        """
        budget = self.cfg.max_tokens_per_mbs
        if budget is None:
            if keep_remainder:
                size = self.cfg.micro_batch_size
                return [rows[s : s + size] for s in range(0, rows.shape[0], size)]
            return micro_batches(rows, self.cfg.micro_batch_size)
        tokens = attention_mask[rows].sum(1)
        count = len(token_budget_micro_batches(rows, tokens, budget))
        if self.distributed:
            needed = torch.tensor([count], device=self.device)
            dist.all_reduce(needed, op=dist.ReduceOp.MAX)
            count = min(int(needed.item()), rows.shape[0])
        return token_budget_micro_batches(rows, tokens, budget, count=count)

    def _fill_missing(self, b: dict[str, torch.Tensor], *, on_policy: bool) -> None:
        """Compute the ``old_logprobs`` / ``ref_logprobs`` / ``prev_values`` the update needs and lacks."""
        need_old = "old_logprobs" not in b and not on_policy
        need_ref = self.algorithm.kl_beta > 0 and "ref_logprobs" not in b
        need_values = self.critic and "prev_values" not in b
        if not (need_old or need_ref or need_values):
            return
        extra = self._compute(b, ref=need_ref, values=need_values)
        if need_old:
            b["old_logprobs"] = extra["logprobs"]
        if need_ref:
            b["ref_logprobs"] = extra["ref_logprobs"]
        if need_values:
            b["prev_values"] = extra["values"]

    def run_training(self, batch: Mapping[str, Any]) -> dict[str, float]:
        """PPO-style update: ``algorithm.update_epoch`` passes of mini-batch steps over the batch.

        Call on every rank with the same batch (see the class docstring for the split). Missing
        ``old_logprobs`` are recomputed with the current weights first, except when the whole update is a single
        optimizer step (``update_epoch == 1`` and ``N <= global_batch_size``), where the detached current
        log-probs are those exact values. Missing ``ref_logprobs`` (KL) and ``prev_values`` (critic) are computed
        too.

        Returns:
            Global metrics: ``actor/policy_loss``, ``actor/clip_fraction``, ``actor/approx_kl``, ``actor/ratio``,
            ``actor/entropy``, ``actor/kl_loss`` (KL on), ``actor/total_loss``, ``actor/grad_norm``, ``actor/lr``,
            ``actor/rollout_logprob_diff`` (with ``rollout_logprobs``), ``actor/is_weight_mean``,
            ``actor/is_weight_max`` and ``actor/is_clip_fraction`` (``importance_sampling_fix``), ``critic/value_loss`` and
            ``critic/explained_variance`` (critic losses), ``actor/num_optimizer_steps``,
            ``actor/skipped_steps`` (total optimizer steps skipped for a non-finite gradient norm).
        """
        alg = self.algorithm
        b = self._batch(batch, self._training_keys())
        n, world, mbs, gbs = (
            b["input_ids"].shape[0],
            self.world_size,
            self.cfg.micro_batch_size,
            self.cfg.global_batch_size,
        )
        if n % (world * mbs):
            raise ValueError(
                f"run_training: the batch has {n} sequences, not a multiple of actor.micro_batch_size ({mbs}) x "
                f"actor world size ({world})"
            )
        self.onload()
        on_policy = "old_logprobs" not in b and alg.update_epoch == 1 and n <= gbs
        self._fill_missing(b, on_policy=on_policy)
        lr = self._set_lr(sft=False)
        metrics = MetricMeans()
        self.policy.train()

        def loss_fn(sel: torch.Tensor) -> tuple[torch.Tensor, dict[str, float | torch.Tensor]]:
            cols = _live_columns(b["attention_mask"][sel])
            return self._micro_loss(
                {key: val[sel][:, cols].to(self.device) for key, val in b.items() if key not in _IMAGE_KEYS},
                on_policy=on_policy,
                has_loss_tokens=bool(b["loss_mask"][sel].any()),  # read on the host: no wait for the GPU
                vision=images_of(b, sel),
            )

        def step(rows: torch.Tensor) -> None:
            micro = self._micro_split(rows, b["attention_mask"])
            weights = None
            if self.cfg.max_tokens_per_mbs is not None:
                weights = loss_shares(micro, b["loss_mask"], alg.loss_agg_func)
            accumulate_gradients(micro, loss_fn, self.optimizer, metrics, weights)
            metrics.add({"actor/grad_norm": self._step()})

        steps = run_update(
            epochs=alg.update_epoch,
            minibatches=lambda: shuffled_minibatches(
                n, global_batch_size=gbs, rank=self.rank, world_size=world, generator=self.generator
            ),
            step=step,
        )
        self.train_steps += 1
        self.version += 1
        return self._update_metrics(metrics, lr, steps)

    def run_training_stream(self, micro_batches: Iterable[Mapping[str, Any]]) -> dict[str, float]:
        """One on-policy optimizer step over micro-batches that arrive one at a time (the pipelined mode).

        Each item is THIS rank's micro-batch (the :meth:`run_training` keys, ``[n, T]`` with its own ``T``);
        every rank must receive the same number of items (FSDP2 runs one forward and backward per item on all
        ranks together). Each micro-batch is scored and back-propagated as soon as it arrives, while the
        producer is still generating the next ones: the reference log-probs of the KL term are computed per
        micro-batch, the behaviour log-probs are the detached current ones (the update is a single optimizer
        step). Every micro-batch's loss counts once; when the iterator ends, the summed gradient is divided by
        the number of micro-batches, which is the gradient :meth:`run_training` accumulates over the same
        micro-batches, then one clipped optimizer step is taken. Without any item there is no step.

        Returns:
            :meth:`run_training`'s metrics, plus ``actor/num_micro_batches``.

        Raises:
            ValueError: for ``algorithm.update_epoch`` other than 1, or a micro-batch missing a required key.
        """
        alg = self.algorithm
        if alg.update_epoch != 1:
            raise ValueError(
                f"run_training_stream takes one optimizer step per call: algorithm.update_epoch must be 1, "
                f"got {alg.update_epoch}"
            )
        required = self._training_keys()
        self.onload()
        lr = self._set_lr(sft=False)
        metrics = MetricMeans()
        self.optimizer.zero_grad(set_to_none=True)
        count = 0
        for item in micro_batches:
            b = self._batch(item, required)
            if self.algorithm.kl_beta > 0 and "ref_logprobs" not in b:
                if self.ref_policy is None:
                    raise RuntimeError("no reference model: set algorithm.kl_beta > 0")
                sel = b["loss_mask"]
                b["ref_logprobs"] = self._score(
                    self.ref_policy,
                    b["input_ids"],
                    b["attention_mask"],
                    values=False,
                    score_mask=sel,
                    vision=images_of(b),
                )["logprobs"]
            if self.critic and "prev_values" not in b:
                b["prev_values"] = self._score(
                    self.policy, b["input_ids"], b["attention_mask"], values=True, vision=images_of(b)
                )["values"]
            self.policy.train()
            cols = _live_columns(b["attention_mask"])
            loss, values = self._micro_loss(
                {key: val[:, cols].to(self.device) for key, val in b.items() if key not in _IMAGE_KEYS},
                on_policy=True,
                has_loss_tokens=bool(b["loss_mask"].any()),
                vision=images_of(b),
            )
            loss.backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated
            metrics.add(values, 1.0)
            count += 1
        if count:
            for param in self.policy.parameters():
                if param.grad is not None:
                    param.grad.div_(count)
            metrics.add({"actor/grad_norm": self._step()})
            self.train_steps += 1
            self.version += 1
        out = self._update_metrics(metrics, lr, 1 if count else 0)
        out["actor/num_micro_batches"] = float(count)
        return out

    def _training_keys(self) -> tuple[str, ...]:
        """The batch keys an update reads: returns for a critic, rollout log-probs for the importance fix."""
        required: tuple[str, ...] = ("input_ids", "attention_mask", "loss_mask", "advantages")
        if self.critic:
            required = (*required, "returns")
        if self.algorithm.importance_sampling_fix:
            required = (*required, "rollout_logprobs")  # the weights compare the trainer to the rollout
        return required

    def _update_metrics(self, metrics: MetricMeans, lr: float, steps: int) -> dict[str, float]:
        """An update's global metrics (averaged over ranks); offloads afterwards when configured."""
        out = mean_over_ranks(metrics.means(), self.world_size, self._all_reduce_sum) if metrics.sums else {}
        if metrics.totals:
            totals = metrics.total_values()
            keys = list(totals)
            summed = self._all_reduce_sum(torch.tensor([totals[k] for k in keys], dtype=torch.float64))
            out["critic/explained_variance"] = float(
                compute_critic_explained_variance_from_stats(dict(zip(keys, summed.tolist(), strict=True)))
            )
        out["actor/lr"] = lr
        out["actor/num_optimizer_steps"] = float(steps)
        out["actor/skipped_steps"] = float(self.skipped_steps)
        if self.cfg.enable_offload:
            self.offload()
        return out

    def run_sft(self, batch: Mapping[str, Any]) -> dict[str, float]:
        """One supervised optimizer step: token-mean cross-entropy on the ``loss_mask`` tokens of the batch.

        Call on every rank with the same batch; rank ``r`` takes rows ``[r*N/W, (r+1)*N/W)`` in micro-batches.
        The learning rate is ``actor.sft_lr`` (default ``actor.optim.lr``), without the RL schedule.

        Args:
            batch: ``input_ids``, ``attention_mask``, ``loss_mask`` (all ``[N, T]``); ``loss_mask[:, 0]`` is
                ignored (the first token has no context).

        Returns:
            ``sft/loss`` (mean negative log-likelihood per trained token over the batch), ``sft/grad_norm``,
            ``sft/lr``, ``sft/num_tokens``.
        """
        b = self._batch(batch, ("input_ids", "attention_mask", "loss_mask"))
        n, world = b["input_ids"].shape[0], self.world_size
        if n % world:
            raise ValueError(
                f"run_sft: the batch has {n} sequences, not a multiple of the actor world size ({world})"
            )
        mask_all = b["loss_mask"].clone()
        mask_all[:, 0] = 0
        total = float(mask_all.sum())
        if total == 0:
            raise ValueError("run_sft: loss_mask selects no token (after column 0)")
        self.onload()
        lr = self._set_lr(sft=True)
        share = n // world
        rows = slice(self.rank * share, (self.rank + 1) * share)
        ids, attn, lmask = b["input_ids"][rows], b["attention_mask"][rows], mask_all[rows]
        vision = images_of(b, rows)
        self.policy.train()
        self.optimizer.zero_grad(set_to_none=True)
        nll_sum = torch.zeros((), dtype=torch.float64, device=self.device)  # read back once, after the step
        for sel in self._micro_split(torch.arange(share), attn, keep_remainder=True):
            cols = _live_columns(attn[sel])
            m = lmask[sel][:, cols].to(self.device).float()
            out = self.policy(
                ids[sel][:, cols].to(self.device),
                attn[sel][:, cols].to(self.device),
                compute_values=False,
                score_mask=m,
                remove_padding=self.cfg.use_remove_padding,
                vision=images_of(vision or {}, sel),
            )
            nll = -(out["logprobs"] * m).sum()
            # FSDP averages gradients over ranks: scale by W so the result is the global token mean.
            (nll * (world / total)).backward()
            nll_sum += nll.detach().to(torch.float64)
        grad_norm = self._step()
        self.sft_steps += 1
        self.version += 1
        loss = float(self._all_reduce_sum(nll_sum.cpu().reshape(1))[0]) / total
        if self.cfg.enable_offload:
            self.offload()
        return {"sft/loss": loss, "sft/grad_norm": grad_norm, "sft/lr": lr, "sft/num_tokens": total}

    def update_reference_model(self) -> None:
        """Copy the current policy weights into the frozen reference model (e.g. after an SFT warm-up)."""
        if self.ref_policy is None:
            raise RuntimeError("no reference model: set algorithm.kl_beta (or reinpp_kl_beta) > 0")
        state = full_model_state_dict(self.policy)
        if self.distributed:
            holder = [state]
            dist.broadcast_object_list(holder, src=0)
            state = holder[0]
        ref_state = {k: v for k, v in state.items() if not k.startswith("value_head.")}
        if self._lora_scaling is not None:  # the reference is the plain model: merge the adapters into it
            ref_state = merge_lora_state(ref_state, self._lora_scaling)
        load_full_model_state_dict(self.ref_policy, ref_state)

    # ---------------------------------------------------------------------------------------- export
    def export_hf_state_dict(self) -> dict[str, torch.Tensor]:
        """The full HF-keyed CPU state dict on rank 0 (``{}`` elsewhere); collective.

        Keys are those of the HF model (``model.layers.0...``, ``lm_head.weight``); no value head.
        """
        self.onload()
        state = full_model_state_dict(self.policy)
        result = _hf_keys(state, self.policy, self._lora_scaling) if self.rank == 0 else {}
        if self.cfg.enable_offload:
            self.offload()
        return result

    # ------------------------------------------------------------------------------------- checkpoints
    def save_checkpoint(self, path: str) -> None:
        """Write model, optimizer, counters, shuffle generator and RNG states under ``<path>/actor/``.

        Call on every rank (collective). Rank 0 writes the full (unsharded) state, loadable at any actor world
        size; every rank writes its RNG state. Each file is written atomically; make ``path`` a
        ``CheckpointManager`` staging directory for an atomic checkpoint as a whole.
        """
        self.onload()
        root = Path(path) / CHECKPOINT_SUBDIR
        model = full_model_state_dict(self.policy)
        optim = full_optimizer_state_dict(self.policy, self.optimizer)
        ref = full_model_state_dict(self.ref_policy) if self.ref_policy is not None else None
        if self.rank == 0:
            trainer = {
                "optimizer_steps": self.optimizer_steps,
                "train_steps": self.train_steps,
                "total_steps": self.total_steps,
                "sft_steps": self.sft_steps,
                "version": self.version,
                "generator": self.generator.get_state(),
                "world_size": self.world_size,
            }
            files: list[tuple[str, Any]] = [
                ("model.pt", model),
                ("optimizer.pt", optim),
                ("trainer.pt", trainer),
            ]
            if ref is not None:
                files.append(("ref_model.pt", ref))
            save_checkpoint_files(root, files)
        save_rank_rng(root, self.rank)
        if self.distributed:
            dist.barrier()
        if self.cfg.enable_offload:
            self.offload()

    def load_checkpoint(self, path: str) -> None:
        """Restore what :meth:`save_checkpoint` wrote (from ``<path>/actor/``); call it on every rank."""
        root = Path(path) / CHECKPOINT_SUBDIR
        if not (root / "trainer.pt").is_file():
            raise FileNotFoundError(f"load_checkpoint: {root} holds no actor checkpoint (no trainer.pt)")
        self.onload()
        model = torch.load(root / "model.pt", map_location="cpu", weights_only=True)
        optim = torch.load(root / "optimizer.pt", map_location="cpu", weights_only=True)
        trainer = torch.load(root / "trainer.pt", map_location="cpu", weights_only=True)
        load_full_model_state_dict(self.policy, model)
        load_full_optimizer_state_dict(self.policy, self.optimizer, optim)
        if self.ref_policy is not None and (root / "ref_model.pt").is_file():
            load_full_model_state_dict(
                self.ref_policy, torch.load(root / "ref_model.pt", map_location="cpu", weights_only=True)
            )
        self.optimizer_steps = int(trainer["optimizer_steps"])
        self.train_steps = int(trainer["train_steps"])
        self.total_steps = resumed_schedule_total(
            trainer.get("total_steps"),
            self.total_steps,
            reset=self.cfg.optim.reset_lr_schedule_on_resume,
            warn=self.log_warning if self.rank == 0 else (lambda _msg: None),
        )
        self.sft_steps = int(trainer["sft_steps"])
        self.version = int(trainer["version"])
        self.generator.set_state(trainer["generator"])
        if not load_rank_rng(root, self.rank):
            self.log_warning(
                "no RNG state for rank %d in %s (saved with a different world size)", self.rank, root
            )
        if self.cfg.enable_offload:
            self.offload()

    def save_hf(self, path: str) -> str:
        """Write the policy as a Hugging Face checkpoint directory (weights, config, tokenizer, generation config).

        Call on every rank (collective); rank 0 writes into a staging directory renamed into place, replacing
        an existing ``path``. A value head goes to ``value_head.pt`` next to the HF files. The directory loads
        with ``AutoModelForCausalLM.from_pretrained`` (and as ``model_path`` of any RLinf LLM config).

        Returns:
            ``path``.
        """
        self.onload()
        full = full_model_state_dict(self.policy)
        if self.rank == 0:

            def fill(staging: Path) -> None:
                self.policy.model.save_pretrained(
                    staging, state_dict=_hf_keys(full, self.policy, self._lora_scaling)
                )
                if self._lora_scaling is not None:
                    adapters = {
                        k.removeprefix("model."): v for k, v in full.items() if k.startswith("model.")
                    }
                    write_peft_adapter(
                        staging / ADAPTER_DIR, adapters, self.cfg.model, self.cfg.model.model_path
                    )
                load_tokenizer(self.cfg.model).save_pretrained(staging)
                head = {
                    k.removeprefix("value_head."): v for k, v in full.items() if k.startswith("value_head.")
                }
                if head:
                    torch.save(head, staging / "value_head.pt")

            replace_directory(Path(path), fill)
        if self.distributed:
            dist.barrier()
        if self.cfg.enable_offload:
            self.offload()
        return path
