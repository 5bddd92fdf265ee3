"""``VLAFlowPolicy``: what π0 and SmolVLA share as RL policies of the embodied PPO/GRPO path (πRL's recipe).

The model's action expert is the velocity field of a flow-matching chain; exploration and log-probabilities are
πRL's Flow-SDE or Flow-Noise (https://arxiv.org/abs/2510.25889), computed by :mod:`rlinf_models.flow` exactly as
for the small :class:`~rlinf_models.policies.FlowPolicy`:

- ``act`` encodes the prefix (cameras + instruction, and the state where the model puts it there) once, samples
  the chain ``[N, K+1, chunk_size, max_action_dim]`` in the model's normalised action space and returns the
  first ``num_action_chunks`` actions of its end, first ``action_dim`` dimensions, unnormalised; the chain
  travels as ``forward_inputs``;
- ``evaluate`` encodes the prefix once and recomputes the log-probability of the stored chain; both are taken
  over the executed part ``[:num_action_chunks, :action_dim]`` only (the padded dimensions and the actions
  beyond the chunk are not part of the env's action);
- ``value``: the model's value head on the mean of the VLM's prefix output (PPO), zeros without one (GRPO);
- Flow-Noise adds a learned noise head on the action expert's output, as πRL does.

The instruction of each env comes from the env: ``EnvSpec.task_descriptions`` lists them and the observation's
integer ``task_index`` entry picks one per env (single-task envs have one description and no such entry).

A model plugs in by subclassing :class:`VLAFlowPolicy` with its prefix encoding (``_encode``), its expert's
output (``_expert_output``) and its normalisation convention (``_normalize_actions`` /
``_unnormalize_actions``).
"""

from __future__ import annotations

import math
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

import attrs
import torch
from rlinf_core.protocols import EnvSpec
from torch import Tensor, nn

from ..flow import chain_log_prob
from ..policies import PolicyConfig, PolicyOutput
from ..policies._flow import require_chain, sample_policy_chain

if TYPE_CHECKING:
    from ..pi0._model import PrefixCache

__all__ = [
    "TASK_INDEX_KEY",
    "TOKENIZER_SUBDIR",
    "VLACondition",
    "VLAFlowPolicy",
    "VLAModel",
    "VLAModelConfig",
    "check_vla_env",
    "inject_lora",
]

TASK_INDEX_KEY = "task_index"
"""The observation entry that picks each env's instruction out of ``EnvSpec.task_descriptions``."""

TOKENIZER_SUBDIR = "tokenizer"
"""Where :meth:`VLAFlowPolicy.save_pretrained` copies ``actor.model.tokenizer_path`` in an export."""


class VLAModelConfig(Protocol):
    """The sizes of a VLA flow model's config the policy reads."""

    @property
    def chunk_size(self) -> int: ...
    @property
    def max_action_dim(self) -> int: ...
    @property
    def max_state_dim(self) -> int: ...


class VLAModel(Protocol):
    """A VLA flow model (:class:`~rlinf_models.pi0.Pi0Model`, :class:`~rlinf_models.smolvla.SmolVLAModel`)."""

    @property
    def config(self) -> VLAModelConfig: ...
    @property
    def action_in_proj(self) -> nn.Linear: ...
    def project_velocity(self, expert_output: Tensor) -> Tensor: ...
    def sample_time(self, batch: int) -> Tensor: ...
    def flow_matching_loss(
        self, prefix: PrefixCache, state: Tensor | None, actions: Tensor, noise: Tensor, t: Tensor
    ) -> Tensor: ...
    def value(self, prefix: PrefixCache) -> Tensor: ...


M = TypeVar("M", bound=VLAModel)


@attrs.frozen
class VLACondition:
    """What the velocity field conditions on: the prefix cache and (π0) the normalised, padded state."""

    prefix: PrefixCache
    state: Tensor | None = None


