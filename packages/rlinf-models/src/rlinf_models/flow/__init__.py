"""Flow-matching action chunks: sampling, log-probabilities for RL (πRL's Flow-SDE and Flow-Noise), SFT loss.

Independent of any network: everything takes a *velocity field*

```python
def field(x_t: Tensor, t: Tensor, cond: Any) -> tuple[Tensor, Tensor | None]:
    # x_t [B, C, D] the noisy action chunk, t [B] its time in [0, 1], cond: what the network conditions on
    # (observation features, a VLM prefix's key/value cache, ...), passed through untouched.
    return velocity, noise_std  # both [B, C, D]; noise_std only for Flow-Noise (else None)
```

Time runs as in openpi: ``x_t = t·ε + (1 - t)·a`` joins the action chunk ``a`` (``t = 0``) to Gaussian noise
``ε`` (``t = 1``), the target velocity is ``ε - a``, and sampling integrates from ``t = 1`` to ``t = 0`` in
``K`` Euler steps at times ``t_k = 1 - k/K``. The chain ``x_0 (noise), x_1, ..., x_K (actions)`` is recorded.

- :func:`sample_chain` with ``noise_method="flow_ode"``: the deterministic ODE (inference, evaluation).
- ``flow_sde`` (πRL, Flow-SDE): step ``k`` is the Gaussian ``N(μ_k, σ_k²·δ)`` of the Euler-Maruyama step of the
  SDE with the ODE's marginals, ``σ_k = a·sqrt(t_k / (1 - t_k))`` (``a``: the noise level). Usually only one
  step per chain, drawn at random, is stochastic (:func:`select_denoise_steps`, ``joint=False``).
- ``flow_noise`` (πRL, Flow-Noise): the ODE mean with a std the field predicts (a learned noise head);
  usually every step is stochastic (``joint=True``).
- :func:`chain_log_prob` recomputes, from a stored chain and its ``denoise_mask``, the log-probability
  ``Σ_k log N(x_{k+1}; μ_k, std_k²)`` over the stochastic steps (per action element ``[B, C, D]``; sum over
  ``C``/``D`` as the loss's ``logprob_type`` says). With the same weights it equals :class:`FlowSample`'s
  ``logprobs`` from the rollout. It also returns the transitions' Gaussian entropy (non-zero for Flow-Noise:
  Flow-SDE's std is fixed, its entropy carries no gradient).
- :func:`rsample_chain`: the chain as a differentiable function of given draws (every step stochastic), for
  SAC-Flow's reparameterised actor loss.
- :func:`flow_matching_loss`: the conditional flow-matching regression for supervised fine-tuning.

docs/flow_policy.md has the derivation and the choices in our words.
"""

from ._chain import (
    NOISE_METHODS,
    FlowSample,
    NoiseMethod,
    VelocityField,
    chain_log_prob,
    flow_matching_loss,
    gaussian_entropy,
    gaussian_log_prob,
    rsample_chain,
    sample_chain,
    sample_flow_times,
    sde_sigmas,
    select_denoise_steps,
    step_mean_std,
    timesteps,
)

__all__ = [
    "NOISE_METHODS",
    "FlowSample",
    "NoiseMethod",
    "VelocityField",
    "chain_log_prob",
    "flow_matching_loss",
    "gaussian_entropy",
    "gaussian_log_prob",
    "rsample_chain",
    "sample_chain",
    "sample_flow_times",
    "sde_sigmas",
    "select_denoise_steps",
    "step_mean_std",
    "timesteps",
]
