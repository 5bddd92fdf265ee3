"""``PolicyConfig``: the policy architecture (config ``actor.model``); importing it does not import torch."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import attrs
from attrs import validators as v

from .._lora_config import LoraShape

__all__ = [
    "PRETRAINED_SUBDIR",
    "VLA_MODEL_TYPES",
    "PolicyConfig",
    "checkpoint_weights_file",
    "vla_checkpoint_directory",
]

VLA_MODEL_TYPES = ("pi0", "pi05", "smolvla", "gr00t", "openvla", "openvla_oft")
"""``model_type`` values that load a vision-language-action checkpoint (``model_path``): flow policies, and
``openvla`` / ``openvla_oft`` (action tokens)."""

OPENVLA_MODEL_TYPES = ("openvla", "openvla_oft")
"""``model_type`` values of OpenVLA checkpoints (the published layout, ``unnorm_key``, ``gripper_action``)."""


def checkpoint_weights_file(path: str | Path) -> Path:
    """The policy weights of a checkpoint: ``path`` itself when it names a ``.pt`` file, else ``<path>/actor/model.pt``.

    ``path`` is a ``global_step_<N>`` directory as the embodied runners (and the SFT runner) write it, or its
    ``actor/model.pt``.
    """
    p = Path(path)
    return p if p.suffix == ".pt" else p / "actor" / "model.pt"


PRETRAINED_SUBDIR = "pretrained"
"""Where the SFT runner and the embodied PPO/GRPO actor export a VLA policy in its adapter's published layout,
next to ``actor/`` in ``global_step_<N>`` (``config.json``, the weights, the tokenizer and the normalisation
statistics)."""


def vla_checkpoint_directory(path: str | Path) -> Path:
    """The VLA checkpoint directory ``actor.model.model_path`` names.

    ``path`` itself when it holds a ``config.json`` (a published checkpoint, or an export), else its
    ``pretrained/`` export when ``path`` is a ``global_step_<N>`` checkpoint of the SFT runner or of an embodied
    PPO/GRPO run of a VLA.

    Raises:
        FileNotFoundError: naming ``actor.model.model_path`` when ``path`` has neither layout.
    """
    p = Path(path)
    if (p / "config.json").is_file():
        return p
    if (p / PRETRAINED_SUBDIR / "config.json").is_file():
        return p / PRETRAINED_SUBDIR
    if checkpoint_weights_file(p).is_file():
        raise FileNotFoundError(
            f"actor.model.model_path: {p} is a checkpoint with only actor/model.pt and no {PRETRAINED_SUBDIR}/ "
            "export; a VLA needs its published checkpoint directory (config.json and weights) or a "
            f"global_step_<N> of sft.py or of a VLA's PPO/GRPO run, which write {PRETRAINED_SUBDIR}/ (docs/sft.md)"
        )
    raise FileNotFoundError(
        f"actor.model.model_path: {p} is neither a VLA checkpoint directory (no config.json) nor a "
        f"global_step_<N> checkpoint of sft.py or of a VLA's PPO/GRPO run (no {PRETRAINED_SUBDIR}/config.json)"
    )


def _non_empty_or_none(_inst: object, attr: attrs.Attribute[Any], value: str | None) -> None:
    if value is not None and not value.strip():
        raise ValueError(f"'{attr.name}' must be a checkpoint path or null, got an empty string")


def _positive_or_none(_inst: object, attr: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and value < 1:
        raise ValueError(f"'{attr.name}' must be >= 1 or null: {value}")


@attrs.frozen(kw_only=True)
class PolicyConfig(LoraShape):
    """Policy architecture (config ``actor.model``)."""

    model_type: Literal[
        "mlp", "cnn", "resnet", "flow", "pi0", "pi05", "smolvla", "gr00t", "openvla", "openvla_oft"
    ] = "mlp"
    """Observation encoder: ``mlp`` (vectors only), ``cnn`` (the Nature CNN per camera) or ``resnet`` (the IMPALA
    ResNet per camera) for ``[H, W, C]`` images, with any vector entries (proprioception) concatenated.
    ``flow``: the flow-matching policy over vectors (an MLP velocity field; docs/flow_policy.md), for
    continuous actions and on-policy losses. ``pi0`` / ``pi05``: the π0 / π0.5 vision-language-action model of
    the checkpoint directory ``model_path`` as a flow policy (docs/vla.md, "RL fine-tuning of π0/π0.5"); the
    encoder, MLP and flow-architecture keys do not apply to it. ``smolvla``: the same for a SmolVLA checkpoint
    (docs/vla.md, "SmolVLA"); the ``pi0`` / ``pi05`` keys below apply to it, with SmolVLM2's tokenizer and
    LeRobot's mean/std statistics file, and LoRA on the text model and the action expert. ``gr00t``: the
    same for a GR00T N1.5 checkpoint directory in the published layout (docs/vla.md, "GR00T N1.5"):
    Eagle's tokenizer, the checkpoint's ``experiment_cfg/metadata.json`` statistics of ``embodiment_tag``
    (``norm_stats_path: null``), ``denoising_steps`` its ``num_inference_timesteps``, LoRA on the Qwen3 text
    model and the action head's transformers. ``openvla``: the
    OpenVLA checkpoint directory ``model_path`` (the published layout, its tokenizer and ``norm_stats`` inside)
    as a discrete-token policy (docs/vla.md, "OpenVLA"): one camera, one action of ``action_dim`` tokens per
    step (``num_action_chunks: 1``), per-token log-probabilities (``algorithm.logprob_type`` ``action_level``
    sums them), LoRA on the Llama layers; the flow and ``norm_stats_path`` / ``state_key`` keys do not apply.
    ``openvla_oft``: an OpenVLA-OFT checkpoint directory (OpenVLA's layout plus OFT's optional
    ``action_head--*`` / ``proprio_projector--*`` files; docs/vla.md, "OpenVLA-OFT"): the keys of ``openvla``,
    but a chunk of ``num_action_chunks`` actions (> 1 allowed; OFT's LIBERO models: 8) decoded in one forward
    pass, one or more cameras (``image_keys``), and ``state_key`` as the proprio token when the checkpoint has
    a proprio projector; deterministic actions come from its L1 regression head when it has one."""
    obs_keys: tuple[str, ...] | None = None
    """Dict observations: the entries the policy sees, e.g. ``[rgb, state]`` (``null``: all of them). Leave out
    what the policy must not see (privileged simulator state) or cannot encode (images for an ``mlp``)."""
    image_feature_dim: int | None = attrs.field(default=256, validator=_positive_or_none)
    """Width of the linear projection (and ReLU) after each camera's conv torso (``null``: the flat conv output)."""
    image_aug: Literal["none", "random_shift"] = "none"
    """Off-policy training: DrQ's random-shift augmentation of the sampled images (observation and next
    observation shifted independently); the rollout always sees the images as rendered."""
    image_aug_pad: int = attrs.field(default=4, validator=v.ge(1))
    """Pixels of the random shift (DrQ: 4 for 84x84 images)."""
    hidden_sizes: tuple[int, ...] = attrs.field(default=(64, 64), validator=v.deep_iterable(v.gt(0)))
    """Widths of the hidden layers of the actor and critic MLPs."""
    activation: Literal["tanh", "relu", "gelu"] = "tanh"
    """Non-linearity between the hidden layers."""
    num_action_chunks: int = attrs.field(default=1, validator=v.ge(1))
    """Actions emitted per observation (executed open-loop by the env)."""
    add_value_head: bool = True
    """A critic head (needed for GAE / actor_critic losses)."""
    init_log_std: float = 0.0
    """Initial log standard deviation of continuous actions (state-independent)."""
    ortho_init: bool = True
    """Orthogonal initialisation as in CleanRL / SB3 PPO."""
    denoising_steps: int = attrs.field(default=4, validator=v.ge(1))
    """``flow``, ``pi0``, ``pi05``: Euler steps from noise to an action chunk."""
    noise_method: Literal["flow_sde", "flow_noise"] = "flow_sde"
    """``flow``, ``pi0``, ``pi05``: how training rollouts explore and what the log-probability is. ``flow_sde``
    (πRL's Flow-SDE): the ODE turned into an SDE with the same marginals, stochastic steps of std
    ``noise_level·sqrt(t/(1-t))·sqrt(δ)``; ``flow_noise`` (πRL's Flow-Noise): the ODE steps plus Gaussian noise
    whose std a learned noise head predicts."""
    noise_level: float = attrs.field(default=0.5, validator=v.gt(0))
    """``flow_sde``: the noise level ``a`` scaling the SDE's diffusion (larger: more exploration)."""
    noise_logvar_range: tuple[float, float] = (0.08, 0.16)
    """``flow_noise``: ``[min_std, max_std]`` of the learned noise head's standard deviation (RLinf's key name)."""
    joint_logprob: bool | None = None
    """``flow``, ``pi0``, ``pi05``: ``true``: every denoising step is stochastic and the log-probability is the
    whole chain's; ``false``: one step per sample, drawn at random, is (πRL's hybrid ODE-SDE sampling). ``null``:
    ``false`` for ``flow_sde``, ``true`` for ``flow_noise``, as in πRL."""
    time_embed_dim: int = attrs.field(default=16, validator=v.ge(2))
    """``flow``: width of the sinusoidal embedding of the denoising time (even)."""
    flow_velocity: Literal["mlp", "gated"] = "mlp"
    """``flow``: how the network gives the velocity. ``mlp``: an MLP's output. ``gated``: SAC Flow's Flow-G
    (arXiv 2509.25756): a sigmoid gate ``g`` and a candidate ``ĥ`` (two heads on the same MLP body) make the
    Euler step ``x + δ·g⊙(ĥ - x)``, a GRU-style update that keeps the gradients through the K-step sampler
    bounded (recommended with ``add_q_head``)."""
    add_q_head: bool = False
    """Off-policy actor-critic (``algorithm.loss_type: embodied_sac``): a tanh-Gaussian policy with a state-dependent
    std, scaled to the action bounds, plus Q heads that only the actor trains; needs ``add_value_head: false``.
    With ``model_type: flow`` the actor is the flow policy instead (SAC-Flow, docs/flow_policy.md): its
    ``denoising_steps``-step chain, every step stochastic (``noise_method``), squashed by tanh."""
    num_q_heads: int = attrs.field(default=2, validator=v.ge(1))
    """Q heads of the off-policy critic ensemble (2: twin Q; RLPD uses 10)."""
    q_hidden_sizes: tuple[int, ...] | None = None
    """Widths of each Q head's hidden layers (``null``: ``hidden_sizes``)."""
    q_layer_norm: bool = False
    """LayerNorm after each hidden layer of the Q heads (RLPD)."""
    imitation_loss: Literal["mse", "nll"] = "mse"
    """Supervised fine-tuning of a Gaussian policy (``imitation_loss``): ``mse`` regresses the mean (the
    deterministic action) on the demonstrated actions, ``nll`` maximises their log-likelihood (trains the std
    too). Discrete actions always use the negative log-likelihood (cross-entropy)."""
    model_path: str | None = attrs.field(default=None, validator=_non_empty_or_none)
    """Pretrained weights a fresh run starts from: a checkpoint directory (``.../global_step_<N>``, as the
    embodied and SFT runners write it) or its ``actor/model.pt``. A resume (``runner.resume_dir``) takes
    precedence. Shapes must match this architecture; heads the file lacks (e.g. the value head of an SFT
    checkpoint) keep their fresh initialisation and entries this policy lacks are ignored (both logged).
    ``pi0`` / ``pi05`` (required): the model's directory in LeRobot's layout (``config.json`` +
    ``model.safetensors``, read with ``rlinf_models.pi0.load_pi0``); it also defines the architecture, so a
    resumed run reads it too (then loads the checkpoint's weights over it). Every VLA ``model_type`` also
    accepts a ``global_step_<N>`` checkpoint of ``sft.py``: its ``pretrained/`` export is read."""
    tokenizer_path: str | None = attrs.field(default=None, validator=_non_empty_or_none)
    """``pi0`` / ``pi05`` (required): the directory of PaliGemma's tokenizer (``tokenizer.json`` & co.).
    ``openvla``: the Llama tokenizer's directory; ``null``: ``model_path`` (where the published checkpoints keep it)."""
    norm_stats_path: str | None = attrs.field(default=None, validator=_non_empty_or_none)
    """``pi0`` / ``pi05`` (required): the state/action normalisation statistics the model was trained with:
    openpi's ``norm_stats.json`` (entries ``state``, ``actions``) or LeRobot's
    ``policy_preprocessor_*_normalizer_processor.safetensors`` (``observation.state``, ``action``). π0 uses
    mean/std, π0.5 the 1%/99% quantiles."""
    image_keys: tuple[str, ...] | None = None
    """``pi0`` / ``pi05``: the observation's camera entries, in the model's image-slot order (LIBERO:
    ``[rgb, wrist_rgb]``: third-person view, then wrist); ``null``: every image entry of the observation in
    its order."""
    state_key: str = "state"
    """``pi0`` / ``pi05``: the observation's proprioceptive vector entry (the model's state, normalised with
    ``norm_stats_path``). ``openvla_oft`` with a proprio projector: the same entry, normalised with the
    checkpoint's ``proprio`` quantiles."""
    embodiment_tag: str | None = attrs.field(default=None, validator=_non_empty_or_none)
    """``gr00t``: the embodiment of the checkpoint's statistics and category-specific weights (GR00T's tag,
    e.g. ``new_embodiment``); ``null``: the only tag of its ``experiment_cfg/metadata.json``."""
    is_lora: bool = False
    """``pi0`` / ``pi05``: train LoRA adapters (peft) on the ``lora_target_modules`` of the two Gemma towers (the
    PaliGemma language model and the action expert) instead of the whole backbone. Every other backbone weight
    (those towers' base weights, SigLIP, the projector, the embeddings) is frozen; the action/state projections,
    time MLPs and the value and noise heads train fully. What the rollout receives is ``lora_sync``'s choice."""
    lora_target_modules: tuple[str, ...] = attrs.field(
        default=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
        converter=tuple,
        validator=v.min_len(1),
    )
    """Names (last component) of the Gemma towers' linear layers that get adapters (default: every attention and
    MLP projection). Layers of the same name in the SigLIP vision tower are not adapted."""
    lora_sync: Literal["merged", "adapters"] = attrs.field(
        default="merged", validator=v.in_(("merged", "adapters"))
    )
    """With ``is_lora``: what the actor sends the rollout after each update. ``merged``: the whole model with the
    adapters folded in (``W + (lora_alpha / lora_rank) B A``), and the rollout runs the plain model.
    ``adapters``: only the tensors that train (the LoRA ``A`` / ``B`` and the fully trained projections and
    heads); the rollout builds the same adapted policy on ``model_path``'s base weights once, at start-up, and
    runs it as the actor does, so its log-probabilities are the actor's (docs/vla.md, "LoRA")."""
    unnorm_key: str | None = attrs.field(default=None, validator=_non_empty_or_none)
    """``openvla``: the dataset of the checkpoint's ``norm_stats`` whose action quantiles un-normalise the
    decoded actions (OpenVLA's ``unnorm_key``, e.g. ``libero_spatial_no_noops``); ``null``: the only one."""
    temperature: float = attrs.field(default=1.0, validator=v.gt(0.0))
    """``openvla``: the temperature of the action tokens' distribution the training rollouts sample from and the
    actor's log-probabilities are taken under (RLinf's ``rollout.sampling_params.temperature_train``);
    evaluation rollouts take the most likely token."""
    gripper_action: Literal["raw", "binary_inverted"] = "raw"
    """``openvla``: how the last action dimension reaches the env. ``raw``: as un-normalised. ``binary_inverted``:
    OpenVLA's gripper (1 open, 0 closed) as robosuite's (-1 open, +1 closed), ``-sign(2g - 1)``, as OpenVLA's
    LIBERO evaluation and RLinf's ``prepare_actions_for_libero`` do."""

    @property
    def flow_joint_logprob(self) -> bool:
        """``joint_logprob`` with ``null`` resolved by ``noise_method``."""
        return self.noise_method == "flow_noise" if self.joint_logprob is None else self.joint_logprob

    @property
    def is_vla(self) -> bool:
        """``model_type`` is a vision-language-action checkpoint (:data:`VLA_MODEL_TYPES`) read from ``model_path``."""
        return self.model_type in VLA_MODEL_TYPES

    def _check_openvla(self) -> None:
        if self.model_path is None:
            raise ValueError(
                f"model_type {self.model_type!r} needs model_path: the checkpoint directory (docs/vla.md, "
                '"OpenVLA")'
            )
        if self.norm_stats_path is not None:
            raise ValueError(
                f"norm_stats_path does not apply to model_type {self.model_type!r} (its statistics are the "
                "checkpoint's norm_stats, chosen by unnorm_key): set it to null"
            )
        if self.num_action_chunks != 1 and self.model_type == "openvla":
            raise ValueError(
                f"num_action_chunks must be 1 for model_type 'openvla' (one action per step), got "
                f"{self.num_action_chunks}"
            )

    def _vla_required_keys(self) -> tuple[str, ...]:
        """The path keys a VLA ``model_type`` needs (``gr00t`` reads its checkpoint's statistics by default)."""
        if self.model_type == "gr00t":
            return ("model_path", "tokenizer_path")
        return ("model_path", "tokenizer_path", "norm_stats_path")

    def _check_embodiment_tag(self) -> None:
        if self.embodiment_tag is not None and self.model_type != "gr00t":
            raise ValueError(
                f"embodiment_tag belongs to model_type 'gr00t', not {self.model_type!r}: set embodiment_tag: null"
            )

    def __attrs_post_init__(self) -> None:
        if self.is_vla and self.add_q_head:
            raise ValueError(
                f"model_type {self.model_type!r} is trained on-policy (PPO/GRPO) and has no Q heads: set "
                "add_q_head: false"
            )
        if self.model_type == "flow" and self.add_q_head and self.joint_logprob is False:
            raise ValueError(
                "joint_logprob: false (one stochastic step per chain) is on-policy only; SAC-Flow "
                "(model_type 'flow' with add_q_head) makes every step stochastic: set joint_logprob to true or null"
            )
        if self.flow_velocity != "mlp" and self.model_type != "flow":
            raise ValueError(
                f"flow_velocity {self.flow_velocity!r} applies to model_type 'flow', not {self.model_type!r}: "
                "set flow_velocity: mlp"
            )
        if self.lora_sync != "merged" and not self.is_lora:
            raise ValueError(
                f"lora_sync {self.lora_sync!r} sends LoRA adapters and needs is_lora: true; without adapters "
                "set lora_sync: merged (allowed: 'merged', 'adapters')"
            )
        if self.model_type in OPENVLA_MODEL_TYPES:
            self._check_openvla()
        elif self.is_vla:
            missing = [name for name in self._vla_required_keys() if getattr(self, name) is None]
            if missing:
                raise ValueError(
                    f"model_type {self.model_type!r} needs {', '.join(missing)}: the checkpoint directory, "
                    "the tokenizer directory and the normalisation statistics (docs/vla.md)"
                )
        elif self.is_lora:
            raise ValueError(
                f"is_lora trains adapters on a VLA backbone (model_type 'pi0' / 'pi05'), not {self.model_type!r}: "
                "set is_lora: false"
            )
        elif self.tokenizer_path is not None or self.norm_stats_path is not None:
            raise ValueError(
                f"tokenizer_path and norm_stats_path belong to model_type 'pi0' / 'pi05', not {self.model_type!r}: "
                "set them to null"
            )
        if self.model_type not in OPENVLA_MODEL_TYPES and (
            self.unnorm_key is not None or self.gripper_action != "raw"
        ):
            raise ValueError(
                f"unnorm_key and gripper_action belong to model_type 'openvla' / 'openvla_oft', not "
                f"{self.model_type!r}: set unnorm_key: null and gripper_action: raw"
            )
        self._check_embodiment_tag()
        low, high = self.noise_logvar_range
        if not 0 < low <= high:
            raise ValueError(
                f"noise_logvar_range must be [min_std, max_std] with 0 < min <= max, got {[low, high]}"
            )
        if self.time_embed_dim % 2:
            raise ValueError(
                f"time_embed_dim must be even (sine and cosine halves), got {self.time_embed_dim}"
            )
        if self.add_q_head and self.add_value_head:
            raise ValueError("add_q_head and add_value_head exclude each other: set add_value_head: false")
        if self.q_hidden_sizes is not None and (
            not self.q_hidden_sizes or any(size <= 0 for size in self.q_hidden_sizes)
        ):
            raise ValueError(
                f"q_hidden_sizes must be null or positive widths, got {list(self.q_hidden_sizes)}"
            )