def check_vla_env(
    spec: EnvSpec, config: PolicyConfig, model_config: VLAModelConfig
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The camera entries and instructions of ``spec`` for the model, or a ValueError naming what does not fit."""
    mc = model_config
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


def inject_lora(backbone: nn.Module, config: PolicyConfig, *, towers: str, where: str) -> None:
    """Inject peft LoRA adapters into ``config.lora_target_modules`` of the ``towers`` of ``backbone``, in place.

    The rest of ``backbone`` is frozen: only the adapters (and the modules outside it) keep ``requires_grad``.

    Args:
        backbone: The VLM with its action expert.
        config: ``actor.model`` (``lora_rank``, ``lora_alpha``, ``lora_dropout``, ``lora_target_modules``).
        towers: A regex matching the module paths of the towers that get adapters, up to the tower's name.
        where: The towers in the error message.

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
        # A regex is matched against whole module paths: the towers' layers only.
        target_modules=rf"{towers}\..*\.({names})",
        bias="none",
    )
    try:
        peft.inject_adapter_in_model(lora, backbone, adapter_name="default")
    except ValueError as e:
        raise ValueError(
            f"actor.model.lora_target_modules {list(config.lora_target_modules)} match no layer of {where} ({e})"
        ) from None
    for name, param in backbone.named_parameters():
        param.requires_grad_(".lora_" in name)


