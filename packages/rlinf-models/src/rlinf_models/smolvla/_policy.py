"""``SmolVLAPolicy``: a SmolVLA checkpoint as an RL policy of the embodied PPO/GRPO path (πRL's recipe).

It is :class:`~rlinf_models.pi0.Pi0Policy` with SmolVLA as the velocity field: ``act`` encodes the prefix
(cameras, instruction, state) once and samples a Flow-SDE / Flow-Noise chain over the model's whole
``[chunk_size, max_action_dim]`` normalised block, returning the first ``num_action_chunks`` actions, first
``action_dim`` dimensions, unnormalised; ``evaluate`` recomputes the chain's log-probability with
:func:`rlinf_models.flow.chain_log_prob` over that executed part. Inputs are prepared as LeRobot's SmolVLA
processor does (left/top image padding, mean/std statistics, newline-terminated prompts).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import torch
from rlinf_core.protocols import EnvSpec
from torch import Tensor, nn

from ..flow import chain_log_prob
from ..pi0._inputs import load_tokenizer, pad_last
from ..pi0._model import PrefixCache
from ..pi0._policy import TASK_INDEX_KEY, load_norm_stats
from ..policies import PolicyConfig, PolicyOutput
from ..policies._flow import require_chain, sample_policy_chain
from ._checkpoint import load_smolvla
from ._inputs import normalize, preprocess_image, tokenize_prompts, unnormalize
from ._model import SmolVLAModel

__all__ = ["SmolVLAPolicy", "apply_lora"]


def apply_lora(model: SmolVLAModel, config: PolicyConfig) -> None:
    """Inject peft LoRA adapters into the ``config.lora_target_modules`` of the text model and the expert.

    The rest of the backbone (``vlm_with_expert``: the towers' base weights, the vision tower, the connector,
    the embeddings) is frozen; the state/action projections, the time MLP and the heads keep training.

    Raises:
        ImportError: without peft (naming the extra).
        ValueError: naming ``actor.model.lora_target_modules`` when none of them is in the towers.
    """
    try:
        import peft
    except ImportError as e:  # pragma: no cover - exercised only without the extra
        raise ImportError(f'actor.model.is_lora needs peft ({e}): pip install "rlinf-models[openpi]"') from e
    names = "|".join(re.escape(name) for name in config.lora_target_modules)
    alpha: Any = config.lora_alpha if config.lora_alpha is not None else config.lora_rank  # peft types it int
    lora = peft.LoraConfig(
        r=config.lora_rank,
        lora_alpha=alpha,
        lora_dropout=config.lora_dropout,
        # A regex is matched against whole module paths: the text model's and the expert's layers only.
        target_modules=rf"(.*\.)?(text_model|lm_expert)\..*\.({names})",
        bias="none",
    )
    try:
        peft.inject_adapter_in_model(lora, model.vlm_with_expert, adapter_name="default")
    except ValueError as e:
        raise ValueError(
            f"actor.model.lora_target_modules {list(config.lora_target_modules)} match no layer of SmolVLA's "
            f"text model or action expert ({e})"
        ) from None
    for name, param in model.vlm_with_expert.named_parameters():
        param.requires_grad_(".lora_" in name)


class SmolVLAPolicy(nn.Module):
    """SmolVLA (``actor.model.model_type: smolvla``) with the interface of ``FlowPolicy``.

    Args:
        spec: the env: continuous actions with ``action_dim <= max_action_dim``, dict observations with the
            cameras ``config.image_keys`` and the vector ``config.state_key``, and ``task_descriptions``.
        config: ``actor.model``; ``model_path``, ``tokenizer_path`` (the VLM's tokenizer) and
            ``norm_stats_path`` (LeRobot's normalizer file) name local files.

    Raises:
        ValueError: naming the ``actor.model`` field (or the env) that does not fit the checkpoint.
    """

    def __init__(self, spec: EnvSpec, config: PolicyConfig) -> None:
        super().__init__()
        if config.model_path is None or config.tokenizer_path is None or config.norm_stats_path is None:
            raise ValueError("actor.model: smolvla needs model_path, tokenizer_path and norm_stats_path")
        model, _ = load_smolvla(config.model_path)
        if config.is_lora:
            apply_lora(model, config)
        self.image_keys, self.task_descriptions = _check_env(spec, config, model)
        self.spec = spec
        self.config = config
        self.model = model
        self.chunks = config.num_action_chunks
        self.action_dim = spec.action_dim
        self.state_stats, self.action_stats = load_norm_stats(config.norm_stats_path)
        mc = model.config
        tokens, mask = tokenize_prompts(
            load_tokenizer(config.tokenizer_path), self.task_descriptions, mc.tokenizer_max_length
        )
        # The prompts do not depend on the observation: tokenised once (buffers follow the device, and are not
        # part of the state dict).
        self.task_tokens: Tensor
        self.task_token_mask: Tensor
        self.register_buffer("task_tokens", tokens, persistent=False)
        self.register_buffer("task_token_mask", mask, persistent=False)
        self.noise_head: nn.Linear | None = None
        if config.noise_method == "flow_noise":
            self.noise_head = nn.Linear(mc.expert_width, mc.max_action_dim)
            nn.init.zeros_(self.noise_head.weight)
            nn.init.zeros_(self.noise_head.bias)
        low, high = config.noise_logvar_range
        self.log_std_low, self.log_std_high = math.log(low), math.log(high)

    @property
    def device(self) -> torch.device:
        return self.model.action_in_proj.weight.device

    def _encode(self, obs: Mapping[str, Tensor]) -> PrefixCache:
        """Encode the prefix of a batch of observations once (cameras, instruction, normalised state)."""
        mc = self.model.config
        images = [preprocess_image(obs[key].to(self.device), mc.image_size) for key in self.image_keys]
        n = images[0].shape[0]
        present = [torch.ones(n, dtype=torch.bool, device=self.device) for _ in images]
        state = obs[self.config.state_key].to(self.device, torch.float32)
        state = pad_last(normalize(state, self.state_stats), mc.max_state_dim)
        if TASK_INDEX_KEY in obs:
            ids = obs[TASK_INDEX_KEY].reshape(n, -1)[:, 0].long().to(self.device)
        else:
            ids = torch.zeros(n, dtype=torch.long, device=self.device)
        tokens, mask = self.task_tokens[ids], self.task_token_mask[ids]
        return self.model.encode_prefix(images, present, tokens, mask, state)

    def field(self, x_t: Tensor, t: Tensor, prefix: PrefixCache) -> tuple[Tensor, Tensor | None]:
        """The :data:`~rlinf_models.flow.VelocityField` (velocity and, for Flow-Noise, its std) in ``x_t``'s dtype."""
        hidden = self.model.expert_output(x_t, t, prefix)
        velocity = self.model.project_velocity(hidden).to(x_t.dtype)
        if self.noise_head is None:
            return velocity, None
        # tanh squashes the head's output into [log min_std, log max_std] (FlowPolicy's parametrisation).
        raw = torch.tanh(self.noise_head(hidden.to(self.noise_head.weight.dtype))).to(x_t.dtype)
        low, high = self.log_std_low, self.log_std_high
        return velocity, torch.exp(low + (high - low) * (raw + 1) / 2)

    def _executed(self, x: Tensor) -> Tensor:
        """``[N, chunk_size, max_action_dim]`` → the executed part ``[N, num_action_chunks, action_dim]``."""
        return x[:, : self.chunks, : self.action_dim]

    def _values(self, prefix: PrefixCache, n: int) -> Tensor:
        if not self.config.add_value_head:
            return torch.zeros(n, 1, device=self.device)
        return self.model.value(prefix)[:, None].float()

    def value(self, obs: Mapping[str, Tensor]) -> Tensor:
        """State values ``[N, 1]`` (zeros without a value head)."""
        prefix = self._encode(obs)
        return self._values(prefix, prefix.pad_mask.shape[0])

    @torch.no_grad()
    def act(
        self,
        obs: Mapping[str, Tensor],
        *,
        deterministic: bool = False,
        generator: torch.Generator | None = None,
    ) -> PolicyOutput:
        """Sample action chunks ``[N, C, D]`` (env units), their log-probs ``[N, C, D]``, values and the chain.

        ``deterministic``: the ODE from zero noise; log-probs 0.
        """
        prefix = self._encode(obs)
        mc = self.model.config
        n = prefix.pad_mask.shape[0]
        shape = (n, mc.chunk_size, mc.max_action_dim)
        out = sample_policy_chain(
            self.field,
            prefix,
            shape,
            self.config,
            deterministic=deterministic,
            generator=generator,
            device=self.device,
        )
        return PolicyOutput(
            unnormalize(self._executed(out.actions), self.action_stats),
            self._executed(out.logprobs),
            self._values(prefix, n),
            forward_inputs={"chains": out.chain, "denoise_mask": out.denoise_mask},
        )

    def evaluate(
        self, obs: Mapping[str, Tensor], actions: Tensor, forward_inputs: Mapping[str, Tensor] | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Log-probs ``[N, C, D]``, entropy ``[N, C, D]`` and values ``[N, 1]`` of the rollout's chains.

        Raises:
            ValueError: without ``forward_inputs`` (the rollout batch lost the chain).
        """
        forward_inputs = require_chain(forward_inputs, "the SmolVLA policy")
        prefix = self._encode(obs)
        logprobs, entropy = chain_log_prob(
            self.field,
            prefix,
            forward_inputs["chains"].to(self.device, torch.float32),
            forward_inputs["denoise_mask"].to(self.device),
            noise_method=self.config.noise_method,
            noise_level=self.config.noise_level,
        )
        return self._executed(logprobs), self._executed(entropy), self._values(prefix, logprobs.shape[0])

    def forward(
        self, obs: Mapping[str, Tensor], actions: Tensor, forward_inputs: Mapping[str, Tensor] | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Same as :meth:`evaluate` (so FSDP wraps the training forward)."""
        return self.evaluate(obs, actions, forward_inputs)

    def imitation_loss(self, obs: Mapping[str, Tensor], actions: Tensor, mask: Tensor) -> Tensor:
        """SmolVLA's flow-matching loss (scalar) of demonstrated chunks ``actions [B, C, D]`` (env units) where ``mask [B, C]``."""
        prefix = self._encode(obs)
        mc = self.model.config
        b, c = actions.shape[:2]
        target = normalize(actions.to(self.device, torch.float32), self.action_stats)
        padded = torch.zeros(b, mc.chunk_size, mc.max_action_dim, device=self.device)
        padded[:, :c, : target.shape[-1]] = target
        noise = torch.randn_like(padded)
        err = self.model.flow_matching_loss(prefix, None, padded, noise, self.model.sample_time(b))
        per_step = err[:, :c, : self.action_dim].mean(dim=-1)
        m = mask.to(self.device, per_step.dtype)
        return (per_step * m).sum() / m.sum().clamp(min=1.0)


def _check_env(
    spec: EnvSpec, config: PolicyConfig, model: SmolVLAModel
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The camera entries and instructions of ``spec`` for the model, or a ValueError naming what does not fit."""
    mc = model.config
    where = "actor.model.model_type 'smolvla'"
    if spec.action_type != "continuous":
        raise ValueError(f"{where} needs continuous actions; the env's are {spec.action_type!r}")
    if spec.action_dim > mc.max_action_dim:
        raise ValueError(
            f"{where}: the env's {spec.action_dim} action dims exceed max_action_dim {mc.max_action_dim}"
        )
    if config.num_action_chunks > mc.chunk_size:
        raise ValueError(
            f"actor.model.num_action_chunks ({config.num_action_chunks}) exceeds the model's chunk_size "
            f"({mc.chunk_size})"
        )
    if spec.obs_dict is None:
        raise ValueError(f"{where} needs dict observations with cameras (e.g. LIBERO obs_mode rgb)")
    cameras = [name for name, s in spec.obs_dict.items() if s.is_image]
    keys = config.image_keys if config.image_keys is not None else tuple(cameras)
    wrong = [k for k in keys if k not in cameras]
    if wrong or not keys:
        raise ValueError(
            f"actor.model.image_keys {list(keys)}: must be camera entries of the observation: {cameras}"
        )
    state = spec.obs_dict.get(config.state_key)
    if state is None or len(state.shape) != 1:
        vectors = [name for name, s in spec.obs_dict.items() if len(s.shape) == 1]
        raise ValueError(
            f"actor.model.state_key {config.state_key!r}: must be a vector entry of the observation: {vectors}"
        )
    if state.shape[0] > mc.max_state_dim:
        raise ValueError(
            f"{where}: the state's {state.shape[0]} dims exceed max_state_dim {mc.max_state_dim}"
        )
    if not spec.task_descriptions:
        raise ValueError(f"{where} needs the env's task_descriptions (the instructions it is prompted with)")
    if TASK_INDEX_KEY not in spec.obs_dict and len(spec.task_descriptions) != 1:
        raise ValueError(
            f"{where}: the env has {len(spec.task_descriptions)} task descriptions but no {TASK_INDEX_KEY!r} entry"
        )
    return tuple(keys), spec.task_descriptions
