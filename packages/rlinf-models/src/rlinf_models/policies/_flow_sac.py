"""``FlowSACPolicy``: the flow-matching policy as SAC's actor (SAC-Flow, arXiv 2509.25756).

The actor samples by running the flow policy's K-step chain with every step stochastic (Flow-SDE or
Flow-Noise: the paper's noise-augmented rollout) from standard-normal draws it is given, then squashes the
chain's end with ``tanh`` and scales it to the action bounds, as :class:`~rlinf_models.policies.
SquashedGaussianPolicy` does. Given the draws, the action is a differentiable function of the velocity network
(the sampler is back-propagated through like a recurrent network; ``flow_velocity: gated`` is the paper's
Flow-G), and its log-probability is the noisy chain's:

``log π(a|s) = log N(x_0; 0, I) + Σ_k log N(x_{k+1}; μ_k(x_k), std_k²) - log(1 - tanh(x_K)² + ε)``

per action element, which is what RLinf's ``JaxFlowTActor`` returns. The joint density of the chain stands in
for the (intractable) marginal density of the action in the entropy terms of the SAC losses.
"""

from __future__ import annotations

import torch
from rlinf_core.protocols import EnvSpec

from ..flow import chain_log_prob, gaussian_log_prob, rsample_chain
from ._config import PolicyConfig
from ._encoders import TensorObs
from ._flow import FlowPolicy
from ._sac import _TANH_EPS, BoundedActionPolicy

__all__ = ["FlowSACPolicy"]


class FlowSACPolicy(BoundedActionPolicy):
    """A tanh-squashed flow-matching policy with reparameterised chains (SAC-Flow's actor).

    Same interface as :class:`~rlinf_models.policies.SquashedGaussianPolicy` (``sample``/``forward`` give
    normalised actions and per-element log-probs with autograd, ``act`` env-unit actions, ``to_env``,
    ``from_env``, ``random_actions``, ``value``); ``noise_shape`` is ``(K + 1, C, D)``: the initial point and
    one draw per denoising step.

    Args:
        spec: the env (continuous actions with finite bounds).
        config: ``actor.model`` with ``model_type: flow`` and ``add_q_head: true`` (``denoising_steps``,
            ``noise_method``, ``noise_level``, ``noise_logvar_range``, ``flow_velocity``, the MLP keys).
    """

    def __init__(self, spec: EnvSpec, config: PolicyConfig) -> None:
        super().__init__(spec, config)
        self.flow = FlowPolicy(spec, config)
        self.noise_shape = (config.denoising_steps + 1, self.chunks, spec.action_dim)
        """Shape of one row of the standard-normal draws :meth:`sample` takes."""

    def _chain(self, features: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.config
        out = rsample_chain(
            self.flow.field, features, noise, noise_method=cfg.noise_method, noise_level=cfg.noise_level
        )
        return out.chain, out.logprobs

    def _squash(
        self, x: torch.Tensor, x0: torch.Tensor, logp: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        action = torch.tanh(x)
        start = gaussian_log_prob(x0, torch.zeros_like(x0), torch.ones_like(x0))
        return action, start + logp - torch.log(1.0 - action.pow(2) + _TANH_EPS)

    def sample_chain(
        self, obs: TensorObs, *, noise: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Normalised actions ``[N, C, D]``, their log-probs ``[N, C, D]`` and the chain ``[N, K+1, C, D]``.

        ``noise`` ``[N, K+1, C, D]``: the standard-normal draws (default: fresh ones from the global generator).
        """
        features = self.flow._features(obs)
        if noise is None:
            noise = torch.randn(
                features.shape[0], *self.noise_shape, dtype=features.dtype, device=features.device
            )
        chain, logp = self._chain(features, noise.to(features.dtype))
        action, logp = self._squash(chain[:, -1], chain[:, 0], logp)
        return action, logp, chain

    def sample(
        self, obs: TensorObs, *, deterministic: bool = False, noise: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Normalised actions ``[N, C, D]`` in ``[-1, 1]`` and their per-element log-probs ``[N, C, D]``.

        Reparameterised: gradients flow from both through the whole chain into the velocity (and noise)
        network. ``deterministic``: the ODE from the zero point, squashed (log-probs 0: no density).
        """
        if not deterministic:
            action, logp, _ = self.sample_chain(obs, noise=noise)
            return action, logp
        features = self.flow._features(obs)
        zeros = torch.zeros(
            features.shape[0], *self.noise_shape, dtype=features.dtype, device=features.device
        )
        out = rsample_chain(self.flow.field, features, zeros, noise_method="flow_ode")
        return torch.tanh(out.actions), torch.zeros_like(out.actions)

    def log_prob(self, obs: TensorObs, chain: torch.Tensor) -> torch.Tensor:
        """Log-probs ``[N, C, D]`` of stored chains ``[N, K+1, C, D]`` (:meth:`sample_chain`) under the current weights.

        The same formula as :meth:`sample`, recomputed with :func:`rlinf_models.flow.chain_log_prob` (every
        step stochastic).
        """
        features = self.flow._features(obs)
        chain = chain.to(features.dtype)
        mask = torch.ones(chain.shape[0], chain.shape[1] - 1, dtype=torch.bool, device=chain.device)
        cfg = self.config
        steps, _ = chain_log_prob(
            self.flow.field, features, chain, mask, noise_method=cfg.noise_method, noise_level=cfg.noise_level
        )
        _, logp = self._squash(chain[:, -1], chain[:, 0], steps)
        return logp