class VLAFlowPolicy(nn.Module, Generic[M]):
    """A VLA flow model with the interface of ``FlowPolicy`` (see the module docstring).

    Subclasses load the model, then call ``__init__``, register the instructions' tokens
    (:meth:`_register_task_tokens`) and implement the hooks ``_encode``, ``_expert_output``,
    ``_normalize_actions`` and ``_unnormalize_actions``.

    Args:
        spec: the env: continuous actions with ``action_dim <= max_action_dim``, dict observations with the
            cameras ``config.image_keys`` and the vector ``config.state_key``, and ``task_descriptions``.
        config: ``actor.model``.
        model: the network.
        expert_width: the width of the action expert's output (the Flow-Noise head's input).

    Raises:
        ValueError: naming the ``actor.model`` field (or the env) that does not fit the checkpoint.
    """

    name: ClassVar[str]
    """The model's name in messages (``"π0"``)."""
    model: M
    task_tokens: Tensor
    """``[num_tasks, tokenizer_max_length]`` each instruction's token ids (a buffer, not in the state dict)."""
    task_token_mask: Tensor

    def __init__(self, spec: EnvSpec, config: PolicyConfig, model: M, *, expert_width: int) -> None:
        super().__init__()
        self.image_keys, self.task_descriptions = check_vla_env(spec, config, model.config)
        self.spec = spec
        self.config = config
        self.model = model
        self.chunks = config.num_action_chunks
        self.action_dim = spec.action_dim
        self.noise_head: nn.Linear | None = None
        if config.noise_method == "flow_noise":
            self.noise_head = nn.Linear(expert_width, model.config.max_action_dim)
            nn.init.zeros_(self.noise_head.weight)
            nn.init.zeros_(self.noise_head.bias)
        low, high = config.noise_logvar_range
        self.log_std_low, self.log_std_high = math.log(low), math.log(high)

    def _register_task_tokens(self, tokens: Tensor, mask: Tensor) -> None:
        """Keep the instructions' tokens ``[num_tasks, L]`` (buffers follow the device, and are not weights)."""
        self.register_buffer("task_tokens", tokens, persistent=False)
        self.register_buffer("task_token_mask", mask, persistent=False)

    # ------------------------------------------------------------------------------- the model's hooks
    def _encode(self, obs: Mapping[str, Tensor]) -> VLACondition:
        """Encode the prefix of a batch of observations once."""
        raise NotImplementedError

    def _expert_output(self, x_t: Tensor, t: Tensor, cond: VLACondition) -> Tensor:
        """The action expert's output over the noisy chunk ``x_t [N, chunk_size, max_action_dim]``."""
        raise NotImplementedError

    def _normalize_actions(self, actions: Tensor) -> Tensor:
        """Env units ``[..., D]`` → the model's normalised action space."""
        raise NotImplementedError

    def _unnormalize_actions(self, actions: Tensor) -> Tensor:
        """Inverse of :meth:`_normalize_actions`."""
        raise NotImplementedError

    def _save_network(self, directory: Path) -> None:
        """Write the network in the model's published layout into ``directory`` (adapters merged)."""
        raise NotImplementedError

    def _save_statistics(self, directory: Path) -> None:
        """Copy the normalisation statistics the policy was built from into ``directory`` (under the file's name)."""
        if self.config.norm_stats_path is not None:
            shutil.copy2(self.config.norm_stats_path, directory / Path(self.config.norm_stats_path).name)

    # ------------------------------------------------------------------------------- export
    def save_pretrained(self, directory: str | Path) -> Path:
        """Export the policy as a self-contained checkpoint directory of the model's published layout.

        ``directory`` gets ``config.json`` and the weights as the adapter's saver writes them (LoRA adapters
        merged; the value head in ``value_head.safetensors``), a copy of the tokenizer in ``tokenizer/`` and of
        the normalisation statistics the policy was built from; it is then a valid ``actor.model.model_path``
        (and the copies valid ``tokenizer_path`` / ``norm_stats_path``). The Flow-Noise head is the policy's,
        not the model's: it is not exported.

        Returns:
            ``directory``.
        """
        root = Path(directory)
        root.mkdir(parents=True, exist_ok=True)
        self._save_network(root)
        assert self.config.tokenizer_path is not None  # every VLA flow policy is built with one
        shutil.copytree(self.config.tokenizer_path, root / TOKENIZER_SUBDIR, dirs_exist_ok=True)
        self._save_statistics(root)
        return root

    def _camera_names(self) -> tuple[str, ...]:
        return tuple(self.image_keys)

    def _state_dim(self) -> int:
        assert self.spec.obs_dict is not None  # checked by check_vla_env
        return int(self.spec.obs_dict[self.config.state_key].shape[0])

    # ------------------------------------------------------------------------------- inputs
    @property
    def device(self) -> torch.device:
        return self.model.action_in_proj.weight.device

    def _task_ids(self, obs: Mapping[str, Tensor], n: int) -> Tensor:
        """``[n]`` each env's instruction (``task_index``; 0 for a single-task env)."""
        if TASK_INDEX_KEY in obs:
            return obs[TASK_INDEX_KEY].reshape(n, -1)[:, 0].long().to(self.device)
        return torch.zeros(n, dtype=torch.long, device=self.device)

    # ------------------------------------------------------------------------------- the velocity field
    def field(self, x_t: Tensor, t: Tensor, cond: VLACondition) -> tuple[Tensor, Tensor | None]:
        """The :data:`~rlinf_models.flow.VelocityField` (velocity and, for Flow-Noise, its std) in ``x_t``'s dtype."""
        hidden = self._expert_output(x_t, t, cond)
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
    def _values(self, cond: VLACondition, n: int) -> Tensor:
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
        n = cond.prefix.pad_mask.shape[0]
        shape = (n, mc.chunk_size, mc.max_action_dim)
        out = sample_policy_chain(
            self.field,
            cond,
            shape,
            self.config,
            deterministic=deterministic,
            generator=generator,
            device=self.device,
        )
        return PolicyOutput(
            self._unnormalize_actions(self._executed(out.actions)),
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
        forward_inputs = require_chain(forward_inputs, f"the {self.name} policy")
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
        """The model's flow-matching loss (scalar) of demonstrated chunks ``actions [B, C, D]`` (env units) where ``mask [B, C]``.

        The actions are normalised and padded to the model's chunk; the loss averages the executed part.
        """
        cond = self._encode(obs)
        mc = self.model.config
        b, c = actions.shape[:2]
        target = self._normalize_actions(actions.to(self.device, torch.float32))
        padded = torch.zeros(b, mc.chunk_size, mc.max_action_dim, device=self.device)
        padded[:, :c, : target.shape[-1]] = target
        noise = torch.randn_like(padded)
        err = self.model.flow_matching_loss(cond.prefix, cond.state, padded, noise, self.model.sample_time(b))
        per_step = err[:, :c, : self.action_dim].mean(dim=-1)
        m = mask.to(self.device, per_step.dtype)
        return (per_step * m).sum() / m.sum().clamp(min=1.0)
