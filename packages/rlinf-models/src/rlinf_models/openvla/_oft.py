"""OpenVLA-OFT: a chunk of ``C × D`` action tokens from ONE forward pass (parallel decoding), plus OFT's heads.

OpenVLA-OFT (Kim et al., "Fine-Tuning Vision-Language-Action Models: Optimizing Speed and Success",
arXiv 2502.19645; github.com/moojink/openvla-oft) keeps OpenVLA's network and checkpoint layout and changes
how actions come out of it. ``predict_action`` appends ``C·D`` placeholder positions and a stop token (Llama's
``</s>``, id 2) to the prompt; the placeholders' input embeddings are zeros, so nothing about the actions is fed
in, and the Llama runs with full bidirectional attention over every non-padding position (OFT's transformers
fork replaces the causal mask with the padding mask in SDPA attention). The hidden state of the last prompt
token and of the first ``C·D - 1`` placeholders then predict the ``C·D`` action tokens at once, the usual
one-position shift of a causal LM (``_regression_or_discrete_prediction``). Here the sequence is

    [BOS, patches of each camera, (proprio token), prompt[1:], 0 × C·D, </s>]

with the mask ``[B, 1, L, L]`` of "attend to every non-padding key" passed to the Llama as a 4-D mask.

Two heads read those ``C·D`` hidden states:

- discrete (the LM head): the logits restricted to the ``n_action_bins`` action tokens, sampled at a
  temperature for RL (RLinf's ``OpenVLAOFTForRLActionPrediction``); because the action positions' inputs are
  zeros, the actor's recomputation of stored tokens is the same single pass, and its log-probabilities equal
  the rollout's;
- L1 regression (:class:`L1RegressionActionHead`, OFT's ``MLPResNet``): the ``D`` hidden states of each action
  concatenated, ``[B, C, D·H]`` → normalised actions ``[B, C, D]``; OFT's deterministic policy, trained with
  an L1 loss.

:class:`ProprioProjector` (OFT's ``projectors.py``) maps the normalised proprioceptive state to one extra token
after the patches. OFT checkpoints ship both as ``torch.save``'d state dicts beside the safetensors,
``action_head--<step>_checkpoint.pt`` and ``proprio_projector--<step>_checkpoint.pt``, with DDP's ``module.``
prefix: :func:`load_openvla_oft` reads them strictly, :func:`save_openvla_oft` writes them. FiLM
(``vision_backbone--*``) and diffusion (``noisy_action_projector--*``) checkpoints are refused.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import attrs
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..vla._checkpoint import stored_value_head_sizes
from ._checkpoint import OpenVLALoadReport, build_empty, load_openvla_weights, save_openvla
from ._config import OpenVLAConfig
from ._model import ActionSample, OpenVLAModel

__all__ = [
    "OFT_PLATFORMS",
    "OFT_STOP_TOKEN_ID",
    "L1RegressionActionHead",
    "MLPResNet",
    "OFTPlatform",
    "OpenVLAOFTModel",
    "ProprioProjector",
    "load_openvla_oft",
    "oft_side_files",
    "save_openvla_oft",
]

OFT_STOP_TOKEN_ID = 2
"""Llama's ``</s>``, appended after the action placeholders as at OFT's training time (``STOP_INDEX``)."""


@attrs.frozen
class OFTPlatform:
    """OFT's per-robot constants (``prismatic/vla/constants.py``)."""

    num_actions_chunk: int
    action_dim: int
    proprio_dim: int


OFT_PLATFORMS: Mapping[str, OFTPlatform] = {
    "libero": OFTPlatform(num_actions_chunk=8, action_dim=7, proprio_dim=8),
    "aloha": OFTPlatform(num_actions_chunk=25, action_dim=14, proprio_dim=14),
    "bridge": OFTPlatform(num_actions_chunk=5, action_dim=7, proprio_dim=7),
}
"""Chunk length, action and proprio sizes OFT trains with per platform (LIBERO: 8 actions of 7, proprio 8)."""

_SIDE_FILE = re.compile(r"^(?P<module>[a-z_]+)--(?P<step>.+)_checkpoint\.pt$")
_SUPPORTED_SIDE = ("action_head", "proprio_projector")


