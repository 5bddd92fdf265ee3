"""``Pi0Policy``: a π0 / π0.5 checkpoint as an RL policy of the embodied PPO/GRPO path (πRL's recipe).

The model's action expert is the velocity field of a flow-matching chain; exploration and log-probabilities are
πRL's Flow-SDE or Flow-Noise (https://arxiv.org/abs/2510.25889), computed by :mod:`rlinf_models.flow` exactly as
for the small :class:`~rlinf_models.policies.FlowPolicy`:

- ``act`` encodes the prefix (cameras + instruction) once, samples the chain ``[N, K+1, chunk_size,
  max_action_dim]`` in the model's normalised action space and returns the first ``num_action_chunks`` actions
  of its end, first ``action_dim`` dimensions, unnormalised; the chain travels as ``forward_inputs``;
- ``evaluate`` encodes the prefix once and recomputes the log-probability of the stored chain; both are taken
  over the executed part ``[:num_action_chunks, :action_dim]`` only (the padded dimensions and the actions
  beyond the chunk are not part of the env's action);
- ``value``: the model's value head on the mean of the VLM's prefix output (PPO), zeros without one (GRPO);
- Flow-Noise adds a learned noise head on the action expert's output, as πRL does.

The instruction of each env comes from the env: ``EnvSpec.task_descriptions`` lists them and the observation's
integer ``task_index`` entry picks one per env (single-task envs have one description and no such entry).
π0 tokenises the descriptions once, at build time; π0.5 writes the discretised state into the prompt, so its
prompts are tokenised per call.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import attrs
import torch
from rlinf_core.protocols import EnvSpec
from torch import Tensor, nn

from ..flow import chain_log_prob
from ..policies import PolicyConfig, PolicyOutput
from ..policies._flow import FORWARD_INPUT_KEYS, require_chain, sample_policy_chain
from ._checkpoint import load_pi0
from ._inputs import (
    NormStats,
    load_lerobot_norm_stats,
    load_openpi_norm_stats,
    load_tokenizer,
    pad_last,
    preprocess_image,
    tokenize_prompts,
)
from ._model import Pi0Model, PrefixCache

__all__ = ["PI0_FORWARD_INPUT_KEYS", "Pi0Policy", "apply_lora", "load_norm_stats"]

PI0_FORWARD_INPUT_KEYS = FORWARD_INPUT_KEYS
"""``PolicyOutput.forward_inputs`` of :meth:`Pi0Policy.act`: ``chains [N, K+1, chunk_size, max_action_dim]`` (the
normalised, padded denoising chain, initial noise first) and ``denoise_mask [N, K]`` (its stochastic steps)."""

TASK_INDEX_KEY = "task_index"
"""The observation entry that picks each env's instruction out of ``EnvSpec.task_descriptions``."""

# Names of the two quantities in openpi's norm_stats.json and in LeRobot's normalizer file.
_STATE_NAMES = ("state", "observation.state")
_ACTION_NAMES = ("actions", "action")


def load_norm_stats(path: str | Path) -> tuple[NormStats, NormStats]:
    """``(state, actions)`` statistics from openpi's ``norm_stats.json`` or LeRobot's ``.safetensors`` file."""
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"actor.model.norm_stats_path: no file at {file}")
    stats = load_lerobot_norm_stats(file) if file.suffix == ".safetensors" else load_openpi_norm_stats(file)

    def pick(names: tuple[str, ...]) -> NormStats:
        for name in names:
            if name in stats:
                return stats[name]
        raise ValueError(
            f"actor.model.norm_stats_path: {file} has none of {list(names)}; it has {sorted(stats)}"
        )

    return pick(_STATE_NAMES), pick(_ACTION_NAMES)


@attrs.frozen
class _Cond:
    """What the velocity field conditions on: the prefix cache and (π0) the normalised, padded state."""

    prefix: PrefixCache
    state: Tensor | None


