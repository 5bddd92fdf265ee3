"""``FlowPolicy``: a flow-matching actor (an MLP velocity field over action chunks) with a PPO critic.

It is the small-problem counterpart of a VLA's flow-matching action expert, trained with πRL's Flow-SDE or
Flow-Noise log-probabilities (see :mod:`rlinf_models.flow` and docs/flow_policy.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from rlinf_core.protocols import EnvSpec, obs_len
from torch import nn

from ..flow import FlowSample, chain_log_prob, flow_matching_loss, sample_chain, select_denoise_steps
from ._actor_critic import ACTIVATIONS, PolicyOutput, mlp
from ._config import PolicyConfig
from ._encoders import TensorObs, build_encoder

__all__ = ["FORWARD_INPUT_KEYS", "FlowPolicy", "require_chain", "sinusoidal_time_embedding"]

FORWARD_INPUT_KEYS = ("chains", "denoise_mask")
"""What :meth:`FlowPolicy.act` returns in ``PolicyOutput.forward_inputs`` and :meth:`FlowPolicy.evaluate` needs:
``chains [N, K+1, C, D]`` (the denoising chain, initial noise first) and ``denoise_mask [N, K]`` (its stochastic
steps)."""


def require_chain(forward_inputs: Mapping[str, torch.Tensor] | None, who: str) -> Mapping[str, torch.Tensor]:
    """``forward_inputs`` when it holds the chain (:data:`FORWARD_INPUT_KEYS`), else a ValueError naming ``who``."""
    if forward_inputs is None or any(k not in forward_inputs for k in FORWARD_INPUT_KEYS):
        have = None if forward_inputs is None else sorted(forward_inputs)
        raise ValueError(
            f"{who}'s log-probability needs the rollout's forward_inputs {list(FORWARD_INPUT_KEYS)}, got {have}"
        )
    return forward_inputs


def sinusoidal_time_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    """``[B]`` times in ``[0, 1]`` → ``[B, dim]`` sines and cosines of periods from 4e-3 to 4 (openpi's range)."""
    half = dim // 2
    fraction = torch.linspace(0.0, 1.0, half, dtype=t.dtype, device=t.device)
    period = 4e-3 * (4.0 / 4e-3) ** fraction
    angle = 2 * math.pi * t[:, None] / period[None, :]
    return torch.cat([torch.sin(angle), torch.cos(angle)], dim=-1)


def _head(inp: int, out: int, gain: float) -> nn.Linear:
    layer = nn.Linear(inp, out)
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


def sample_policy_chain(
    field: Any,
    cond: Any,
    shape: tuple[int, int, int],
    cfg: PolicyConfig,
    *,
    deterministic: bool,
    generator: torch.Generator | None,
    dtype: torch.dtype = torch.float32,
    device: Any = None,
) -> FlowSample:
    """The denoising chain of a flow policy's ``act`` for chunks of ``shape`` (``actor.model``'s chain settings).

    ``deterministic``: the ODE from zero noise (no stochastic step). Otherwise Gaussian noise, the stochastic
    steps chosen per sample (``select_denoise_steps``) and ``cfg.noise_method`` / ``noise_level``.
    """
    if deterministic:
        noise = torch.zeros(shape, dtype=dtype, device=device)
        return sample_chain(field, cond, noise, num_steps=cfg.denoising_steps, noise_method="flow_ode")
    noise = torch.randn(shape, generator=generator, dtype=dtype, device=device)
    mask = select_denoise_steps(
        shape[0], cfg.denoising_steps, joint=cfg.flow_joint_logprob, device=device, generator=generator
    )
    return sample_chain(
        field,
        cond,
        noise,
        num_steps=cfg.denoising_steps,
        noise_method=cfg.noise_method,
        noise_level=cfg.noise_level,
        denoise_mask=mask,
        generator=generator,
    )


class FlowPolicy(nn.Module):
    """A flow-matching actor and an optional value head over a vector observation encoder.

    The velocity network is an MLP over ``(observation features, x_t flattened, time embedding)`` with
    ``hidden_sizes`` (``flow_velocity: gated``: SAC Flow's gated Flow-G velocity on the same body); for
    ``noise_method: flow_noise`` a second MLP of the same inputs predicts the per-element noise std, squashed
    into ``noise_logvar_range``. The value head is an MLP over the observation features.

    Same interface as :class:`~rlinf_models.policies.ActorCritic` (``act``, ``value``, ``evaluate``), except that
    ``act`` also returns the denoising chain (``PolicyOutput.forward_inputs``) and ``evaluate`` needs it back.

    Args:
        spec: the environment; continuous actions only.
        config: ``actor.model`` with ``model_type: flow``.

    Raises:
        ValueError: naming ``actor.model`` when the env has discrete actions.
    """

    def __init__(self, spec: EnvSpec, config: PolicyConfig) -> None:
        super().__init__()
        if spec.action_type != "continuous":
            raise ValueError(
                f"actor.model.model_type 'flow' needs continuous actions; the env's are {spec.action_type!r} "
                "(choose model_type 'mlp')"
            )
        self.spec = spec
        self.config = config
        act = ACTIVATIONS[config.activation]
        self.chunks = config.num_action_chunks
        self.action_dim = spec.action_dim
        flat = self.chunks * self.action_dim
        self.encoder, feat = build_encoder(spec, config)
        inp = feat + flat + config.time_embed_dim
        self.velocity_body, out = mlp(inp, config.hidden_sizes, act, config.ortho_init)
        self.velocity_head = _head(out, flat, 0.01)
        self.gate_head: nn.Module | None = None
        if config.flow_velocity == "gated":
            # Flow-G: the gate of a GRU-style step on the velocity MLP's features (velocity_head is the candidate)
            self.gate_head = _head(out, flat, 0.01)
        self.noise_body: nn.Module | None = None
        self.noise_head: nn.Module | None = None
        if config.noise_method == "flow_noise":
            self.noise_body, out = mlp(inp, config.hidden_sizes, act, config.ortho_init)
            self.noise_head = _head(out, flat, 0.01)
        low, high = config.noise_logvar_range
        self.log_std_low, self.log_std_high = math.log(low), math.log(high)
        self.value_head: nn.Module | None = None
        if config.add_value_head:
            self.critic_body, out = mlp(feat, config.hidden_sizes, act, config.ortho_init)
            self.value_head = _head(out, 1, 1.0)

    # ------------------------------------------------------------------------------- the velocity field
    def field(
        self, x_t: torch.Tensor, t: torch.Tensor, features: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The :data:`~rlinf_models.flow.VelocityField`: velocity (and Flow-Noise std) ``[B, C, D]`` at ``x_t``, ``t``."""
        b = x_t.shape[0]
        inp = torch.cat(
            [features, x_t.reshape(b, -1), sinusoidal_time_embedding(t, self.config.time_embed_dim)], dim=-1
        )
        hidden = self.velocity_body(inp)
        velocity = self.velocity_head(hidden).view_as(x_t)
        if self.gate_head is not None:
            # Flow-G (SAC Flow, arXiv 2509.25756): the Euler step x - δ·v becomes x + δ·g⊙(ĥ - x) with the gate
            # g = sigmoid(...) and the candidate ĥ, i.e. v = g⊙(x - ĥ) in this module's time direction.
            gate = torch.sigmoid(self.gate_head(hidden)).view_as(x_t)
            velocity = gate * (x_t - velocity)
        if self.noise_body is None or self.noise_head is None:
            return velocity, None
        # tanh squashes the head's output into [log min_std, log max_std].
        raw = torch.tanh(self.noise_head(self.noise_body(inp))).view_as(x_t)
        low, high = self.log_std_low, self.log_std_high
        return velocity, torch.exp(low + (high - low) * (raw + 1) / 2)

    def _features(self, obs: TensorObs) -> torch.Tensor:
        out: torch.Tensor = self.encoder(obs).to(self.velocity_head.weight.dtype)
        return out

    # ------------------------------------------------------------------------------------ the policy
    def value(self, obs: TensorObs) -> torch.Tensor:
        """State values ``[N, 1]`` (zeros without a value head)."""
        if self.value_head is None:
            return torch.zeros(obs_len(obs), 1, device=self.velocity_head.weight.device)
        values: torch.Tensor = self.value_head(self.critic_body(self._features(obs)))
        return values

    @torch.no_grad()
    def act(
        self, obs: TensorObs, *, deterministic: bool = False, generator: torch.Generator | None = None
    ) -> PolicyOutput:
        """Sample action chunks ``[N, C, D]`` for ``obs``, with their chain log-probs ``[N, C, D]`` and the chain.

        ``deterministic``: the ODE from zero noise (the image of the noise distribution's mode). Its chain has no
        stochastic step: log-probs 0, at rollout and in :meth:`evaluate`.
        """
        features = self._features(obs)
        n = features.shape[0]
        cfg = self.config
        shape = (n, self.chunks, self.action_dim)
        out = sample_policy_chain(
            self.field,
            features,
            shape,
            cfg,
            deterministic=deterministic,
            generator=generator,
            dtype=features.dtype,
            device=features.device,
        )
        return PolicyOutput(
            out.actions,
            out.logprobs,
            self.value(obs),
            forward_inputs={"chains": out.chain, "denoise_mask": out.denoise_mask},
        )

    def evaluate(
        self, obs: TensorObs, actions: torch.Tensor, forward_inputs: Mapping[str, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Log-probs ``[N, C, D]``, entropy ``[N, C, D]`` and values ``[N, 1]`` of the rollout's chains.

        ``actions`` are the chains' ends; the log-probability is the chain's (see :func:`rlinf_models.flow.
        chain_log_prob`), recomputed from ``forward_inputs`` as :meth:`act` returned it. The entropy is the mean
        Gaussian entropy of the stochastic steps: zero-gradient for Flow-SDE (its std does not depend on the
        weights), the noise head's for Flow-Noise.

        Raises:
            ValueError: without ``forward_inputs`` (the rollout batch lost the chain).
        """
        forward_inputs = require_chain(forward_inputs, "the flow policy")
        features = self._features(obs)
        chains = forward_inputs["chains"].to(features.dtype)
        logprobs, entropy = chain_log_prob(
            self.field,
            features,
            chains,
            forward_inputs["denoise_mask"],
            noise_method=self.config.noise_method,
            noise_level=self.config.noise_level,
        )
        return logprobs, entropy, self.value(obs)

    def forward(
        self, obs: TensorObs, actions: torch.Tensor, forward_inputs: Mapping[str, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Same as :meth:`evaluate` (so FSDP wraps the training forward)."""
        return self.evaluate(obs, actions, forward_inputs)

    def imitation_loss(self, obs: TensorObs, actions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The flow-matching loss (scalar) of demonstrated chunks ``actions [B, C, D]`` where ``mask [B, C]``."""
        return flow_matching_loss(
            self.field, self._features(obs), actions.to(self.velocity_head.weight.dtype), mask
        )
