"""Observation encoders: vectors as they are, camera images through a CNN or an IMPALA ResNet, both together.

An encoder maps a batch of observations (one tensor, or a dict of named tensors; see
``rlinf_core.protocols.ObsSpec``) to one float feature vector per env. Images are ``[N, H, W, C]`` (channels last,
as simulators render them): uint8 colour is scaled to ``[0, 1]``, int16 depth (millimetres) to metres. Each
camera entry gets its own conv torso; the vector entries (proprioception) are concatenated after the image
features, in the order of the spec.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeAlias

import torch
from rlinf_core.protocols import EnvSpec, ObsSpec
from torch import nn
from torch.nn import functional as F

from ._config import PolicyConfig

__all__ = ["ObsEncoder", "TensorObs", "build_encoder", "random_shift"]

TensorObs: TypeAlias = "torch.Tensor | dict[str, torch.Tensor]"
"""A batch of observations as the policies take them: one tensor or a dict of named tensors."""


def _to_float(image: torch.Tensor) -> torch.Tensor:
    """``[N, H, W, C]`` uint8 colour or int16 depth → ``[N, C, H, W]`` float in ``[0, 1]`` / metres."""
    x = image.permute(0, 3, 1, 2)
    if image.dtype == torch.uint8:
        return x.float() / 255.0
    if image.dtype == torch.int16:
        return x.float() / 1000.0
    return x.float()


class NatureCNN(nn.Module):
    """The DQN/Atari conv torso (Mnih et al. 2015) for ``[N, H, W, C]`` images; needs ``H, W >= 36``."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(shape[2], 32, 8, stride=4),
            nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2),
            nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1),
            nn.ReLU(),
            nn.Flatten(),
        )

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(_to_float(image))
        return out


class _ResidualBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.conv1(F.relu(self.conv0(F.relu(x))))
        return out


class ImpalaResNet(nn.Module):
    """The IMPALA ResNet torso (Espeholt et al. 2018, https://arxiv.org/abs/1802.01561).

    Per stage: a 3x3 conv, 3x3 max-pool with stride 2, two residual blocks; channels ``(16, 32, 32)``. It trains
    from scratch far better than the Nature CNN on image-based control (DrQ, Procgen baselines use it).
    """

    def __init__(self, shape: tuple[int, ...], channels: tuple[int, ...] = (16, 32, 32)) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        inp = shape[2]
        for out in channels:
            layers += [
                nn.Conv2d(inp, out, 3, padding=1),
                nn.MaxPool2d(3, stride=2, padding=1),
                _ResidualBlock(out),
                _ResidualBlock(out),
            ]
            inp = out
        layers += [nn.ReLU(), nn.Flatten()]
        self.net = nn.Sequential(*layers)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(_to_float(image))
        return out


_TORSOS: dict[str, type[nn.Module]] = {"cnn": NatureCNN, "resnet": ImpalaResNet}


class _ImageEncoder(nn.Module):
    """A conv torso for one camera plus, with ``feature_dim``, a linear projection and ReLU."""

    def __init__(self, name: str, spec: ObsSpec, config: PolicyConfig) -> None:
        super().__init__()
        torso = _TORSOS[config.model_type](spec.shape)
        with torch.no_grad():
            width = int(torso(torch.zeros(1, *spec.shape, dtype=_TORCH_DTYPES[spec.dtype])).shape[1])
        self.torso = torso
        if config.image_feature_dim is None:
            self.proj: nn.Module = nn.Identity()
            self.out_dim = width
        else:
            self.proj = nn.Sequential(nn.Linear(width, config.image_feature_dim), nn.ReLU())
            self.out_dim = config.image_feature_dim
        self.name = name

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.proj(self.torso(image))
        return out


_TORCH_DTYPES = {"uint8": torch.uint8, "int16": torch.int16, "float32": torch.float32}


