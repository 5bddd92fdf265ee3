"""``SmolVLAPolicy``: a SmolVLA checkpoint as an RL policy of the embodied PPO/GRPO path (πRL's recipe).

It is :class:`~rlinf_models.vla.VLAFlowPolicy`, as :class:`~rlinf_models.pi0.Pi0Policy` is, with SmolVLA as the
velocity field: ``act`` encodes the prefix (cameras, instruction, state) once and samples a Flow-SDE /
Flow-Noise chain over the model's whole ``[chunk_size, max_action_dim]`` normalised block, returning the first
``num_action_chunks`` actions, first ``action_dim`` dimensions, unnormalised; ``evaluate`` recomputes the
chain's log-probability with :func:`rlinf_models.flow.chain_log_prob` over that executed part. Inputs are
prepared as LeRobot's SmolVLA processor does (left/top image padding, mean/std statistics, newline-terminated
prompts).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
from rlinf_core.protocols import EnvSpec
from torch import Tensor

from ..pi0._inputs import load_tokenizer, pad_last
from ..pi0._policy import load_norm_stats
from ..policies import PolicyConfig
from ..vla._policy import VLACondition, VLAFlowPolicy, inject_lora
from ._checkpoint import load_smolvla, save_smolvla
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
    # The text model's and the expert's layers only.
    inject_lora(
        model.vlm_with_expert,
        config,
        towers=r"(.*\.)?(text_model|lm_expert)",
        where="SmolVLA's text model or action expert",
    )


class SmolVLAPolicy(VLAFlowPolicy[SmolVLAModel]):
    """SmolVLA (``actor.model.model_type: smolvla``) with the interface of ``FlowPolicy``.

    Args:
        spec: the env: continuous actions with ``action_dim <= max_action_dim``, dict observations with the
            cameras ``config.image_keys`` and the vector ``config.state_key``, and ``task_descriptions``.
        config: ``actor.model``; ``model_path``, ``tokenizer_path`` (the VLM's tokenizer) and
            ``norm_stats_path`` (LeRobot's normalizer file) name local files.

    Raises:
        ValueError: naming the ``actor.model`` field (or the env) that does not fit the checkpoint.
    """

    name = "SmolVLA"

    def __init__(self, spec: EnvSpec, config: PolicyConfig) -> None:
        if config.model_path is None or config.tokenizer_path is None or config.norm_stats_path is None:
            raise ValueError("actor.model: smolvla needs model_path, tokenizer_path and norm_stats_path")
        model, _ = load_smolvla(config.model_path)
        if config.is_lora:
            apply_lora(model, config)
        mc = model.config
        super().__init__(spec, config, model, expert_width=mc.expert_width)
        self.state_stats, self.action_stats = load_norm_stats(config.norm_stats_path)
        # The prompts do not depend on the observation: tokenised once.
        self._register_task_tokens(
            *tokenize_prompts(
                load_tokenizer(config.tokenizer_path), self.task_descriptions, mc.tokenizer_max_length
            )
        )

    def _encode(self, obs: Mapping[str, Tensor]) -> VLACondition:
        """Encode the prefix of a batch of observations once (cameras, instruction, normalised state)."""
        mc = self.model.config
        images = [preprocess_image(obs[key].to(self.device), mc.image_size) for key in self.image_keys]
        n = images[0].shape[0]
        present = [torch.ones(n, dtype=torch.bool, device=self.device) for _ in images]
        state = obs[self.config.state_key].to(self.device, torch.float32)
        state = pad_last(normalize(state, self.state_stats), mc.max_state_dim)
        ids = self._task_ids(obs, n)
        tokens, mask = self.task_tokens[ids], self.task_token_mask[ids]
        return VLACondition(self.model.encode_prefix(images, present, tokens, mask, state))

    def _expert_output(self, x_t: Tensor, t: Tensor, cond: VLACondition) -> Tensor:
        return self.model.expert_output(x_t, t, cond.prefix)

    def _normalize_actions(self, actions: Tensor) -> Tensor:
        return normalize(actions, self.action_stats)

    def _unnormalize_actions(self, actions: Tensor) -> Tensor:
        return unnormalize(actions, self.action_stats)

    def _save_network(self, directory: Path) -> None:
        save_smolvla(
            self.model,
            directory,
            state_dim=self._state_dim(),
            action_dim=self.action_dim,
            camera_names=self._camera_names(),
        )
