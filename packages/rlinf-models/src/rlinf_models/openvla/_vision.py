"""Prismatic's vision side: timm-layout ViT featurizers, the (fused) vision backbone and the projector.

OpenVLA builds its featurizers with ``timm.create_model`` (timm 0.9.x) and stores them under timm's tensor names
(``vision_backbone.featurizer.blocks.0.attn.qkv.weight``, ...), with LayerScale's ``gamma`` renamed
``scale_factor`` by its Hugging Face patch. timm is not a dependency here, and transformers' ``Dinov2Model`` /
``SiglipVisionModel`` cannot hold these tensors under these names (separate q/k/v projections, other module
paths), so :class:`TimmViT` re-implements the forward pass of timm's ``VisionTransformer`` with exactly its module
tree. Only what OpenVLA runs is implemented: ``get_intermediate_layers(n={depth - 2})``, i.e. the patch tokens
(prefix tokens dropped) after the second-to-last block, unnormalised.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._config import ViTSpec

__all__ = ["PrismaticProjector", "PrismaticVisionBackbone", "TimmViT"]

_LN_EPS = 1e-6  # timm's ViT norm layer: partial(nn.LayerNorm, eps=1e-6)


class _PatchEmbed(nn.Module):
    def __init__(self, spec: ViTSpec) -> None:
        super().__init__()
        self.proj = nn.Conv2d(3, spec.embed_dim, kernel_size=spec.patch_size, stride=spec.patch_size)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.proj(x)
        return out.flatten(2).transpose(1, 2)


class _LayerScale(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.scale_factor = nn.Parameter(torch.full((dim,), 1e-5))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.scale_factor


class _Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.fc2(self.act(self.fc1(x)))
        return out


class _Attention(nn.Module):
    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        b, n, c = x.shape
        q, k, v = (
            self.qkv(x).reshape(b, n, 3, self.num_heads, c // self.num_heads).permute(2, 0, 3, 1, 4).unbind(0)
        )
        out = F.scaled_dot_product_attention(q, k, v)
        projected: Tensor = self.proj(out.transpose(1, 2).reshape(b, n, c))
        return projected


class _Block(nn.Module):
    def __init__(self, spec: ViTSpec) -> None:
        super().__init__()
        dim = spec.embed_dim
        self.norm1 = nn.LayerNorm(dim, eps=_LN_EPS)
        self.attn = _Attention(dim, spec.num_heads)
        self.ls1: nn.Module = _LayerScale(dim) if spec.layer_scale else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=_LN_EPS)
        self.mlp = _Mlp(dim, spec.mlp_hidden)
        self.ls2: nn.Module = _LayerScale(dim) if spec.layer_scale else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.ls1(self.attn(self.norm1(x)))
        out: Tensor = x + self.ls2(self.mlp(self.norm2(x)))
        return out


class _AttentionPoolLatent(nn.Module):
    """timm's MAP head (``attn_pool``): its tensors are in SigLIP checkpoints; OpenVLA never runs it."""

    def __init__(self, spec: ViTSpec) -> None:
        super().__init__()
        dim = spec.embed_dim
        self.latent = nn.Parameter(torch.zeros(1, 1, dim))
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim, eps=_LN_EPS)
        self.mlp = _Mlp(dim, spec.mlp_hidden)


class TimmViT(nn.Module):
    """timm's ``VisionTransformer`` (``num_classes=0``) as a Prismatic featurizer: ``[B, 3, S, S] → [B, P, D]``."""

    def __init__(self, spec: ViTSpec, image_size: int) -> None:
        super().__init__()
        if image_size % spec.patch_size:
            raise ValueError(f"image size {image_size} is not a multiple of the patch size {spec.patch_size}")
        self.spec = spec
        num_patches = (image_size // spec.patch_size) ** 2
        prefix = int(spec.class_token) + spec.reg_tokens
        self.num_prefix_tokens = prefix
        self.patch_embed = _PatchEmbed(spec)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, spec.embed_dim)) if spec.class_token else None
        self.reg_token = (
            nn.Parameter(torch.zeros(1, spec.reg_tokens, spec.embed_dim)) if spec.reg_tokens else None
        )
        embed_len = num_patches if spec.no_embed_class else num_patches + prefix
        self.pos_embed = nn.Parameter(0.02 * torch.randn(1, embed_len, spec.embed_dim))
        self.blocks = nn.Sequential(*(_Block(spec) for _ in range(spec.depth)))
        self.norm = nn.LayerNorm(spec.embed_dim, eps=_LN_EPS)
        self.attn_pool = _AttentionPoolLatent(spec) if spec.attn_pool else None

    def forward(self, images: Tensor) -> Tensor:
        x: Tensor = self.patch_embed(images)
        prefix = [t.expand(x.shape[0], -1, -1) for t in (self.cls_token, self.reg_token) if t is not None]
        if self.spec.no_embed_class:
            x = torch.cat([*prefix, x + self.pos_embed], dim=1)
        else:
            x = torch.cat([*prefix, x], dim=1) + self.pos_embed
        # Prismatic takes the second-to-last block's output: the last block never runs.
        for block in list(self.blocks)[: self.spec.depth - 1]:
            x = block(x)
        return x[:, self.num_prefix_tokens :]


class PrismaticVisionBackbone(nn.Module):
    """``featurizer`` (and ``fused_featurizer``): patch features, concatenated along the width when fused.

    ``pixel_values`` stack the towers' inputs along the channels, ``[B, 3·towers, S, S]``.
    """

    def __init__(self, specs: tuple[ViTSpec, ...], image_sizes: tuple[int, ...]) -> None:
        super().__init__()
        self.featurizer = TimmViT(specs[0], image_sizes[0])
        self.fused_featurizer = TimmViT(specs[1], image_sizes[1]) if len(specs) == 2 else None
        self.embed_dim = sum(spec.embed_dim for spec in specs)

    def forward(self, pixel_values: Tensor) -> Tensor:
        if self.fused_featurizer is None:
            return self.featurizer(pixel_values)  # type: ignore[no-any-return]
        image, fused_image = torch.split(pixel_values, [3, 3], dim=1)
        return torch.cat([self.featurizer(image), self.fused_featurizer(fused_image)], dim=2)


class PrismaticProjector(nn.Module):
    """The MLP from patch features to LM embeddings: ``fc1, fc2`` (GELU), or ``fc1, fc2, fc3`` when fused."""

    def __init__(self, *, fused: bool, vision_dim: int, llm_dim: int) -> None:
        super().__init__()
        hidden = 4 * vision_dim if fused else llm_dim
        self.fc1 = nn.Linear(vision_dim, hidden)
        self.fc2 = nn.Linear(hidden, llm_dim)
        self.fc3 = nn.Linear(llm_dim, llm_dim) if fused else None

    def forward(self, patches: Tensor) -> Tensor:
        x: Tensor = self.fc2(F.gelu(self.fc1(patches)))
        if self.fc3 is None:
            return x
        out: Tensor = self.fc3(F.gelu(x))
        return out
