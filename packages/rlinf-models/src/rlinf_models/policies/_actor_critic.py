"""Actor-critic policies over vectors or images with action chunks, discrete or continuous actions, and a value head."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from rlinf_core.protocols import EnvSpec, obs_len
from torch import nn
from torch.distributions import Categorical, Normal

from ._config import PolicyConfig
from ._encoders import TensorObs, build_encoder

__all__ = [
    "ACTIVATIONS",
    "ActorCritic",
    "PolicyConfig",
    "PolicyOutput",
    "build_encoder",
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
        forward_inputs: per-row tensors ``[N, ...]`` the training forward needs besides the observation and the
            actions (the flow policy's denoising chain); they travel with the rollout batch to the actor.
    """

    actions: torch.Tensor
    logprobs: torch.Tensor
    values: torch.Tensor
    forward_inputs: dict[str, torch.Tensor] | None = None


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


class ActorCritic(nn.Module):
    """Separate actor and critic networks over a shared observation encoder (see ``ObsEncoder``).

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

    def _features(self, obs: TensorObs) -> torch.Tensor:
        out: torch.Tensor = self.encoder(obs)
        return out

    def distribution(self, obs: TensorObs) -> Categorical | Normal:
        """The action distribution; batch shape ``[N, C]`` (discrete) or ``[N, C, D]`` (continuous)."""
        feat = self.actor_body(self._features(obs))
        out = self.actor_head(feat)
        n, c = out.shape[0], self.config.num_action_chunks
        if self.log_std is None:
            return Categorical(logits=out.view(n, c, -1))
        mean = out.view(n, c, self.spec.action_dim)
        return Normal(mean, self.log_std.exp().expand_as(mean))

    def value(self, obs: TensorObs) -> torch.Tensor:
        """State values ``[N, 1]`` (zeros without a value head)."""
        if self.value_head is None:
            return torch.zeros(obs_len(obs), 1, device=self.actor_head.weight.device)
        values: torch.Tensor = self.value_head(self.critic_body(self._features(obs)))
        return values

    def _per_dim(self, t: torch.Tensor) -> torch.Tensor:
        return t.unsqueeze(-1) if self.log_std is None else t

    @torch.no_grad()
    def act(self, obs: TensorObs, *, deterministic: bool = False) -> PolicyOutput:
        """Sample (or take the mode of) actions for ``obs`` ``[N, *obs_shape]``."""
        dist = self.distribution(obs)
        if deterministic:
            actions = dist.probs.argmax(-1) if isinstance(dist, Categorical) else dist.mean
        else:
            actions = dist.sample()  # type: ignore[no-untyped-call]  # torch.distributions is unannotated
        logprobs = dist.log_prob(actions)  # type: ignore[no-untyped-call]  # idem
        return PolicyOutput(actions, self._per_dim(logprobs), self.value(obs))

    def evaluate(
        self, obs: TensorObs, actions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Log-probs ``[N, C, D]``, entropy ``[N, C, D]`` and values ``[N, 1]`` of ``actions`` under the current policy."""
        dist = self.distribution(obs)
        logprobs = dist.log_prob(actions)  # type: ignore[no-untyped-call]  # torch.distributions is unannotated
        entropy = dist.entropy()  # type: ignore[no-untyped-call]  # idem
        return self._per_dim(logprobs), self._per_dim(entropy), self.value(obs)

    def imitation_loss(self, obs: TensorObs, actions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The behaviour-cloning loss of demonstrated action chunks (a scalar), averaged over the real steps.

        Continuous actions: with ``imitation_loss: mse`` the squared error of the mean (the deterministic
        action), averaged over the action dimensions; with ``nll`` the negative log-likelihood summed over the
        dimensions. Discrete actions: the negative log-likelihood (cross-entropy) of the demonstrated action.

        Args:
            obs: ``[B, *obs_shape]`` (or a dict of such).
            actions: ``[B, C, action_dim]`` demonstrated actions (``C = num_action_chunks``; discrete: the
                action index, float or int, with ``action_dim = 1``).
            mask: ``[B, C]``: true (or 1) for real steps, false for the padding past an episode's end.

        Raises:
            ValueError: when the shapes do not fit ``[B, C, action_dim]`` and ``[B, C]``.
        """
        chunks, dim = self.config.num_action_chunks, self.spec.action_dim
        if actions.dim() != 3 or actions.shape[1:] != (chunks, dim) or mask.shape != actions.shape[:2]:
            raise ValueError(
                f"imitation_loss: actions must be [B, {chunks}, {dim}] and mask [B, {chunks}]; got "
                f"{tuple(actions.shape)} and {tuple(mask.shape)}"
            )
        dist = self.distribution(obs)
        if isinstance(dist, Categorical):
            per_step = -dist.log_prob(actions[..., 0].long())  # type: ignore[no-untyped-call]  # unannotated
        elif self.config.imitation_loss == "nll":
            per_step = -dist.log_prob(actions).sum(-1)  # type: ignore[no-untyped-call]  # idem
        else:
            per_step = (dist.mean - actions).pow(2).mean(-1)
        weights = mask.to(per_step.dtype)
        loss: torch.Tensor = (per_step * weights).sum() / weights.sum().clamp(min=1.0)
        return loss

    def forward(
        self, obs: TensorObs, actions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Same as :meth:`evaluate` (so FSDP wraps the training forward)."""
        return self.evaluate(obs, actions)