class _MLPResNetBlock(nn.Module):
    """Pre-LayerNorm residual block: ``x + ReLU(Linear(LayerNorm(x)))`` (keys ``ffn.0``, ``ffn.1``)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.ffn = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, dim), nn.ReLU())

    def forward(self, x: Tensor) -> Tensor:
        return x + self.ffn(x)  # type: ignore[no-any-return]


class MLPResNet(nn.Module):
    """OFT's ``MLPResNet``: LayerNorm → Linear → ReLU, residual blocks, LayerNorm → Linear."""

    def __init__(self, num_blocks: int, input_dim: int, hidden_dim: int, output_dim: int) -> None:
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(input_dim)
        self.fc1 = nn.Linear(input_dim, hidden_dim)
        self.mlp_resnet_blocks = nn.ModuleList(_MLPResNetBlock(hidden_dim) for _ in range(num_blocks))
        self.layer_norm2 = nn.LayerNorm(hidden_dim)
        self.fc2 = nn.Linear(hidden_dim, output_dim)

    def forward(self, x: Tensor) -> Tensor:
        x = F.relu(self.fc1(self.layer_norm1(x)))
        for block in self.mlp_resnet_blocks:
            x = block(x)
        return self.fc2(self.layer_norm2(x))  # type: ignore[no-any-return]


