"""The off-policy networks: a tanh-Gaussian policy (what the rollout runs) and an ensemble of Q heads.

Actions live in two spaces. The policy squashes a Gaussian sample ``u`` to ``tanh(u) ∈ [-1, 1]^D`` (the
*normalised* action, which the critics see and whose log-probability the losses use, as SB3 does) and scales it
to the env's bounds ``low + (tanh(u) + 1) / 2 · (high - low)`` for the env (what :meth:`SquashedGaussianPolicy.act`
returns and the replay buffer stores).
"""

from __future__ import annotations

import sys
from typing import cast

import torch
import torch.nn.functional as F
from rlinf_core.protocols import EnvSpec, obs_len
from torch import nn
from torch.distributions import Normal

from ._actor_critic import ACTIVATIONS, PolicyOutput, mlp
from ._config import PolicyConfig
from ._encoders import TensorObs, build_encoder

__all__ = ["BatchRenorm1d", "QEnsemble", "SquashedGaussianPolicy"]

LOG_STD_MIN = -20.0
"""Lower clamp of the policy's log standard deviation (SAC's and SB3's)."""
LOG_STD_MAX = 2.0
"""Upper clamp of the policy's log standard deviation."""
_TANH_EPS = 1e-6
"""Added inside ``log(1 - tanh(u)^2)`` of the squashing correction (SB3's epsilon)."""


def _bounds(spec: EnvSpec) -> tuple[torch.Tensor, torch.Tensor]:
    if spec.action_type != "continuous":
        raise ValueError(
            f"actor.model.add_q_head (off-policy SAC) needs continuous actions, the env has {spec.action_type!r}"
        )
    dim = spec.action_dim
    low = torch.tensor(spec.action_low if spec.action_low is not None else (-1.0,) * dim, dtype=torch.float32)
    high = torch.tensor(
        spec.action_high if spec.action_high is not None else (1.0,) * dim, dtype=torch.float32
    )
    if not (torch.isfinite(low).all() and torch.isfinite(high).all()):
        raise ValueError(f"off-policy SAC needs finite action bounds, the env has low={low} high={high}")
    return low, high


