"""MLP and CNN actor-critic policies with action chunks, discrete or continuous actions, and a value head."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from rlinf_core.protocols import EnvSpec
from torch import nn
from torch.distributions import Categorical, Normal

from ._config import PolicyConfig

__all__ = [
    "ACTIVATIONS",
    "ActorCritic",
    "PolicyConfig",
    "PolicyOutput",
    "build_encoder",
    "build_policy",
    "mlp",
]

_DEFAULT_CONFIG = PolicyConfig()

ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": nn.Tanh, "relu": nn.ReLU, "gelu": nn.GELU}


@dataclass(frozen=True)
class PolicyOutput:
    """What a rollout step produces.

    Attributes:
        actions: ``[N, C]`` int64 (discrete) or ``[N, C, D]`` float32 (continuous).
        logprobs: ``[N, C, D]`` per-dimension log-probabilities (``D = 1`` for discrete).
        values: ``[N, 1]`` state values (zeros without a value head).
    """

    actions: torch.Tensor
    logprobs: torch.Tensor
    values: torch.Tensor


def _layer(inp: int, out: int, gain: float, ortho: bool) -> nn.Linear:
    layer = nn.Linear(inp, out)
    if ortho:
        nn.init.orthogonal_(layer.weight, gain)
        nn.init.zeros_(layer.bias)
    return layer


def mlp(inp: int, sizes: tuple[int, ...], act: type[nn.Module], ortho: bool) -> tuple[nn.Sequential, int]:
    """Hidden layers ``inp → sizes`` with activation ``act``; returns the stack and its output width."""
    layers: list[nn.Module] = []
    for size in sizes:
        layers += [_layer(inp, size, math.sqrt(2), ortho), act()]
        inp = size
    return nn.Sequential(*layers), inp


class _NatureCNN(nn.Module):
    """The DQN/Atari conv torso for ``[N, H, W, C]`` uint8 images."""

    def __init__(self, obs_shape: tuple[int, ...]) -> None:
        super().__init__()
        if len(obs_shape) != 3:
            raise ValueError(f"model_type 'cnn' needs [H, W, C] observations, got obs_shape {obs_shape}")
        channels = obs_shape[2]
        self.net = nn.Sequential(
            nn.Conv2d(channels, 32, 8, stride=4),
            nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2),
            nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1),
            nn.ReLU(),
            nn.Flatten(),
        )
        with torch.no_grad():
            self.out_dim = int(self.net(torch.zeros(1, channels, obs_shape[0], obs_shape[1])).shape[1])

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(obs.permute(0, 3, 1, 2).float() / 255.0)
        return out


def build_encoder(spec: EnvSpec, config: PolicyConfig) -> tuple[nn.Module, int]:
    """The observation encoder of ``config.model_type`` (the Nature CNN, or identity for vectors) and its width."""
    if config.model_type == "cnn":
        cnn = _NatureCNN(spec.obs_shape)
        return cnn, cnn.out_dim
    if len(spec.obs_shape) != 1:
        raise ValueError(f"model_type 'mlp' needs vector observations, got obs_shape {spec.obs_shape}")
    return nn.Identity(), spec.obs_shape[0]


class ActorCritic(nn.Module):
    """Separate actor and critic networks over a shared observation encoder (CNN) or raw vectors (MLP).

    Args:
        spec: observation and action description of the environment.
        config: architecture.
    """

    def __init__(self, spec: EnvSpec, config: PolicyConfig = _DEFAULT_CONFIG) -> None:
        super().__init__()
        if config.add_q_head:
            raise ValueError(
                "actor.model.add_q_head describes the off-policy SquashedGaussianPolicy, not an ActorCritic "
                "(build it with build_inference_policy)"
            )
        self.spec = spec
        self.config = config
        act = ACTIVATIONS[config.activation]
        chunks = config.num_action_chunks
        self.encoder, feat = build_encoder(spec, config)
        self.actor_body, out = mlp(feat, config.hidden_sizes, act, config.ortho_init)
        if spec.action_type == "discrete":
            if not spec.num_actions:
                raise ValueError("discrete EnvSpec needs num_actions")
            self.actor_head = _layer(out, chunks * spec.num_actions, 0.01, config.ortho_init)
            self.log_std = None
        else:
            self.actor_head = _layer(out, chunks * spec.action_dim, 0.01, config.ortho_init)
            self.log_std = nn.Parameter(torch.full((spec.action_dim,), float(config.init_log_std)))
        if config.add_value_head:
            self.critic_body, out = mlp(feat, config.hidden_sizes, act, config.ortho_init)
            self.value_head: nn.Module | None = _layer(out, 1, 1.0, config.ortho_init)
        else:
            self.value_head = None

    def _features(self, obs: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.encoder(obs if self.config.model_type == "cnn" else obs.float())
        return out

    def distribution(self, obs: torch.Tensor) -> Categorical | Normal:
        """The action distribution; batch shape ``[N, C]`` (discrete) or ``[N, C, D]`` (continuous)."""
        feat = self.actor_body(self._features(obs))
        out = self.actor_head(feat)
        n, c = out.shape[0], self.config.num_action_chunks
        if self.log_std is None:
            return Categorical(logits=out.view(n, c, -1))
        mean = out.view(n, c, self.spec.action_dim)
        return Normal(mean, self.log_std.exp().expand_as(mean))

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """State values ``[N, 1]`` (zeros without a value head)."""
        if self.value_head is None:
            return torch.zeros(obs.shape[0], 1, device=obs.device)
        values: torch.Tensor = self.value_head(self.critic_body(self._features(obs)))
        return values

    def _per_dim(self, t: torch.Tensor) -> torch.Tensor:
        return t.unsqueeze(-1) if self.log_std is None else t

    @torch.no_grad()
    def act(self, obs: torch.Tensor, *, deterministic: bool = False) -> PolicyOutput:
        """Sample (or take the mode of) actions for ``obs`` ``[N, *obs_shape]``."""
        dist = self.distribution(obs)
        if deterministic:
            actions = dist.probs.argmax(-1) if isinstance(dist, Categorical) else dist.mean
        else:
            actions = dist.sample()  # type: ignore[no-untyped-call]  # torch.distributions is unannotated
        logprobs = dist.log_prob(actions)  # type: ignore[no-untyped-call]  # idem
        return PolicyOutput(actions, self._per_dim(logprobs), self.value(obs))

    def evaluate(
        self, obs: torch.Tensor, actions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Log-probs ``[N, C, D]``, entropy ``[N, C, D]`` and values ``[N, 1]`` of ``actions`` under the current policy."""
        dist = self.distribution(obs)
        logprobs = dist.log_prob(actions)  # type: ignore[no-untyped-call]  # torch.distributions is unannotated
        entropy = dist.entropy()  # type: ignore[no-untyped-call]  # idem
        return self._per_dim(logprobs), self._per_dim(entropy), self.value(obs)

    def forward(
        self, obs: torch.Tensor, actions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Same as :meth:`evaluate` (so FSDP wraps the training forward)."""
        return self.evaluate(obs, actions)


def build_policy(spec: EnvSpec, config: PolicyConfig = _DEFAULT_CONFIG) -> ActorCritic:
    """Build the actor-critic policy described by ``config`` for an environment with ``spec``."""
    return ActorCritic(spec, config)
