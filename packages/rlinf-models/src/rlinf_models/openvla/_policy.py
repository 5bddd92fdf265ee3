"""``OpenVLAPolicy``: an OpenVLA checkpoint as a discrete-token policy of the embodied PPO/GRPO path (RLinf's recipe).

OpenVLA is not a flow policy: an action is ``action_dim`` tokens of the LM's vocabulary, one per dimension, so
the policy has the interface of ``FlowPolicy`` / ``ActorCritic`` over tokens instead of a denoising chain:

- ``act`` prompts the model with one camera image and the env's instruction (OpenVLA's prompt, preprocessed as
  ``PrismaticProcessor`` does), decodes ``action_dim`` tokens at ``actor.model.temperature`` (greedy when
  deterministic), maps them to bin centres and un-normalises them with the checkpoint's ``norm_stats`` of
  ``actor.model.unnorm_key``; the tokens travel as ``forward_inputs["action_tokens"]``;
- ``evaluate`` recomputes the stored tokens' log-probabilities teacher-forced (one pass over prompt + tokens);
- log-probabilities and entropies are per token, ``[N, 1, action_dim]`` (RLinf's ``token_level``): the loss's
  ``algorithm.logprob_type`` sums them per action (``action_level``, the log-probability of the action) or per
  chunk, as for every other policy;
- ``value``: the value head on the LM's hidden state at the last prompt token (zeros without one).

The instruction of each env comes from ``EnvSpec.task_descriptions``, picked by the observation's integer
``task_index`` entry (single-task envs have one description and no such entry); the prompts are tokenised once.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from rlinf_core.protocols import EnvSpec
from torch import Tensor, nn

from ..pi0._inputs import load_tokenizer
from ..policies import PolicyConfig, PolicyOutput
from ..vla._checkpoint import stored_value_head_sizes
from ..vla._policy import TASK_INDEX_KEY
from ._actions import normalize_actions, unnormalize_actions
from ._checkpoint import load_openvla, save_openvla
from ._config import action_stats
from ._inputs import format_prompt, pad_prompts, preprocess_images
from ._lora import apply_lora
from ._model import OpenVLAModel

__all__ = ["OPENVLA_FORWARD_INPUT_KEYS", "OPENVLA_VALUE_HEAD_SIZES", "OpenVLAPolicy", "check_openvla_env"]

OPENVLA_FORWARD_INPUT_KEYS = ("action_tokens",)
"""``PolicyOutput.forward_inputs`` of :meth:`OpenVLAPolicy.act`: ``action_tokens [N, action_dim]`` int64."""

OPENVLA_VALUE_HEAD_SIZES = (512, 128)
"""Hidden widths of a fresh value head (RLinf's OpenVLA ``ValueHead``); a stored head keeps its own widths."""


def check_openvla_env(
    spec: EnvSpec, config: PolicyConfig, action_dim: int
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The camera entries and the instructions of ``spec`` for OpenVLA, or a ValueError naming what does not fit.

    ``openvla`` sees one camera; ``openvla_oft`` one or more (``image_keys``, in the checkpoint's order).

    Args:
        spec: the env.
        config: ``actor.model``.
        action_dim: the dimensions of the checkpoint's action statistics.
    """
    where = f"actor.model.model_type {config.model_type!r}"
    if spec.action_type != "continuous":
        raise ValueError(f"{where} needs continuous actions; the env's are {spec.action_type!r}")
    if spec.action_dim != action_dim:
        raise ValueError(
            f"{where}: the env has {spec.action_dim} action dims, the checkpoint's statistics of unnorm_key "
            f"{config.unnorm_key!r} have {action_dim}"
        )
    if spec.obs_dict is None:
        raise ValueError(f"{where} needs dict observations with a camera (e.g. LIBERO obs_mode rgb)")
    cameras = [name for name, s in spec.obs_dict.items() if s.is_image]
    keys = config.image_keys if config.image_keys is not None else tuple(cameras[:1])
    several = config.model_type == "openvla_oft"
    if not keys or (len(keys) != 1 and not several) or any(k not in cameras for k in keys):
        what = "OpenVLA-OFT sees cameras among" if several else "OpenVLA sees one camera, one of"
        raise ValueError(f"actor.model.image_keys {list(keys)}: {what} the observation's {cameras}")
    if not spec.task_descriptions:
        raise ValueError(f"{where} needs the env's task_descriptions (the instructions it is prompted with)")
    if TASK_INDEX_KEY not in spec.obs_dict and len(spec.task_descriptions) != 1:
        raise ValueError(
            f"{where}: the env has {len(spec.task_descriptions)} task descriptions but no {TASK_INDEX_KEY!r} entry"
        )
    return tuple(keys), spec.task_descriptions


def _tokenize(tokenizer: Any, instructions: tuple[str, ...], pad_token_id: int) -> tuple[Tensor, Tensor]:
    """OpenVLA's prompts as ``[num_tasks, L]`` ids and mask (BOS, left padding, prompt).

    The prompt is tokenised with a trailing space, as RLinf's rollout does: Llama's tokenizer turns it into the
    empty token ``▁`` (29871) that OpenVLA's ``predict_action`` appends, so any tokenizer's own space ends it.
    """
    ids = [tokenizer(format_prompt(text) + " ")["input_ids"] for text in instructions]
    bos = tokenizer.bos_token_id
    if bos is None or any(row[0] != bos for row in ids):
        raise ValueError(
            "actor.model.tokenizer_path: the tokenizer must start every prompt with its BOS token"
        )
    return pad_prompts(ids, pad_token_id=pad_token_id, empty_token_id=None)


class OpenVLAPolicy(nn.Module):
    """OpenVLA (``actor.model.model_type: openvla``) with the interface of the embodied policies.

    Args:
        spec: the env: continuous actions of the checkpoint's action dims, dict observations with the camera
            ``config.image_keys`` (one), and ``task_descriptions``.
        config: ``actor.model``; ``model_path`` names the checkpoint directory (the published layout), and
            ``tokenizer_path`` (``null``: ``model_path``, where the published checkpoints keep it) its
            tokenizer.

    Raises:
        ValueError: naming the ``actor.model`` field (or the env) that does not fit the checkpoint.
    """

    name = "OpenVLA"
    model: OpenVLAModel
    task_tokens: Tensor
    """``[num_tasks, L]`` each instruction's prompt ids (a buffer, not in the state dict)."""
    task_token_mask: Tensor

    def __init__(self, spec: EnvSpec, config: PolicyConfig) -> None:
        super().__init__()
        if config.model_path is None:
            raise ValueError(f"actor.model: {config.model_type} needs model_path (the checkpoint directory)")
        if config.num_action_chunks != 1 and config.model_type == "openvla":
            raise ValueError(
                f"actor.model.num_action_chunks must be 1 for openvla (one action per step), got "
                f"{config.num_action_chunks}"
            )
        sizes = None
        if config.add_value_head:
            stored = stored_value_head_sizes(config.model_path)
            sizes = OPENVLA_VALUE_HEAD_SIZES if stored is None else stored
        model = self._load_model(config, sizes)
        if not config.add_value_head:
            model.value_head = None  # a stored head is not used (GRPO)
        try:
            self.action_stats = action_stats(model.config, config.unnorm_key)
        except ValueError as e:
            raise ValueError(f"actor.model.unnorm_key: {e}") from None
        self.cameras, self.task_descriptions = check_openvla_env(spec, config, len(self.action_stats["q01"]))
        if config.is_lora:
            try:
                apply_lora(
                    model,
                    rank=config.lora_rank,
                    alpha=config.lora_alpha,
                    dropout=config.lora_dropout,
                    target_modules=config.lora_target_modules,
                )
            except ValueError as e:
                raise ValueError(f"actor.model.lora_target_modules: {e}") from None
        self.spec = spec
        self.config = config
        self.model = model
        self.action_dim = spec.action_dim
        tokenizer = load_tokenizer(Path(config.tokenizer_path or config.model_path))
        self.tokenizer = tokenizer
        tokens, mask = _tokenize(tokenizer, self.task_descriptions, model.config.pad_token_id)
        self.register_buffer("task_tokens", tokens, persistent=False)
        self.register_buffer("task_token_mask", mask, persistent=False)

    def _load_model(self, config: PolicyConfig, value_head_sizes: tuple[int, ...] | None) -> OpenVLAModel:
        """The checkpoint ``config.model_path`` with a value head of ``value_head_sizes`` (``None``: none)."""
        assert config.model_path is not None
        return load_openvla(config.model_path, value_head_sizes=value_head_sizes)[0]

    def _save_network(self, directory: Path) -> None:
        """Write the network in the published layout into ``directory`` (adapters merged)."""
        save_openvla(self.model, directory)

    def save_pretrained(self, directory: str | Path) -> Path:
        """Export the policy as a self-contained checkpoint directory of the published layout.

        ``directory`` gets ``config.json`` (the ``norm_stats`` included), the sharded weights with LoRA adapters
        merged, the value head in ``value_head.safetensors`` when the policy has one, and the tokenizer beside
        them (as the published checkpoints keep it, so ``tokenizer_path: null`` reads it): a valid
        ``actor.model.model_path``.

        Returns:
            ``directory``.
        """
        root = Path(directory)
        root.mkdir(parents=True, exist_ok=True)
        self._save_network(root)
        self.tokenizer.save_pretrained(str(root))
        return root

    @property
    def device(self) -> torch.device:
        return self.model.projector.fc1.weight.device

    def _inputs(self, obs: Mapping[str, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        """``pixel_values``, ``input_ids`` and ``attention_mask`` of a batch of observations."""
        sizes = self.model.config.image_sizes
        pixels = torch.cat([preprocess_images(obs[k].to(self.device), sizes) for k in self.cameras], dim=1)
        n = pixels.shape[0]
        if TASK_INDEX_KEY in obs:
            ids = obs[TASK_INDEX_KEY].reshape(n, -1)[:, 0].long().to(self.device)
        else:
            ids = torch.zeros(n, dtype=torch.long, device=self.device)
        return pixels, self.task_tokens[ids], self.task_token_mask[ids]

    def _values(self, values: Tensor | None, n: int) -> Tensor:
        if values is None:
            return torch.zeros(n, 1, device=self.device)
        return values[:, None].float()

    def _env_units(self, normalized: Tensor) -> Tensor:
        """Normalised actions ``[N, C, D]`` → env actions ``[N, C, D]`` float32 (un-normalised, gripper mapped)."""
        actions = unnormalize_actions(normalized.float(), self.action_stats)
        if self.config.gripper_action == "binary_inverted":
            # OpenVLA's gripper is 1 open .. 0 closed; robosuite's -1 open, +1 closed.
            actions[..., -1] = -torch.sign(2 * actions[..., -1] - 1)
        return actions

    def _normalized_targets(self, actions: Tensor) -> Tensor:
        """Env actions ``[N, C, D]`` → OpenVLA's normalised space: the inverse of :meth:`_env_units`."""
        target = actions.to(self.device, torch.float32)
        if self.config.gripper_action == "binary_inverted":
            target = target.clone()
            target[..., -1] = (1.0 - target[..., -1]) / 2.0  # robosuite's -1 open .. +1 closed -> 1 .. 0
        return normalize_actions(target, self.action_stats)

    def _env_actions(self, tokens: Tensor) -> Tensor:
        """Action tokens ``[N, D]`` → env actions ``[N, 1, D]`` float32 (bin centres, un-normalised)."""
        return self._env_units(self.model.action_tokenizer.decode(tokens).float()[:, None])

    def value(self, obs: Mapping[str, Tensor]) -> Tensor:
        """State values ``[N, 1]`` (zeros without a value head)."""
        pixels, ids, mask = self._inputs(obs)
        return self._values(self.model.prompt_values(pixels, ids, mask), ids.shape[0])

    @torch.no_grad()
    def act(
        self,
        obs: Mapping[str, Tensor],
        *,
        deterministic: bool = False,
        generator: torch.Generator | None = None,
    ) -> PolicyOutput:
        """Actions ``[N, 1, D]`` (env units), token log-probs ``[N, 1, D]``, values ``[N, 1]`` and the tokens.

        ``deterministic``: the most likely token of each dimension (the log-probs stay the tempered ones).
        """
        pixels, ids, mask = self._inputs(obs)
        sample = self.model.sample_actions(
            pixels,
            ids,
            mask,
            action_dim=self.action_dim,
            temperature=self.config.temperature,
            greedy=deterministic,
            generator=generator,
        )
        return PolicyOutput(
            self._env_actions(sample.tokens),
            sample.log_probs[:, None].float(),
            self._values(sample.values, ids.shape[0]),
            forward_inputs={"action_tokens": sample.tokens},
        )

    def evaluate(
        self, obs: Mapping[str, Tensor], actions: Tensor, forward_inputs: Mapping[str, Tensor] | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Log-probs ``[N, 1, D]``, entropies ``[N, 1, D]`` and values ``[N, 1]`` of the rollout's tokens.

        Raises:
            ValueError: without ``forward_inputs["action_tokens"]`` (the rollout batch lost them).
        """
        if forward_inputs is None or "action_tokens" not in forward_inputs:
            have = None if forward_inputs is None else sorted(forward_inputs)
            raise ValueError(
                f"the OpenVLA policy needs forward_inputs['action_tokens'] (the rollout's tokens), got {have}"
            )
        pixels, ids, mask = self._inputs(obs)
        tokens = forward_inputs["action_tokens"].to(self.device, torch.long)
        out = self.model.evaluate_actions(pixels, ids, mask, tokens, temperature=self.config.temperature)
        return out.log_probs[:, None], out.entropy[:, None], self._values(out.values, ids.shape[0])

    def imitation_loss(self, obs: Mapping[str, Tensor], actions: Tensor, mask: Tensor) -> Tensor:
        """OpenVLA's supervised loss (scalar): cross-entropy of the demonstrated actions' tokens.

        ``actions [N, 1, D]`` in env units are mapped back to OpenVLA's space (the inverse of what :meth:`act`
        executes: the gripper back to 1 open / 0 closed with ``gripper_action: binary_inverted``, the other
        dimensions normalised with the checkpoint's statistics), tokenised into the 256 bins, and scored
        teacher-forced after the prompt at temperature 1; ``mask [N, 1]`` drops padded samples.
        """
        tokens = self.model.action_tokenizer.encode(self._normalized_targets(actions[:, :1])[:, 0])
        pixels, ids, prompt_mask = self._inputs(obs)
        out = self.model.evaluate_actions(pixels, ids, prompt_mask, tokens, temperature=1.0)
        weight = mask[:, :1].to(out.log_probs.dtype).to(self.device)
        return -(out.log_probs * weight).sum() / (weight.sum() * tokens.shape[1]).clamp_min(1.0)

    def forward(
        self, obs: Mapping[str, Tensor], actions: Tensor, forward_inputs: Mapping[str, Tensor] | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Same as :meth:`evaluate` (so FSDP wraps the training forward)."""
        return self.evaluate(obs, actions, forward_inputs)