class L1RegressionActionHead(nn.Module):
    """OFT's continuous head: each action's ``D`` hidden states, concatenated, → its ``D`` normalised values.

    Keys ``model.*`` (an :class:`MLPResNet` of 2 blocks, input ``D·H``, hidden ``H``: OFT builds it with
    ``input_dim = hidden_dim = llm_dim``).
    """

    def __init__(self, llm_dim: int, action_dim: int, *, hidden_dim: int | None = None) -> None:
        super().__init__()
        self.action_dim = action_dim
        self.model = MLPResNet(2, llm_dim * action_dim, hidden_dim or llm_dim, action_dim)

    def forward(self, action_hidden: Tensor) -> Tensor:
        """``[B, C·D, H]`` → normalised actions ``[B, C, D]``."""
        b, n, h = action_hidden.shape
        return self.model(action_hidden.reshape(b, n // self.action_dim, self.action_dim * h))  # type: ignore[no-any-return]


class ProprioProjector(nn.Module):
    """OFT's proprio projector: ``fc2(GELU(fc1(state)))``, the normalised state ``[B, P]`` → one token ``[B, H]``."""

    def __init__(self, llm_dim: int, proprio_dim: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(proprio_dim, llm_dim)
        self.fc2 = nn.Linear(llm_dim, llm_dim)

    def forward(self, proprio: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(proprio)))  # type: ignore[no-any-return]


class OpenVLAOFTModel(OpenVLAModel):
    """OpenVLA with OFT's parallel decoding of ``num_action_chunks × action_dim`` tokens and optional heads.

    Args:
        config: ``config.json`` (an OpenVLA one: OFT does not change it).
        action_dim: ``D``, dimensions of one action.
        num_action_chunks: ``C``, actions per forward pass.
        value_head_sizes: the value head's hidden widths (``None``: no value head); it reads the hidden state
            of the last prompt token, the one that predicts the first action token (RLinf's choice).
        l1_head: build the L1 regression head.
        proprio_dim: build the proprio projector for a state of this size (``None``: no proprio token).
        num_images: cameras per observation, each giving its own patches, in order (OFT's LIBERO models: 2).
    """

    side_modules = ("action_head", "proprio_projector")
    FSDP_FORWARD_METHODS = (
        *OpenVLAModel.FSDP_FORWARD_METHODS,
        "embed_chunk_inputs",
        "bidirectional_hidden",
        "action_hidden",
        "value_of",
        "sample_chunk",
        "decode_hidden",
        "evaluate_chunk",
        "regress_chunk",
        "regress_hidden",
    )

    def __init__(
        self,
        config: OpenVLAConfig,
        *,
        action_dim: int,
        num_action_chunks: int,
        value_head_sizes: tuple[int, ...] | None = None,
        l1_head: bool = False,
        proprio_dim: int | None = None,
        num_images: int = 1,
    ) -> None:
        super().__init__(config, value_head_sizes=value_head_sizes)
        if action_dim < 1 or num_action_chunks < 1 or num_images < 1:
            raise ValueError(
                f"action_dim, num_action_chunks and num_images must be >= 1, got {action_dim}, "
                f"{num_action_chunks}, {num_images}"
            )
        hidden = self.language_model.config.hidden_size
        self.action_dim = action_dim
        self.num_action_chunks = num_action_chunks
        self.num_images = num_images
        self.action_head = L1RegressionActionHead(hidden, action_dim) if l1_head else None
        self.proprio_projector = ProprioProjector(hidden, proprio_dim) if proprio_dim is not None else None

    @property
    def num_action_tokens(self) -> int:
        """``C·D``: the placeholders of one pass."""
        return self.action_dim * self.num_action_chunks

    def embed_chunk_inputs(
        self, pixel_values: Tensor, input_ids: Tensor, attention_mask: Tensor, proprio: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """OFT's LM input ``[BOS, patches, (proprio), prompt[1:], 0 × C·D, </s>]`` ``[B, L', H]`` and its mask.

        Args:
            pixel_values: ``[B, 3·towers·num_images, S, S]``, the cameras' :func:`preprocess_images` stacked.
            input_ids: ``[B, L]`` prompts (BOS in column 0, left padding after it, ending with Llama's ``▁``).
            attention_mask: ``[B, L]``.
            proprio: ``[B, P]`` normalised state; required exactly when the model has a proprio projector.
        """
        dtype = self.projector.fc1.weight.dtype
        per_image = pixel_values.shape[1] // self.num_images
        patches = torch.cat(
            [
                self.projector(self.vision_backbone(image.to(dtype)))
                for image in torch.split(pixel_values, per_image, dim=1)
            ],
            dim=1,
        )
        if (proprio is None) != (self.proprio_projector is None):
            raise ValueError(
                "proprio must be given exactly when the model has a proprio projector "
                f"(has one: {self.proprio_projector is not None})"
            )
        if self.proprio_projector is not None and proprio is not None:
            token = self.proprio_projector(proprio.to(self.proprio_projector.fc1.weight.dtype))
            patches = torch.cat([patches, token[:, None].to(patches.dtype)], dim=1)
        embeds, mask = self.splice_patches(input_ids, attention_mask, patches)
        b, a = embeds.shape[0], self.num_action_tokens
        stop = self.language_model.get_input_embeddings()(input_ids.new_full((b, 1), OFT_STOP_TOKEN_ID))
        embeds = torch.cat([embeds, embeds.new_zeros(b, a, embeds.shape[-1]), stop], dim=1)
        return embeds, torch.cat([mask, mask.new_ones(b, a + 1)], dim=1)

    def bidirectional_hidden(self, embeds: Tensor, mask: Tensor) -> Tensor:
        """The LM's last hidden states ``[B, L', H]``, every position attending to every non-padding one."""
        positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
        keys = mask.bool()[:, None, None, :].expand(
            -1, 1, mask.shape[1], -1
        )  # True: attend (SDPA's bool mask)
        out = self.language_model.model(inputs_embeds=embeds, attention_mask=keys, position_ids=positions)
        hidden: Tensor = out.last_hidden_state
        return hidden

    def action_hidden(
        self, pixel_values: Tensor, input_ids: Tensor, attention_mask: Tensor, proprio: Tensor | None = None
    ) -> Tensor:
        """The ``C·D`` hidden states ``[B, C·D, H]`` that predict the chunk's tokens (last prompt token onwards)."""
        embeds, mask = self.embed_chunk_inputs(pixel_values, input_ids, attention_mask, proprio)
        hidden = self.bidirectional_hidden(embeds, mask)
        a = self.num_action_tokens
        return hidden[:, -a - 2 : -2]

    def value_of(self, predicting: Tensor) -> Tensor | None:
        """Values ``[B]`` from :meth:`action_hidden`'s states (the last prompt token's), ``None`` without a head."""
        return self._value(predicting[:, 0])

    def sample_chunk(
        self,
        pixel_values: Tensor,
        input_ids: Tensor,
        attention_mask: Tensor,
        proprio: Tensor | None = None,
        *,
        temperature: float = 1.0,
        top_k: int = 0,
        greedy: bool = False,
        generator: torch.Generator | None = None,
    ) -> ActionSample:
        """The chunk's ``C·D`` action tokens ``[B, C·D]`` from one pass (parallel decoding), with log-probs.

        Every token is drawn from its own position's tempered (top-k) distribution, independently; ``greedy``
        takes each position's most likely token. Log-probabilities and entropies are the tempered ones.
        """
        predicting = self.action_hidden(pixel_values, input_ids, attention_mask, proprio)
        return self.decode_hidden(
            predicting, temperature=temperature, top_k=top_k, greedy=greedy, generator=generator
        )

    def decode_hidden(
        self,
        predicting: Tensor,
        *,
        temperature: float = 1.0,
        top_k: int = 0,
        greedy: bool = False,
        generator: torch.Generator | None = None,
    ) -> ActionSample:
        """:meth:`sample_chunk` from the pass's :meth:`action_hidden` ``[B, C·D, H]``."""
        dist = self._token_dist(predicting, temperature, top_k)  # [B, C·D, bins]
        if greedy:
            index = dist.argmax(-1)
        else:
            flat = torch.multinomial(dist.exp().flatten(0, 1), 1, generator=generator)
            index = flat.reshape(dist.shape[:2])
        log_probs = dist.gather(-1, index[..., None]).squeeze(-1)
        tokens = index + self.action_tokenizer.first_token
        return ActionSample(tokens, log_probs, self._entropy(dist), self.value_of(predicting))

    def evaluate_chunk(
        self,
        pixel_values: Tensor,
        input_ids: Tensor,
        attention_mask: Tensor,
        action_tokens: Tensor,
        proprio: Tensor | None = None,
        *,
        temperature: float = 1.0,
        top_k: int = 0,
    ) -> ActionSample:
        """Log-probabilities ``[B, C·D]``, entropies and values of stored ``action_tokens [B, C·D]``.

        The same single pass as :meth:`sample_chunk` (the action positions' inputs are zeros, not the tokens).

        Raises:
            ValueError: when a token is not an action token or the chunk has the wrong length.
        """
        first = self.action_tokenizer.first_token
        index = action_tokens - first
        if action_tokens.shape[1] != self.num_action_tokens:
            raise ValueError(
                f"a chunk has {self.num_action_tokens} action tokens, got {action_tokens.shape[1]}"
            )
        if bool(((index < 0) | (index >= self.config.n_action_bins)).any()):
            raise ValueError(f"action tokens must lie in [{first}, {first + self.config.n_action_bins})")
        predicting = self.action_hidden(pixel_values, input_ids, attention_mask, proprio)
        dist = self._token_dist(predicting, temperature, top_k)
        log_probs = dist.gather(-1, index[..., None]).squeeze(-1)
        return ActionSample(action_tokens, log_probs, self._entropy(dist), self.value_of(predicting))

    def regress_chunk(
        self, pixel_values: Tensor, input_ids: Tensor, attention_mask: Tensor, proprio: Tensor | None = None
    ) -> Tensor:
        """OFT's L1 head: normalised actions ``[B, C, D]`` from the same pass.

        Raises:
            ValueError: without an L1 head.
        """
        if self.action_head is None:
            raise ValueError(
                "this OpenVLA-OFT model has no L1 regression head (no action_head--*_checkpoint.pt)"
            )
        return self.regress_hidden(self.action_hidden(pixel_values, input_ids, attention_mask, proprio))

    def regress_hidden(self, predicting: Tensor) -> Tensor:
        """:meth:`regress_chunk` from the pass's :meth:`action_hidden` ``[B, C·D, H]``: normalised ``[B, C, D]``.

        The policy's deterministic ``act`` calls this rather than ``action_head`` itself: under FSDP2 the head's
        parameters belong to this module's unit, gathered around the methods of ``FSDP_FORWARD_METHODS`` only.

        Raises:
            ValueError: without an L1 head.
        """
        if self.action_head is None:
            raise ValueError(
                "this OpenVLA-OFT model has no L1 regression head (no action_head--*_checkpoint.pt)"
            )
        return self.action_head(predicting.to(self.action_head.model.fc1.weight.dtype)).float()  # type: ignore[no-any-return]


def oft_side_files(directory: str | Path) -> dict[str, Path]:
    """OFT's extra module files of a checkpoint directory, ``{"action_head": path, "proprio_projector": path}``.

    Raises:
        ValueError: for two files of one module (several training steps), or a FiLM / diffusion module file.
    """
    found: dict[str, list[Path]] = {}
    for path in sorted(Path(directory).iterdir()):
        match = _SIDE_FILE.match(path.name)
        if match:
            found.setdefault(match["module"], []).append(path)
    unsupported = sorted(set(found) - set(_SUPPORTED_SIDE))
    if unsupported:
        raise ValueError(
            f"{directory} has OpenVLA-OFT module files {unsupported}: only {list(_SUPPORTED_SIDE)} are supported "
            "(FiLM's vision_backbone and diffusion's noisy_action_projector are not)"
        )
    several = {name: [p.name for p in paths] for name, paths in found.items() if len(paths) > 1}
    if several:
        raise ValueError(f"{directory} has several checkpoint files of one module: {several}; keep one")
    return {name: paths[0] for name, paths in found.items()}


def _read_side_file(path: Path, prefix: str) -> dict[str, Tensor]:
    state = torch.load(path, map_location="cpu", weights_only=True)
    # OFT saves its DDP-wrapped modules: their keys start with "module.".
    return {prefix + (k[len("module.") :] if k.startswith("module.") else k): v for k, v in state.items()}


def load_openvla_oft(
    directory: str | Path,
    *,
    action_dim: int,
    num_action_chunks: int,
    value_head_sizes: tuple[int, ...] | None = None,
    num_images: int = 1,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> tuple[OpenVLAOFTModel, OpenVLALoadReport]:
    """An OpenVLA-OFT checkpoint directory: the OpenVLA layout plus OFT's module files (see the module docstring).

    The L1 head is built when ``action_head--*_checkpoint.pt`` is there (for ``action_dim`` dims: a head of
    another width is a shape mismatch), the proprio projector when ``proprio_projector--*_checkpoint.pt`` is
    (its state size is the file's). Everything is loaded strictly, the module files included.

    Raises:
        CheckpointMismatchError: naming missing / unexpected tensors and shape mismatches.
        ValueError: for unsupported or duplicated module files (:func:`oft_side_files`).
    """
    root = Path(directory)
    config = OpenVLAConfig.from_json(root / "config.json")
    sizes = value_head_sizes if value_head_sizes is not None else stored_value_head_sizes(root)
    files = oft_side_files(root)
    extra: dict[str, Tensor] = {}
    for name, path in files.items():
        extra.update(_read_side_file(path, name + "."))
    proprio_dim = None
    if "proprio_projector" in files:
        weight = extra.get("proprio_projector.fc1.weight")
        if weight is None:
            raise ValueError(f"{files['proprio_projector']} has no fc1.weight: not a proprio projector")
        proprio_dim = int(weight.shape[1])
    model = build_empty(
        lambda: OpenVLAOFTModel(
            config,
            action_dim=action_dim,
            num_action_chunks=num_action_chunks,
            value_head_sizes=sizes,
            l1_head="action_head" in files,
            proprio_dim=proprio_dim,
            num_images=num_images,
        ),
        sizes,
    )
    report = load_openvla_weights(model, root, extra=extra)
    return model.to(device=device, dtype=dtype), report


def save_openvla_oft(
    model: OpenVLAOFTModel,
    directory: str | Path,
    *,
    step: int | str = "latest",
    max_shard_bytes: int = 5 * 2**30,
) -> None:
    """OpenVLA's layout (:func:`save_openvla`) plus ``<module>--<step>_checkpoint.pt`` per head, as OFT saves them."""
    root = Path(directory)
    save_openvla(model, root, max_shard_bytes=max_shard_bytes)
    for name in model.side_modules:
        module = getattr(model, name)
        if module is not None:
            state = {f"module.{k}": v.detach().clone() for k, v in module.state_dict().items()}
            torch.save(state, root / f"{name}--{step}_checkpoint.pt")
