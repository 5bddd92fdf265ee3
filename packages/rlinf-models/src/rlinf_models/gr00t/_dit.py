"""GR00T N1.5's action-head building blocks that transformers lacks, named as the published checkpoint names them.

- :class:`TimestepEncoder`: the discrete denoising step (``0..num_timestep_buckets-1``) → a 256-wide sinusoidal
  code (cosine half first, frequencies ``10000^(-i/(128-1))``) → ``linear_1`` / SiLU / ``linear_2``;
- :class:`TransformerBlock`: pre-norm attention (``attn1``: ``to_q``, ``to_k``, ``to_v``, ``to_out.0``; keys and
  values from the VL tokens when the block cross-attends) and a tanh-GELU MLP (``ff.net.0.proj``, ``ff.net.2``),
  both residual; the DiT's blocks norm their input with an adaptive LayerNorm (``norm1.linear`` of the step
  embedding gives scale and shift) and have no affine LayerNorm weights, the VL self-attention's have;
- :class:`DiT`: the blocks (even ones cross-attend to the VL tokens, odd ones attend to the action-side tokens
  when ``interleave_self_attention``), then an adaptive output norm (``proj_out_1``: shift and scale) and
  ``proj_out_2``;
- :class:`SelfAttentionTransformer`: the blocks without step conditioning, over the VL tokens;
- :class:`CategorySpecificLinear` / :class:`CategorySpecificMLP` / :class:`MultiEmbodimentActionEncoder`: one
  weight matrix per embodiment (``W [E, in, out]``, ``b [E, out]``), picked by the embodiment id.

No dropout is applied (see :attr:`~rlinf_models.gr00t.GR00TConfig.dropout`). ``kv_mask`` (ours) hides padding
tokens of the VL sequence from the attention; without padding it changes nothing.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "CategorySpecificLinear",
    "CategorySpecificMLP",
    "DiT",
    "MultiEmbodimentActionEncoder",
    "SelfAttentionTransformer",
    "TimestepEncoder",
    "TransformerBlock",
    "sinusoidal_encoding",
]

_TIME_CHANNELS = 256


def _timestep_code(steps: Tensor, channels: int = _TIME_CHANNELS) -> Tensor:
    """``[B]`` integer steps → ``[B, channels]``: cosines then sines of ``step · 10000^(-i / (channels/2 - 1))``."""
    half = channels // 2
    exponent = -math.log(10_000.0) * torch.arange(half, dtype=torch.float32, device=steps.device) / (half - 1)
    angles = steps.float()[:, None] * torch.exp(exponent)[None, :]
    return torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1)


def sinusoidal_encoding(steps: Tensor, width: int) -> Tensor:
    """``[B, T]`` steps → ``[B, T, width]``: sines then cosines of ``step · 10000^(-i / (width/2))`` (the action encoder's)."""
    half = width // 2
    exponent = -torch.arange(half, dtype=torch.float32, device=steps.device) * (math.log(10_000.0) / half)
    freqs = steps.float()[..., None] * exponent.exp()
    return torch.cat([torch.sin(freqs), torch.cos(freqs)], dim=-1)


class _TimestepEmbedding(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(_TIME_CHANNELS, width)
        self.linear_2 = nn.Linear(width, width)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.linear_2(F.silu(self.linear_1(x)))
        return out


class TimestepEncoder(nn.Module):
    """Discrete denoising step ``[B]`` → ``[B, width]``."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.timestep_embedder = _TimestepEmbedding(width)

    def forward(self, steps: Tensor) -> Tensor:
        dtype = self.timestep_embedder.linear_1.weight.dtype
        out: Tensor = self.timestep_embedder(_timestep_code(steps).to(dtype))
        return out


class _AdaLayerNorm(nn.Module):
    """LayerNorm without weights, then ``· (1 + scale) + shift`` with ``[scale, shift] = linear(silu(temb))``."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, 2 * width)
        self.norm = nn.LayerNorm(width, eps=1e-5, elementwise_affine=False)

    def forward(self, x: Tensor, temb: Tensor) -> Tensor:
        scale, shift = self.linear(F.silu(temb)).chunk(2, dim=1)
        out: Tensor = self.norm(x) * (1 + scale[:, None]) + shift[:, None]
        return out


class _Attention(nn.Module):
    def __init__(self, width: int, heads: int, head_dim: int, kv_width: int) -> None:
        super().__init__()
        self.heads = heads
        inner = heads * head_dim
        self.to_q = nn.Linear(width, inner)
        self.to_k = nn.Linear(kv_width, inner)
        self.to_v = nn.Linear(kv_width, inner)
        self.to_out = nn.ModuleList([nn.Linear(inner, width)])

    def forward(self, x: Tensor, context: Tensor, kv_mask: Tensor | None) -> Tensor:
        b = x.shape[0]
        q, k, v = self.to_q(x), self.to_k(context), self.to_v(context)
        q, k, v = (t.view(b, t.shape[1], self.heads, -1).transpose(1, 2) for t in (q, k, v))
        mask = None if kv_mask is None else kv_mask[:, None, None, :]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        out = out.transpose(1, 2).reshape(b, x.shape[1], -1)
        result: Tensor = self.to_out[0](out)
        return result


class _GELUProj(nn.Module):
    def __init__(self, width: int, inner: int) -> None:
        super().__init__()
        self.proj = nn.Linear(width, inner)

    def forward(self, x: Tensor) -> Tensor:
        return F.gelu(self.proj(x), approximate="tanh")


class _FeedForward(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        # net.1 (and net.3) are dropouts in the published module tree: no weights.
        self.net = nn.ModuleDict({"0": _GELUProj(width, 4 * width), "2": nn.Linear(4 * width, width)})

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.net["2"](self.net["0"](x))
        return out


class TransformerBlock(nn.Module):
    """One block: (adaptive or affine) LayerNorm → attention → residual; LayerNorm → MLP → residual.

    Args:
        width: token width; heads, head_dim: attention shape.
        kv_width: width of the tokens keys and values are computed from (``width`` for self-attention).
        adaptive: the DiT's step-conditioned norm and weightless LayerNorms (else affine LayerNorms).
    """

    def __init__(self, width: int, heads: int, head_dim: int, *, kv_width: int, adaptive: bool) -> None:
        super().__init__()
        self.adaptive = adaptive
        self.norm1: nn.Module = (
            _AdaLayerNorm(width) if adaptive else nn.LayerNorm(width, eps=1e-5, elementwise_affine=True)
        )
        self.attn1 = _Attention(width, heads, head_dim, kv_width)
        self.norm3 = nn.LayerNorm(width, eps=1e-5, elementwise_affine=not adaptive)
        self.ff = _FeedForward(width)

    def forward(
        self, x: Tensor, context: Tensor | None, kv_mask: Tensor | None, temb: Tensor | None = None
    ) -> Tensor:
        h = self.norm1(x, temb) if self.adaptive else self.norm1(x)
        x = x + self.attn1(h, h if context is None else context, kv_mask)
        out: Tensor = x + self.ff(self.norm3(x))
        return out


class DiT(nn.Module):
    """The action head's diffusion transformer over ``[state, future tokens, actions]`` (see the module docstring)."""

    def __init__(
        self,
        *,
        heads: int,
        head_dim: int,
        layers: int,
        output_dim: int,
        cross_attention_dim: int,
        interleave_self_attention: bool,
    ) -> None:
        super().__init__()
        width = heads * head_dim
        self.interleave_self_attention = interleave_self_attention
        self.timestep_encoder = TimestepEncoder(width)
        self.transformer_blocks = nn.ModuleList(
            [
                TransformerBlock(
                    width,
                    heads,
                    head_dim,
                    kv_width=width if self._is_self(index) else cross_attention_dim,
                    adaptive=True,
                )
                for index in range(layers)
            ]
        )
        self.norm_out = nn.LayerNorm(width, eps=1e-6, elementwise_affine=False)
        self.proj_out_1 = nn.Linear(width, 2 * width)
        self.proj_out_2 = nn.Linear(width, output_dim)

    def _is_self(self, index: int) -> bool:
        return self.interleave_self_attention and index % 2 == 1

    def forward(self, x: Tensor, context: Tensor, steps: Tensor, kv_mask: Tensor | None = None) -> Tensor:
        """``x [B, T, width]`` tokens, ``context [B, S, cross_attention_dim]`` VL tokens, ``steps [B]`` → ``[B, T, output_dim]``."""
        temb = self.timestep_encoder(steps)
        for index, block in enumerate(self.transformer_blocks):
            # Self-attention blocks see the action-side tokens only, which have no padding.
            cross = not self._is_self(index)
            x = block(x, context if cross else None, kv_mask if cross else None, temb)
        shift, scale = self.proj_out_1(F.silu(temb)).chunk(2, dim=1)
        x = self.norm_out(x) * (1 + scale[:, None]) + shift[:, None]
        out: Tensor = self.proj_out_2(x)
        return out


class SelfAttentionTransformer(nn.Module):
    """Self-attention blocks (affine LayerNorms, no step conditioning) over the VL tokens."""

    def __init__(self, *, heads: int, head_dim: int, layers: int) -> None:
        super().__init__()
        width = heads * head_dim
        self.transformer_blocks = nn.ModuleList(
            [TransformerBlock(width, heads, head_dim, kv_width=width, adaptive=False) for _ in range(layers)]
        )

    def forward(self, x: Tensor, kv_mask: Tensor | None = None) -> Tensor:
        for block in self.transformer_blocks:
            x = block(x, None, kv_mask)
        return x


class CategorySpecificLinear(nn.Module):
    """``x [B, T, in]`` → ``x @ W[id] + b[id]`` with one ``W [in, out]`` and ``b [out]`` per category."""

    def __init__(self, categories: int, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.W = nn.Parameter(0.02 * torch.randn(categories, in_dim, out_dim))
        self.b = nn.Parameter(torch.zeros(categories, out_dim))

    def forward(self, x: Tensor, ids: Tensor) -> Tensor:
        return torch.bmm(x, self.W[ids]) + self.b[ids][:, None]


class CategorySpecificMLP(nn.Module):
    """Two category-specific linear layers with a ReLU between."""

    def __init__(self, categories: int, in_dim: int, hidden: int, out_dim: int) -> None:
        super().__init__()
        self.layer1 = CategorySpecificLinear(categories, in_dim, hidden)
        self.layer2 = CategorySpecificLinear(categories, hidden, out_dim)

    def forward(self, x: Tensor, ids: Tensor) -> Tensor:
        out: Tensor = self.layer2(F.relu(self.layer1(x, ids)), ids)
        return out


class MultiEmbodimentActionEncoder(nn.Module):
    """Noisy actions ``[B, T, action_dim]`` and the step ``[B]`` → tokens ``[B, T, width]``.

    ``W3(swish(W2([W1(actions), sincos(step)])))``, every layer category-specific.
    """

    def __init__(self, action_dim: int, width: int, categories: int) -> None:
        super().__init__()
        self.width = width
        self.W1 = CategorySpecificLinear(categories, action_dim, width)
        self.W2 = CategorySpecificLinear(categories, 2 * width, width)
        self.W3 = CategorySpecificLinear(categories, width, width)

    def forward(self, actions: Tensor, steps: Tensor, ids: Tensor) -> Tensor:
        emb = self.W1(actions, ids)
        tau = sinusoidal_encoding(steps[:, None].expand(-1, actions.shape[1]), self.width).to(emb.dtype)
        out: Tensor = self.W3(F.silu(self.W2(torch.cat([emb, tau], dim=-1), ids)), ids)
        return out