def apply_lora(model: Pi0Model, config: PolicyConfig) -> None:
    """Inject peft LoRA adapters into the Gemma towers' ``config.lora_target_modules``, in place.

    The rest of the backbone (``paligemma_with_expert``) is frozen: only the adapters and the modules outside
    the backbone (projections, time MLPs, heads) keep ``requires_grad``.

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
        # A regex is matched against whole module paths: the language model's and the expert's layers only.
        target_modules=rf".*\.(language_model|gemma_expert)\..*\.({names})",
        bias="none",
    )
    try:
        peft.inject_adapter_in_model(lora, model.paligemma_with_expert, adapter_name="default")
    except ValueError as e:
        raise ValueError(
            f"actor.model.lora_target_modules {list(config.lora_target_modules)} match no layer of the Gemma "
            f"towers ({e})"
        ) from None
    for name, param in model.paligemma_with_expert.named_parameters():
        param.requires_grad_(".lora_" in name)


class Pi0Policy(nn.Module):
    """π0 / π0.5 (``actor.model.model_type: pi0`` / ``pi05``) with the interface of ``FlowPolicy``.

    Args:
        spec: the env: continuous actions with ``action_dim <= max_action_dim``, dict observations with the
            cameras ``config.image_keys`` and the vector ``config.state_key``, and ``task_descriptions``.
        config: ``actor.model``; ``model_path``, ``tokenizer_path`` and ``norm_stats_path`` name local files.

    Raises:
        ValueError: naming the ``actor.model`` field (or the env) that does not fit the checkpoint.
    """

    def __init__(self, spec: EnvSpec, config: PolicyConfig) -> None:
        super().__init__()
        if config.model_path is None or config.tokenizer_path is None or config.norm_stats_path is None:
            raise ValueError("actor.model: pi0 / pi05 need model_path, tokenizer_path and norm_stats_path")
        model, _ = load_pi0(config.model_path)
        if config.is_lora:
            apply_lora(model, config)
        mc = model.config
        if mc.pi05 != (config.model_type == "pi05"):
            kind = "pi05" if mc.pi05 else "pi0"
            raise ValueError(
                f"actor.model.model_type is {config.model_type!r} but {config.model_path} holds a {kind!r} model"
            )
        self.image_keys, self.task_descriptions = _check_env(spec, config, model)
        self.spec = spec
        self.config = config
        self.model = model
        self.chunks = config.num_action_chunks
        self.action_dim = spec.action_dim
        self.state_stats, self.action_stats = load_norm_stats(config.norm_stats_path)
        self.norm_mode: Literal["mean_std", "quantile"] = "quantile" if mc.pi05 else "mean_std"
        self.tokenizer = load_tokenizer(config.tokenizer_path)
        # π0's prompts do not depend on the observation: tokenised once (buffers follow the device, and are not
        # part of the state dict).
        tokens, mask = tokenize_prompts(self.tokenizer, self.task_descriptions, mc.tokenizer_max_length)
        self.task_tokens: Tensor
        self.task_token_mask: Tensor
        self.register_buffer("task_tokens", tokens, persistent=False)
        self.register_buffer("task_token_mask", mask, persistent=False)
        self.noise_head: nn.Linear | None = None
        if config.noise_method == "flow_noise":
            self.noise_head = nn.Linear(mc.action_expert.width, mc.max_action_dim)
            nn.init.zeros_(self.noise_head.weight)
            nn.init.zeros_(self.noise_head.bias)
        low, high = config.noise_logvar_range
        self.log_std_low, self.log_std_high = math.log(low), math.log(high)

    # ------------------------------------------------------------------------------- inputs
    @property
    def device(self) -> torch.device:
        return self.model.action_in_proj.weight.device

    def _state(self, obs: Mapping[str, Tensor]) -> Tensor:
        """The observation's state, normalised (not padded): ``[N, state_dim]`` float32."""
        state = obs[self.config.state_key].to(self.device, torch.float32)
        return self.state_stats.normalize(state, self.norm_mode)

    def _task_ids(self, obs: Mapping[str, Tensor], n: int) -> Tensor:
        if TASK_INDEX_KEY in obs:
            return obs[TASK_INDEX_KEY].reshape(n, -1)[:, 0].long().to(self.device)
        return torch.zeros(n, dtype=torch.long, device=self.device)

    def _encode(self, obs: Mapping[str, Tensor]) -> _Cond:
        """Encode the prefix of a batch of observations once (images, instruction; π0.5: state in the prompt)."""
        mc = self.model.config
        images = [preprocess_image(obs[key].to(self.device), mc.image_size) for key in self.image_keys]
        n = images[0].shape[0]
        present = [torch.ones(n, dtype=torch.bool, device=self.device) for _ in images]
        state = self._state(obs)
        ids = self._task_ids(obs, n)
        if mc.pi05:
            prompts = [self.task_descriptions[int(i)] for i in ids.tolist()]
            tokens, mask = tokenize_prompts(self.tokenizer, prompts, mc.tokenizer_max_length, state=state)
            tokens, mask = tokens.to(self.device), mask.to(self.device)
            padded_state = None
        else:
            tokens, mask = self.task_tokens[ids], self.task_token_mask[ids]
            padded_state = pad_last(state, mc.max_state_dim)
        return _Cond(self.model.encode_prefix(images, present, tokens, mask), padded_state)

    # ------------------------------------------------------------------------------- the velocity field
    def field(self, x_t: Tensor, t: Tensor, cond: _Cond) -> tuple[Tensor, Tensor | None]:
        """The :data:`~rlinf_models.flow.VelocityField` (velocity and, for Flow-Noise, its std) in ``x_t``'s dtype."""
        hidden = self.model.expert_output(x_t, t, cond.prefix, cond.state)
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

    # ------------------------------------------------------------------------------------ the policy
    def _values(self, cond: _Cond, n: int) -> Tensor:
        if not self.config.add_value_head:
            return torch.zeros(n, 1, device=self.device)
        return self.model.value(cond.prefix)[:, None].float()

    def value(self, obs: Mapping[str, Tensor]) -> Tensor:
        """State values ``[N, 1]`` (zeros without a value head)."""
        cond = self._encode(obs)
        return self._values(cond, cond.prefix.pad_mask.shape[0])

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
        cond = self._encode(obs)
        mc = self.model.config
        cfg = self.config
        n = cond.prefix.pad_mask.shape[0]
        shape = (n, mc.chunk_size, mc.max_action_dim)
        out = sample_policy_chain(
            self.field, cond, shape, cfg, deterministic=deterministic, generator=generator, device=self.device
        )
        actions = self.action_stats.unnormalize(self._executed(out.actions), self.norm_mode)
        return PolicyOutput(
            actions,
            self._executed(out.logprobs),
            self._values(cond, n),
            forward_inputs={"chains": out.chain, "denoise_mask": out.denoise_mask},
        )

    def evaluate(
        self, obs: Mapping[str, Tensor], actions: Tensor, forward_inputs: Mapping[str, Tensor] | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Log-probs ``[N, C, D]``, entropy ``[N, C, D]`` and values ``[N, 1]`` of the rollout's chains.

        Raises:
            ValueError: without ``forward_inputs`` (the rollout batch lost the chain).
        """
        forward_inputs = require_chain(forward_inputs, "the π0 policy")
        cond = self._encode(obs)
        logprobs, entropy = chain_log_prob(
            self.field,
            cond,
            forward_inputs["chains"].to(self.device, torch.float32),
            forward_inputs["denoise_mask"].to(self.device),
            noise_method=self.config.noise_method,
            noise_level=self.config.noise_level,
        )
        return self._executed(logprobs), self._executed(entropy), self._values(cond, logprobs.shape[0])

    def forward(
        self, obs: Mapping[str, Tensor], actions: Tensor, forward_inputs: Mapping[str, Tensor] | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Same as :meth:`evaluate` (so FSDP wraps the training forward)."""
        return self.evaluate(obs, actions, forward_inputs)

    def imitation_loss(self, obs: Mapping[str, Tensor], actions: Tensor, mask: Tensor) -> Tensor:
        """π0's flow-matching loss (scalar) of demonstrated chunks ``actions [B, C, D]`` (env units) where ``mask [B, C]``.

        The actions are normalised and padded to the model's chunk; the loss averages the executed part.
        """
        cond = self._encode(obs)
        mc = self.model.config
        b, c = actions.shape[:2]
        target = self.action_stats.normalize(actions.to(self.device, torch.float32), self.norm_mode)
        padded = torch.zeros(b, mc.chunk_size, mc.max_action_dim, device=self.device)
        padded[:, :c, : target.shape[-1]] = target
        noise = torch.randn_like(padded)
        err = self.model.flow_matching_loss(cond.prefix, cond.state, padded, noise, self.model.sample_time(b))
        per_step = err[:, :c, : self.action_dim].mean(dim=-1)
        m = mask.to(self.device, per_step.dtype)
        return (per_step * m).sum() / m.sum().clamp(min=1.0)


def _check_env(
    spec: EnvSpec, config: PolicyConfig, model: Pi0Model
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The camera entries and instructions of ``spec`` for the model, or a ValueError naming what does not fit."""
    mc = model.config
    where = f"actor.model.model_type {config.model_type!r}"
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
