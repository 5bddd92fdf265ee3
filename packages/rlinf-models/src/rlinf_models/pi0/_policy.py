"""``Pi0Policy``: a π0 / π0.5 checkpoint as an RL policy of the embodied PPO/GRPO path (πRL's recipe).

It is :class:`~rlinf_models.vla.VLAFlowPolicy` (Flow-SDE / Flow-Noise chains over the executed part of the
model's normalised action block, values from the prefix, the SFT flow-matching loss) with π0 as the velocity
field. π0 tokenises the instructions once, at build time, and feeds the normalised, padded state to the action
expert; π0.5 writes the discretised state into the prompt, so its prompts are tokenised per call. π0 normalises
with mean/std statistics, π0.5 with quantiles (openpi's or LeRobot's formulas, as the statistics file says).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import torch
from rlinf_core.protocols import EnvSpec
from torch import Tensor

from ..policies import PolicyConfig
from ..policies._flow import FORWARD_INPUT_KEYS
from ..vla._policy import VLACondition, VLAFlowPolicy, inject_lora
from ._checkpoint import load_pi0, save_pi0
from ._inputs import (
    NormStats,
    load_lerobot_norm_stats,
    load_openpi_norm_stats,
    load_tokenizer,
    pad_last,
    preprocess_image,
    tokenize_prompts,
)
from ._model import Pi0Model

__all__ = ["PI0_FORWARD_INPUT_KEYS", "Pi0Policy", "apply_lora", "load_norm_stats"]

PI0_FORWARD_INPUT_KEYS = FORWARD_INPUT_KEYS
"""``PolicyOutput.forward_inputs`` of :meth:`Pi0Policy.act`: ``chains [N, K+1, chunk_size, max_action_dim]`` (the
normalised, padded denoising chain, initial noise first) and ``denoise_mask [N, K]`` (its stochastic steps)."""

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


def apply_lora(model: Pi0Model, config: PolicyConfig) -> None:
    """Inject peft LoRA adapters into the Gemma towers' ``config.lora_target_modules``, in place.

    The rest of the backbone (``paligemma_with_expert``) is frozen: only the adapters and the modules outside
    the backbone (projections, time MLPs, heads) keep ``requires_grad``.

    Raises:
        ImportError: without peft (naming the extra).
        ValueError: naming ``actor.model.lora_target_modules`` when none of them is in the towers.
    """
    # The language model's and the expert's layers only.
    inject_lora(
        model.paligemma_with_expert,
        config,
        towers=r".*\.(language_model|gemma_expert)",
        where="the Gemma towers",
    )


class Pi0Policy(VLAFlowPolicy[Pi0Model]):
    """π0 / π0.5 (``actor.model.model_type: pi0`` / ``pi05``) with the interface of ``FlowPolicy``.

    Args:
        spec: the env: continuous actions with ``action_dim <= max_action_dim``, dict observations with the
            cameras ``config.image_keys`` and the vector ``config.state_key``, and ``task_descriptions``.
        config: ``actor.model``; ``model_path``, ``tokenizer_path`` and ``norm_stats_path`` name local files.

    Raises:
        ValueError: naming the ``actor.model`` field (or the env) that does not fit the checkpoint.
    """

    name = "π0"

    def __init__(self, spec: EnvSpec, config: PolicyConfig) -> None:
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
        super().__init__(spec, config, model, expert_width=mc.action_expert.width)
        self.state_stats, self.action_stats = load_norm_stats(config.norm_stats_path)
        self.norm_mode: Literal["mean_std", "quantile"] = "quantile" if mc.pi05 else "mean_std"
        self.tokenizer = load_tokenizer(config.tokenizer_path)
        # π0's prompts do not depend on the observation: tokenised once.
        self._register_task_tokens(
            *tokenize_prompts(self.tokenizer, self.task_descriptions, mc.tokenizer_max_length)
        )

    def _state(self, obs: Mapping[str, Tensor]) -> Tensor:
        """The observation's state, normalised (not padded): ``[N, state_dim]`` float32."""
        state = obs[self.config.state_key].to(self.device, torch.float32)
        return self.state_stats.normalize(state, self.norm_mode)

    def _encode(self, obs: Mapping[str, Tensor]) -> VLACondition:
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
        return VLACondition(self.model.encode_prefix(images, present, tokens, mask), padded_state)

    def _expert_output(self, x_t: Tensor, t: Tensor, cond: VLACondition) -> Tensor:
        return self.model.expert_output(x_t, t, cond.prefix, cond.state)

    def _normalize_actions(self, actions: Tensor) -> Tensor:
        return self.action_stats.normalize(actions, self.norm_mode)

    def _unnormalize_actions(self, actions: Tensor) -> Tensor:
        return self.action_stats.unnormalize(actions, self.norm_mode)

    def _save_network(self, directory: Path) -> None:
        save_pi0(
            self.model,
            directory,
            state_dim=self._state_dim(),
            action_dim=self.action_dim,
            camera_names=self._camera_names(),
        )