class ObsEncoder(nn.Module):
    """Features ``[N, out_dim]`` of an observation batch: image entries encoded, vector entries concatenated.

    Args:
        spec: the env's observation layout.
        config: ``actor.model``: ``model_type`` (``mlp`` and ``flow`` for vectors only; ``cnn``/``resnet`` for images),
            ``obs_keys`` (the dict entries the policy sees), ``image_feature_dim``.

    Raises:
        ValueError: naming the ``actor.model`` field when the observation does not fit the model type or an
            ``obs_keys`` entry is not in the observation.
    """

    def __init__(self, spec: EnvSpec, config: PolicyConfig) -> None:
        super().__init__()
        layout = spec.observation
        self.is_dict = isinstance(layout, Mapping)
        entries: dict[str, ObsSpec] = dict(layout) if isinstance(layout, Mapping) else {"obs": layout}
        if config.obs_keys is not None:
            if not self.is_dict:
                raise ValueError(
                    f"actor.model.obs_keys {list(config.obs_keys)}: the env's observation is one array, not a dict"
                )
            unknown = [k for k in config.obs_keys if k not in entries]
            if unknown:
                raise ValueError(
                    f"actor.model.obs_keys: {unknown} not in the observation; allowed: {', '.join(entries)}"
                )
            entries = {k: entries[k] for k in config.obs_keys}
        images = {k: s for k, s in entries.items() if s.is_image}
        vectors = {k: s for k, s in entries.items() if not s.is_image}
        odd = {k: s.shape for k, s in vectors.items() if len(s.shape) != 1}
        if odd:
            raise ValueError(f"observation entries must be vectors [D] or images [H, W, C], got {odd}")
        vector_only = config.model_type in ("mlp", "flow")
        if images and vector_only:
            raise ValueError(
                f"actor.model.model_type {config.model_type!r} cannot encode images {sorted(images)} "
                f"(shapes {[list(s.shape) for s in images.values()]}); choose 'cnn' or 'resnet'"
                + (", or leave the images out with actor.model.obs_keys" if self.is_dict else "")
            )
        if not images and not vector_only:
            raise ValueError(
                f"actor.model.model_type {config.model_type!r} needs image observations [H, W, C]; the policy sees "
                f"vectors only ({ {k: list(s.shape) for k, s in vectors.items()} }): choose 'mlp'"
            )
        if not images and not vectors:
            raise ValueError("actor.model.obs_keys selects no observation entry")
        self.image_keys = list(images)
        self.vector_keys = list(vectors)
        encoders = {k: _ImageEncoder(k, s, config) for k, s in images.items()}
        self.images = nn.ModuleDict(encoders)
        self.out_dim = sum(e.out_dim for e in encoders.values()) + sum(s.shape[0] for s in vectors.values())

    def forward(self, obs: TensorObs) -> torch.Tensor:
        if not self.is_dict:
            assert isinstance(obs, torch.Tensor), "the encoder was built for array observations"
            if self.image_keys:
                out: torch.Tensor = self.images["obs"](obs)
                return out
            return obs.float()
        assert isinstance(obs, Mapping), "the encoder was built for dict observations"
        parts = [self.images[k](obs[k]) for k in self.image_keys]
        parts += [obs[k].float() for k in self.vector_keys]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)


def build_encoder(spec: EnvSpec, config: PolicyConfig) -> tuple[ObsEncoder, int]:
    """The observation encoder of ``config`` for ``spec`` and its output width."""
    enc = ObsEncoder(spec, config)
    return enc, enc.out_dim


def random_shift(images: torch.Tensor, shifts: torch.Tensor, pad: int) -> torch.Tensor:
    """DrQ's augmentation: pad by ``pad`` (edge replicate), crop back at offset ``shifts`` (Kostrikov et al. 2020).

    Args:
        images: ``[N, H, W, C]`` (any dtype; uint8 stays uint8).
        shifts: ``[N, 2]`` integer offsets ``(dy, dx)`` in ``[0, 2 * pad]`` (``pad, pad``: the image unchanged).
        pad: the padding.

    Returns:
        ``[N, H, W, C]``: ``out[n, i, j] = images[n, clamp(i + dy - pad), clamp(j + dx - pad)]``.
    """
    n, h, w, _ = images.shape
    rows = (torch.arange(h, device=images.device)[None, :] + shifts[:, :1] - pad).clamp_(0, h - 1)
    cols = (torch.arange(w, device=images.device)[None, :] + shifts[:, 1:] - pad).clamp_(0, w - 1)
    batch = torch.arange(n, device=images.device)[:, None, None]
    return images[batch, rows[:, :, None], cols[:, None, :]]
