"""``GR00TPolicy``: a GR00T N1.5 checkpoint as an RL policy of the embodied PPO/GRPO path (πRL's recipe).

It is :class:`~rlinf_models.vla.VLAFlowPolicy`, as SmolVLA's and π0's policies are, with GR00T's action head as
the velocity field: ``act`` runs Eagle over the cameras and the instruction once and samples a Flow-SDE /
Flow-Noise chain over the model's whole ``[action_horizon, action_dim]`` normalised block (the state enters every
step through the state token), returning the first ``num_action_chunks`` actions, first ``action_dim``
dimensions, unnormalised with the checkpoint's statistics; ``evaluate`` recomputes the chain's log-probability
with :func:`rlinf_models.flow.chain_log_prob` over that executed part. ``denoising_steps`` plays the role of
GR00T's ``num_inference_timesteps``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import torch
from rlinf_core.protocols import EnvSpec
from torch import Tensor

from ..pi0._inputs import load_tokenizer, pad_last
from ..policies import PolicyConfig
from ..vla._policy import VLACondition, VLAFlowPolicy, inject_lora
from ._checkpoint import METADATA_FILE, load_gr00t, save_gr00t
from ._inputs import load_metadata, normalize, preprocess_image, tokenize_prompts, unnormalize
from ._model import GR00TModel

__all__ = ["DIT_LORA_TARGETS", "EMBODIMENT_IDS", "GR00TPolicy", "apply_lora"]

EMBODIMENT_IDS = {"new_embodiment": 31, "gr1": 24, "oxe_droid": 17, "agibot_genie1": 26, "libero_franka": 31}
"""GR00T N1.5's embodiment tags → the index of their category-specific weights (Isaac-GR00T's
``EMBODIMENT_TAG_MAPPING``: fine-tunes of a new robot use ``new_embodiment``'s slot; RLinf's LIBERO fine-tunes
name that slot ``libero_franka``)."""

DIT_LORA_TARGETS = ("to_q", "to_k", "to_v", "to_out.0", "ff.net.0.proj", "ff.net.2")
"""The linear layers of the action head's transformers (the DiT and the VL self-attention) that get adapters."""


def apply_lora(model: GR00TModel, config: PolicyConfig) -> None:
    """Inject peft LoRA adapters into the Eagle text model and the action head's transformers.

    The text model gets adapters on ``config.lora_target_modules`` (Qwen3's projections), the DiT and the VL
    self-attention on :data:`DIT_LORA_TARGETS`. Everything else of the backbone (the vision tower, ``mlp1``, the
    embeddings) and the transformers' base weights are frozen; the embodiment-specific encoders and decoder, the
    future tokens, the position embedding, ``vlln`` and the value head keep training.

    Raises:
        ImportError: without peft (naming the extra).
        ValueError: naming ``actor.model.lora_target_modules`` when none of them is in the text model.
    """
    inject_lora(
        model.backbone, config, towers=r"(.*\.)?language_model", where="GR00T's Eagle text model (Qwen3)"
    )
    head = model.action_head
    targets: Any = DIT_LORA_TARGETS  # (attrs types the converted field's argument loosely)
    dit_config = attrs.evolve(config, lora_target_modules=targets)
    inject_lora(head, dit_config, towers=r"(model|vl_self_attention)", where="GR00T's DiT")
    for name, param in head.named_parameters():
        in_tower = name.startswith(("model.", "vl_self_attention."))
        param.requires_grad_(".lora_" in name or not in_tower)


