"""``OpenVLAOFTPolicy``: OpenVLA-OFT as an embodied PPO/GRPO policy (``actor.model.model_type: openvla_oft``).

RLinf's quickstart model. Everything of :class:`~rlinf_models.openvla.OpenVLAPolicy` (prompt, tokenizer,
``norm_stats`` of ``unnorm_key``, ``gripper_action``, value head, LoRA) holds; what changes:

- ``act`` decodes a chunk of ``num_action_chunks`` actions of ``action_dim`` tokens in ONE forward pass
  (:meth:`~rlinf_models.openvla.OpenVLAOFTModel.sample_chunk`), each token drawn at ``actor.model.temperature``;
  actions ``[N, C, D]``, per-token log-probabilities and entropies ``[N, C, D]`` (RLinf's ``token_level``;
  ``algorithm.logprob_type`` ``action_level`` / ``chunk_level`` sum them per action / per chunk), values
  ``[N, 1]`` (the value head on the last prompt token's hidden state), the tokens as
  ``forward_inputs["action_tokens"] [N, C, D]``;
- ``evaluate`` recomputes the stored tokens' log-probabilities in the same single pass;
- deterministic actions (evaluation): with the checkpoint's L1 regression head, its continuous actions (OFT's
  own policy); without one, each position's most likely token;
- ``imitation_loss`` (SFT): the L1 loss of the head's normalised actions when there is a head (OFT's
  training loss), else the tokens' cross-entropy;
- cameras: ``image_keys`` (one or more, each giving its patches, in the checkpoint's order); with the
  checkpoint's proprio projector, the ``state_key`` vector, normalised with the ``proprio`` quantiles of the
  same ``norm_stats`` entry, becomes one token after the patches.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from rlinf_core.protocols import EnvSpec
from torch import Tensor

from ..policies import PolicyConfig, PolicyOutput
from ._actions import normalize_actions
from ._config import OpenVLAConfig, action_stats
from ._model import OpenVLAModel
from ._oft import OpenVLAOFTModel, load_openvla_oft, save_openvla_oft
from ._policy import OpenVLAPolicy

__all__ = ["OPENVLA_OFT_FORWARD_INPUT_KEYS", "OpenVLAOFTPolicy"]

OPENVLA_OFT_FORWARD_INPUT_KEYS = ("action_tokens",)
"""``PolicyOutput.forward_inputs`` of :meth:`OpenVLAOFTPolicy.act`: ``action_tokens [N, C, D]`` int64."""


class OpenVLAOFTPolicy(OpenVLAPolicy):
    """OpenVLA-OFT (``actor.model.model_type: openvla_oft``) with the interface of the embodied policies.

    Args:
        spec: the env: continuous actions of the checkpoint's action dims, dict observations with the cameras
            ``config.image_keys``, the ``config.state_key`` vector when the checkpoint has a proprio projector,
            and ``task_descriptions``.
        config: ``actor.model``; ``model_path`` names the checkpoint directory (OpenVLA's layout plus OFT's
            ``action_head--*`` / ``proprio_projector--*`` files, both optional), ``num_action_chunks`` the
            actions per forward pass (OFT's LIBERO models: 8).

    Raises:
        ValueError: naming the ``actor.model`` field (or the env) that does not fit the checkpoint.
    """

    name = "OpenVLA-OFT"
    model: OpenVLAOFTModel

    def __init__(self, spec: EnvSpec, config: PolicyConfig) -> None:
        super().__init__(spec, config)
        self.proprio_stats: Mapping[str, Any] | None = None
        if self.model.proprio_projector is not None:
            self.proprio_stats = self._check_proprio(spec, config)
        if config.is_lora:
            # OFT trains its heads fully next to the LLM's adapters (the L1 head only learns in SFT).
            for module in (self.model.proprio_projector, self.model.action_head):
                if module is not None:
                    module.requires_grad_(True)

    def _load_model(self, config: PolicyConfig, value_head_sizes: tuple[int, ...] | None) -> OpenVLAModel:
        assert config.model_path is not None
        try:
            stats = action_stats(
                OpenVLAConfig.from_json(Path(config.model_path) / "config.json"), config.unnorm_key
            )
        except ValueError as e:
            raise ValueError(f"actor.model.unnorm_key: {e}") from None
        model, _ = load_openvla_oft(
            config.model_path,
            action_dim=len(stats["q01"]),
            num_action_chunks=config.num_action_chunks,
            value_head_sizes=value_head_sizes,
            num_images=len(config.image_keys) if config.image_keys is not None else 1,
        )
        return model

    def _save_network(self, directory: Path) -> None:
        """OpenVLA's layout (adapters merged) plus OFT's ``action_head--*`` / ``proprio_projector--*`` files."""
        save_openvla_oft(self.model, directory)

    def _check_proprio(self, spec: EnvSpec, config: PolicyConfig) -> Mapping[str, Any]:
        """The ``proprio`` statistics, after checking the env's ``state_key`` vector fits the projector."""
        assert self.model.proprio_projector is not None and spec.obs_dict is not None
        size = self.model.proprio_projector.fc1.in_features
        entry = spec.obs_dict.get(config.state_key)
        if entry is None or entry.is_image or tuple(entry.shape) != (size,):
            have = None if entry is None else tuple(entry.shape)
            raise ValueError(
                f"actor.model.state_key {config.state_key!r}: the checkpoint's proprio projector needs a [{size}] "
                f"state vector; the observation's entry has shape {have} (entries: {sorted(spec.obs_dict)})"
            )
        names = sorted(self.model.config.norm_stats)
        key = config.unnorm_key if config.unnorm_key is not None else names[0]
        stats: Mapping[str, Any] | None = self.model.config.norm_stats[key].get("proprio")
        if stats is None or len(stats["q01"]) != size:
            raise ValueError(
                f"actor.model.unnorm_key {key!r}: the checkpoint has a proprio projector but its norm_stats entry "
                f"has no 'proprio' statistics of {size} dims"
            )
        return stats

    def _proprio(self, obs: Mapping[str, Tensor]) -> Tensor | None:
        if self.proprio_stats is None:
            return None
        state = obs[self.config.state_key].to(self.device, torch.float32)
        return normalize_actions(state.reshape(state.shape[0], -1), self.proprio_stats)

    def _chunk(self, flat: Tensor) -> Tensor:
        """``[N, C·D]`` → ``[N, C, D]``."""
        return flat.reshape(flat.shape[0], self.model.num_action_chunks, self.model.action_dim)

    def value(self, obs: Mapping[str, Tensor]) -> Tensor:
        """State values ``[N, 1]`` (zeros without a value head): the head on the pass's last prompt token."""
        pixels, ids, mask = self._inputs(obs)
        if self.model.value_head is None:
            return self._values(None, ids.shape[0])
        hidden = self.model.action_hidden(pixels, ids, mask, self._proprio(obs))
        return self._values(self.model.value_of(hidden), ids.shape[0])

    @torch.no_grad()
    def act(
        self,
        obs: Mapping[str, Tensor],
        *,
        deterministic: bool = False,
        generator: torch.Generator | None = None,
    ) -> PolicyOutput:
        """Actions ``[N, C, D]`` (env units), token log-probs ``[N, C, D]``, values ``[N, 1]`` and the tokens.

        ``deterministic``: the L1 head's actions when the checkpoint has one, else each position's most likely
        token (the log-probs are those of the most likely tokens, tempered).
        """
        pixels, ids, mask = self._inputs(obs)
        hidden = self.model.action_hidden(pixels, ids, mask, self._proprio(obs))
        sample = self.model.decode_hidden(
            hidden, temperature=self.config.temperature, greedy=deterministic, generator=generator
        )
        tokens = self._chunk(sample.tokens)
        if deterministic and self.model.action_head is not None:
            actions = self._env_units(self.model.regress_hidden(hidden))
        else:
            actions = self._env_units(self.model.action_tokenizer.decode(tokens).float())
        return PolicyOutput(
            actions,
            self._chunk(sample.log_probs).float(),
            self._values(sample.values, ids.shape[0]),
            forward_inputs={"action_tokens": tokens},
        )

    def evaluate(
        self, obs: Mapping[str, Tensor], actions: Tensor, forward_inputs: Mapping[str, Tensor] | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Log-probs ``[N, C, D]``, entropies ``[N, C, D]`` and values ``[N, 1]`` of the rollout's tokens.

        Raises:
            ValueError: without ``forward_inputs["action_tokens"]`` (the rollout batch lost them).
        """
        if forward_inputs is None or "action_tokens" not in forward_inputs:
            have = None if forward_inputs is None else sorted(forward_inputs)
            raise ValueError(
                f"the OpenVLA-OFT policy needs forward_inputs['action_tokens'] (the rollout's tokens), got {have}"
            )
        pixels, ids, mask = self._inputs(obs)
        tokens = forward_inputs["action_tokens"].to(self.device, torch.long).reshape(ids.shape[0], -1)
        out = self.model.evaluate_chunk(
            pixels, ids, mask, tokens, self._proprio(obs), temperature=self.config.temperature
        )
        return (
            self._chunk(out.log_probs),
            self._chunk(out.entropy),
            self._values(out.values, ids.shape[0]),
        )

    def imitation_loss(self, obs: Mapping[str, Tensor], actions: Tensor, mask: Tensor) -> Tensor:
        """OFT's supervised loss (scalar) on demonstrated chunks ``actions [N, C, D]`` (env units), ``mask [N, C]``.

        The actions are mapped to OpenVLA's normalised space (the inverse of what :meth:`act` executes). With
        an L1 head: the mean absolute error of its normalised actions (OFT's L1 regression objective); without
        one: the cross-entropy of the actions' tokens at temperature 1. Padded actions (``mask`` 0) are left out.

        Raises:
            ValueError: when the chunks are not ``[N, num_action_chunks, action_dim]``.
        """
        c, d = self.model.num_action_chunks, self.model.action_dim
        if actions.shape[1:] != (c, d) or tuple(mask.shape) != (actions.shape[0], c):
            raise ValueError(
                f"imitation_loss: actions must be [N, {c}, {d}] (actor.model.num_action_chunks, the action dims) "
                f"and mask [N, {c}]; got {list(actions.shape)} and {list(mask.shape)}"
            )
        target = self._normalized_targets(actions)
        pixels, ids, prompt_mask = self._inputs(obs)
        proprio = self._proprio(obs)
        weight = mask.to(self.device, torch.float32)[..., None]  # [N, C, 1]
        total = (weight.sum() * d).clamp_min(1.0)
        if self.model.action_head is not None:
            predicted = self.model.regress_chunk(pixels, ids, prompt_mask, proprio)
            return ((predicted - target).abs() * weight).sum() / total
        tokens = self.model.action_tokenizer.encode(target).reshape(ids.shape[0], -1)
        out = self.model.evaluate_chunk(pixels, ids, prompt_mask, tokens, proprio, temperature=1.0)
        return -(self._chunk(out.log_probs) * weight).sum() / total