class BoundedActionPolicy(nn.Module):
    """What SAC's actors share: actions normalised to ``[-1, 1]`` by ``tanh``, mapped to the env's bounds.

    A subclass implements ``sample(obs, *, deterministic, noise) -> (actions [N, C, D], log-probs [N, C, D])``
    in the normalised space; this class adds the env mapping, acting, the warm-up's random actions and the
    (zero) state values.

    Args:
        spec: the env (continuous actions with finite bounds).
        config: ``actor.model``.
    """

    action_scale: torch.Tensor
    action_bias: torch.Tensor

    def __init__(self, spec: EnvSpec, config: PolicyConfig) -> None:
        super().__init__()
        self.spec = spec
        self.config = config
        low, high = _bounds(spec)
        self.register_buffer("action_scale", (high - low) / 2.0)
        self.register_buffer("action_bias", (high + low) / 2.0)
        self.chunks = config.num_action_chunks

    def sample(
        self, obs: TensorObs, *, deterministic: bool = False, noise: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Normalised actions ``[N, C, D]`` and their per-dimension log-probs (with autograd)."""
        raise NotImplementedError

    def to_env(self, action: torch.Tensor) -> torch.Tensor:
        """Normalised ``[-1, 1]`` actions → env units."""
        return action * self.action_scale + self.action_bias

    def from_env(self, action: torch.Tensor) -> torch.Tensor:
        """Env-unit actions → normalised ``[-1, 1]`` (the critics' input)."""
        return ((action.float() - self.action_bias) / self.action_scale).clamp(-1.0, 1.0)

    @torch.no_grad()
    def act(self, obs: TensorObs, *, deterministic: bool = False) -> PolicyOutput:
        """Env-unit actions ``[N, C, D]`` for ``obs``, their log-probs, and zero values ``[N, 1]`` (no V head)."""
        action, logp = self.sample(obs, deterministic=deterministic)
        return PolicyOutput(self.to_env(action), logp, self.value(obs))

    @torch.no_grad()
    def random_actions(self, n: int) -> torch.Tensor:
        """``[n, C, D]`` actions uniform over the action bounds (warm-up), from torch's global generator."""
        u = torch.rand(n, self.chunks, self.spec.action_dim) * 2.0 - 1.0
        return self.to_env(u.to(self.action_scale.device))

    def value(self, obs: TensorObs) -> torch.Tensor:
        """Zeros ``[N, 1]``: the off-policy actor has no state-value head (its critics are Q functions)."""
        return torch.zeros(obs_len(obs), 1, device=self.action_scale.device)

    def forward(
        self, obs: TensorObs, *, deterministic: bool = False, noise: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Same as :meth:`sample` (what a trainer calls: FSDP2 gathers the weights around ``forward``)."""
        return self.sample(obs, deterministic=deterministic, noise=noise)


class SquashedGaussianPolicy(BoundedActionPolicy):
    """A state-dependent Gaussian squashed by ``tanh`` and scaled to the action bounds (SAC's actor).

    Args:
        spec: the env (continuous actions with finite bounds).
        config: ``actor.model`` (encoder ``model_type``, ``hidden_sizes``, ``activation``, ``num_action_chunks``).
    """

    def __init__(self, spec: EnvSpec, config: PolicyConfig) -> None:
        super().__init__(spec, config)
        self.encoder, feat = build_encoder(spec, config)
        self.body, out = mlp(feat, config.hidden_sizes, ACTIVATIONS[config.activation], config.ortho_init)
        self.head = nn.Linear(out, 2 * self.chunks * spec.action_dim)

    def _mean_log_std(self, obs: TensorObs) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.head(self.body(self.encoder(obs))).view(obs_len(obs), self.chunks, 2, self.spec.action_dim)
        return out[:, :, 0], out[:, :, 1].clamp(LOG_STD_MIN, LOG_STD_MAX)

    def sample(
        self, obs: TensorObs, *, deterministic: bool = False, noise: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Normalised actions ``[N, C, D]`` in ``[-1, 1]`` and their per-dimension log-probs ``[N, C, D]``.

        Reparameterised (``rsample``), so gradients flow from the actions and log-probs into the policy.
        ``deterministic`` takes ``tanh(mean)`` (its log-prob is then that of the mean). ``noise`` ``[N, C, D]``
        is the standard-normal draw to use (``u = mean + std · noise``) instead of a fresh one: data-parallel
        trainers draw it for the whole batch on every rank and each takes its rows.
        """
        mean, log_std = self._mean_log_std(obs)
        dist = Normal(mean, log_std.exp())  # validated: a diverged policy (NaN mean) stops with an error
        if deterministic:
            u = mean
        elif noise is not None:
            u = mean + log_std.exp() * noise
        else:
            u = dist.rsample()
        action = torch.tanh(u)
        logp = dist.log_prob(u)  # type: ignore[no-untyped-call]  # torch.distributions is unannotated
        logp = logp - torch.log(1.0 - action.pow(2) + _TANH_EPS)
        return action, logp


class BatchRenorm1d(nn.Module):
    """Batch renormalisation (Ioffe 2017) over ``[N, F]`` features, as CrossQ's critics use it.

    Training normalises with the batch statistics corrected towards the running ones by ``r`` (clipped to
    ``[1/r_max, r_max]``) and ``d`` (clipped to ``[-d_max, d_max]``); for the first ``warmup_steps`` updates it is
    plain batch norm (``r = 1``, ``d = 0``). Evaluation uses the running statistics.

    Args:
        num_features: ``F``.
        momentum: update rate of the running statistics.
        eps: added to the variance.
        r_max: clip of the scale correction.
        d_max: clip of the shift correction.
        warmup_steps: training forwards before the corrections apply.
    """

    running_mean: torch.Tensor
    running_var: torch.Tensor
    steps: torch.Tensor

    def __init__(
        self,
        num_features: int,
        *,
        momentum: float = 0.01,
        eps: float = 1e-3,
        r_max: float = 3.0,
        d_max: float = 5.0,
        warmup_steps: int = 1000,
    ) -> None:
        super().__init__()
        self.momentum, self.eps, self.r_max, self.d_max = momentum, eps, r_max, d_max
        self.warmup_steps = warmup_steps
        self.weight = nn.Parameter(torch.ones(num_features))
        self.bias = nn.Parameter(torch.zeros(num_features))
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise ``x`` ``[N, F]``."""
        running_mean, running_var = self.running_mean, self.running_var
        if not self.training:
            out = (x - running_mean) / torch.sqrt(running_var + self.eps)
            return out * self.weight + self.bias
        mean = x.mean(0)
        var = x.var(0, unbiased=False)
        std = torch.sqrt(var + self.eps)
        out = (x - mean) / std
        steps = self.steps
        if int(steps) >= self.warmup_steps:
            running_std = torch.sqrt(running_var + self.eps)
            r = (std.detach() / running_std).clamp(1.0 / self.r_max, self.r_max)
            d = ((mean.detach() - running_mean) / running_std).clamp(-self.d_max, self.d_max)
            out = out * r + d
        with torch.no_grad():
            running_mean.lerp_(mean.detach(), self.momentum)
            running_var.lerp_(var.detach(), self.momentum)
            steps.add_(1)
        return out * self.weight + self.bias


def _is_fsdp_unit(module: nn.Module) -> bool:
    """Whether FSDP2 sharded ``module`` (never, if FSDP was never imported: the import is not paid for here)."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    return fsdp is not None and isinstance(module, fsdp.FSDPModule)


class QEnsemble(nn.Module):
    """``H`` independent Q heads ``Q_h(s, a)`` over normalised chunk actions, with their own encoder.

    Each head is its own ``nn.Sequential`` (``heads.{h}.{i}.weight``, the checkpoint layout). With
    :attr:`batched_heads` set, plain MLP heads (no ``q_layer_norm``, no batch renormalisation, two heads or
    more) are computed as one batched network: the first layers of all heads as one matrix product over their
    stacked weights, every further layer as one batched product (``baddbmm``), the same math as the loop over
    the heads. It is off by default: on one CPU thread the batched products measured slower than the loop
    (HalfCheetah's 2 x 256-unit heads). Heads sharded by FSDP2 (each head its own unit) are always looped.

    Args:
        spec: the env.
        config: ``actor.model`` (``num_q_heads``, ``q_hidden_sizes``, ``q_layer_norm``, encoder, activation).
        batch_renorm: CrossQ's critics: batch renormalisation before each hidden layer (and on the input).
    """

    def __init__(self, spec: EnvSpec, config: PolicyConfig, *, batch_renorm: bool = False) -> None:
        super().__init__()
        self.config = config
        self.encoder, feat = build_encoder(spec, config)
        act = ACTIVATIONS[config.activation]
        sizes = config.q_hidden_sizes or config.hidden_sizes
        inp = feat + config.num_action_chunks * spec.action_dim
        self.heads = nn.ModuleList()
        for _ in range(config.num_q_heads):
            layers: list[nn.Module] = []
            width = inp
            if batch_renorm:
                layers.append(BatchRenorm1d(width))
            for size in sizes:
                layers.append(nn.Linear(width, size))
                if config.q_layer_norm:
                    layers.append(nn.LayerNorm(size))
                layers.append(act())
                if batch_renorm:
                    layers.append(BatchRenorm1d(size))
                width = size
            layers.append(nn.Linear(width, 1))
            self.heads.append(nn.Sequential(*layers))
        self._batchable = config.num_q_heads > 1 and not (batch_renorm or config.q_layer_norm)
        self.batched_heads = False
        """Compute plain MLP heads as one batched network (``False``, the default: loop over the heads)."""

    def forward(self, obs: TensorObs, actions: torch.Tensor) -> torch.Tensor:
        """Q-values ``[N, H]`` of ``obs`` and normalised actions ``[N, C, D]`` (or ``[N, C*D]``)."""
        inp = torch.cat([self.encoder(obs), actions.reshape(actions.shape[0], -1)], dim=-1)
        if self.batched_heads and self._batchable and not _is_fsdp_unit(self.heads[0]):
            return self._batched(inp)
        return torch.cat([head(inp) for head in self.heads], dim=-1)

    def _batched(self, inp: torch.Tensor) -> torch.Tensor:
        """The plain MLP heads on ``inp`` ``[N, F]`` as one network: ``[N, H]``."""
        layers = [list(cast(nn.Sequential, head)) for head in self.heads]  # [Linear, act, ..., Linear] each
        linears = [[m for m in head if isinstance(m, nn.Linear)] for head in layers]
        act = layers[0][1] if len(layers[0]) > 1 else nn.Identity()
        first = [head[0] for head in linears]
        x = F.linear(inp, torch.cat([m.weight for m in first]), torch.cat([m.bias for m in first]))
        depth = len(linears[0])
        if depth > 1:
            x = act(x)
        x = x.view(inp.shape[0], len(first), -1).transpose(0, 1)  # [H, N, width]
        for i in range(1, depth):
            weight = torch.stack([head[i].weight for head in linears]).transpose(1, 2)  # [H, in, out]
            bias = torch.stack([head[i].bias for head in linears]).unsqueeze(1)  # [H, 1, out]
            x = torch.baddbmm(bias, x, weight)
            if i < depth - 1:
                x = act(x)
        return x.squeeze(-1).transpose(0, 1)