class GR00TPolicy(VLAFlowPolicy[GR00TModel]):
    """GR00T N1.5 (``actor.model.model_type: gr00t``) with the interface of ``FlowPolicy``.

    Args:
        spec: the env: continuous actions with ``action_dim <= action_dim`` of the model, dict observations with
            the cameras ``config.image_keys`` and the vector ``config.state_key``, and ``task_descriptions``.
        config: ``actor.model``; ``model_path`` (the checkpoint directory), ``tokenizer_path`` (Eagle's
            tokenizer), ``norm_stats_path`` (``null``: the checkpoint's ``experiment_cfg/metadata.json``) and
            ``embodiment_tag`` (``null``: the only tag of the statistics file).

    Raises:
        ValueError: naming the ``actor.model`` field (or the env) that does not fit the checkpoint.
    """

    name = "GR00T N1.5"

    def __init__(self, spec: EnvSpec, config: PolicyConfig) -> None:
        if config.model_path is None or config.tokenizer_path is None:
            raise ValueError("actor.model: gr00t needs model_path and tokenizer_path")
        stats_file = config.norm_stats_path or str(Path(config.model_path) / METADATA_FILE)
        tag, state_stats, action_stats = load_metadata(stats_file, config.embodiment_tag)
        if tag not in EMBODIMENT_IDS:
            raise ValueError(
                f"actor.model.embodiment_tag {tag!r} ({stats_file}) has no embodiment id: one of {sorted(EMBODIMENT_IDS)}"
            )
        model, _ = load_gr00t(config.model_path, embodiment_id=EMBODIMENT_IDS[tag])
        if config.is_lora:
            apply_lora(model, config)
        mc = model.config
        super().__init__(spec, config, model, expert_width=mc.dit_output_dim)
        self.stats_file = stats_file
        self._check_stats(spec, config, state_stats.dim, action_stats.dim, stats_file)
        self.state_stats, self.action_stats = state_stats, action_stats
        tokens, mask = tokenize_prompts(
            load_tokenizer(config.tokenizer_path),
            self.task_descriptions,
            cameras=len(self.image_keys),
            image_tokens=mc.eagle.image_tokens,
            image_token_id=mc.eagle.image_token_index,
        )
        self._register_task_tokens(tokens, mask)

    @staticmethod
    def _check_stats(
        spec: EnvSpec, config: PolicyConfig, state_dim: int, action_dim: int, where: str
    ) -> None:
        assert spec.obs_dict is not None  # checked by check_vla_env
        env_state = spec.obs_dict[config.state_key].shape[0]
        if env_state != state_dim or spec.action_dim > action_dim:
            raise ValueError(
                f"actor.model.norm_stats_path {where}: its statistics cover {state_dim} state and {action_dim} action "
                f"dims; the env has {env_state} state ({config.state_key!r}) and {spec.action_dim} action dims"
            )

    def _encode(self, obs: Mapping[str, Tensor]) -> VLACondition:
        """Run Eagle over a batch of observations once; normalise and pad the state."""
        mc = self.model.config
        images = [preprocess_image(obs[key].to(self.device), mc.eagle.image_size) for key in self.image_keys]
        n = images[0].shape[0]
        pixel_values = torch.stack(images, dim=1).flatten(0, 1)  # sample-major, as Eagle's processor
        ids = self._task_ids(obs, n)
        tokens, mask = self.task_tokens[ids], self.task_token_mask[ids]
        # Drop the columns no prompt of this batch uses (right padding only).
        length = int(mask.sum(dim=1).max())
        tokens, mask = tokens[:, :length], mask[:, :length]
        state = obs[self.config.state_key].to(self.device, torch.float32)
        state = pad_last(normalize(state, self.state_stats), mc.max_state_dim)
        return VLACondition(self.model.encode_prefix(pixel_values, tokens, mask), state)

    def _expert_output(self, x_t: Tensor, t: Tensor, cond: VLACondition) -> Tensor:
        assert cond.state is not None  # _encode always sets it
        return self.model.expert_output(x_t, t, cond.prefix, cond.state)

    def _normalize_actions(self, actions: Tensor) -> Tensor:
        return normalize(actions, self.action_stats)

    def _unnormalize_actions(self, actions: Tensor) -> Tensor:
        return unnormalize(actions, self.action_stats)

    def _save_network(self, directory: Path) -> None:
        # The statistics go where the published layout keeps them, so norm_stats_path may be null on the export.
        save_gr00t(self.model, directory, metadata=self.stats_file)

    def _save_statistics(self, directory: Path) -> None:
        """Written by :meth:`_save_network` as ``experiment_cfg/metadata.json``."""
