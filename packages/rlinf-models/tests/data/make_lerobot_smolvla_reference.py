"""Regenerate ``lerobot_smolvla_tiny/`` (and its ``_fewer_experts`` sibling) with LeRobot's own SmolVLA (not a test).

LeRobot cannot join RLinf's lock (it pins torch<2.12, transformers<5.6, Python>=3.12), so this runs in a
throwaway environment, e.g.::

    uv venv -p 3.12 /tmp/lr && VIRTUAL_ENV=/tmp/lr uv pip install "lerobot[smolvla]==0.6.1" "torch==2.10.0"
    /tmp/lr/bin/python make_lerobot_smolvla_reference.py .

LeRobot builds SmolVLA's VLM from the Hub config of ``vlm_model_name`` (``AutoConfig`` / ``AutoProcessor``), which
cannot be downloaded here: both are patched to return a tiny ``SmolVLMConfig`` (a Llama text model and a SmolVLM
vision tower of the same structure as SmolVLM2-500M's, a few thousand parameters) and a stand-in processor; with
``load_vlm_weights=False`` LeRobot then builds ``SmolVLMForConditionalGeneration`` from that config, truncates
its text model to ``num_vlm_layers`` and builds the action expert exactly as it does for the published model.
Every parameter is filled with random values. Each directory gets:

- ``ckpt/``: ``SmolVLAPolicy.save_pretrained`` (``config.json`` + ``model.safetensors``, LeRobot's layout), with
  an extra ``rlinf_architecture`` entry holding the tiny VLM config, and LeRobot's normalizer statistics file;
- ``reference.safetensors``: fixed inputs and LeRobot's per-element training loss and sampled actions;
- ``normalized.safetensors``: raw state/action and LeRobot's mean/std normalisation of them;
- ``images.safetensors``: raw non-square images in ``[0, 1]`` and ``SmolVLAPolicy.prepare_images`` of them.
"""

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
from lerobot.configs.types import FeatureType, NormalizationMode, PolicyFeature
from lerobot.lerobot_types import TransitionKey
from lerobot.policies.smolvla import smolvlm_with_expert
from lerobot.policies.smolvla.configuration_smolvla import SmolVLAConfig
from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy
from lerobot.processor import NormalizerProcessorStep
from safetensors.torch import save_file
from transformers import SmolVLMConfig

# Six text layers, of which SmolVLA keeps the first num_vlm_layers (4).
TEXT = {
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "vocab_size": 64,
    "rms_norm_eps": 1e-5,
}
VISION = {
    "hidden_size": 16,
    "intermediate_size": 24,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "patch_size": 8,
    "image_size": 32,
}
SCALE_FACTOR = 2  # 16 patches -> 4 image tokens per camera
IMAGE = 32


def _vlm_config() -> SmolVLMConfig:
    return SmolVLMConfig(text_config=dict(TEXT), vision_config=dict(VISION), scale_factor=SCALE_FACTOR)


class _Processor:
    """What SmolVLA reads from the VLM's processor: the two image token ids (unused unless add_image_special_tokens)."""

    tokenizer = SimpleNamespace(
        fake_image_token_id=TEXT["vocab_size"] - 2, global_image_token_id=TEXT["vocab_size"] - 1
    )


def main(root: Path) -> None:
    smolvlm_with_expert.AutoConfig.from_pretrained = staticmethod(lambda *_a, **_k: _vlm_config())
    smolvlm_with_expert.AutoProcessor.from_pretrained = staticmethod(lambda *_a, **_k: _Processor())
    _write(root / "lerobot_smolvla_tiny", num_expert_layers=-1, self_attn_every_n_layers=2)
    # Half as many expert layers as VLM layers (expert layer i runs beside VLM layer 2i), all cross-attention:
    # LeRobot only builds consistent shapes for this combination when no layer is a self-attention one.
    _write(root / "lerobot_smolvla_tiny_fewer_experts", num_expert_layers=2, self_attn_every_n_layers=0)


def _write(out: Path, *, num_expert_layers: int, self_attn_every_n_layers: int) -> None:
    out.mkdir(exist_ok=True)
    torch.manual_seed(0)
    visual = PolicyFeature(FeatureType.VISUAL, (3, IMAGE, IMAGE))
    config = SmolVLAConfig(
        chunk_size=4,
        n_action_steps=4,
        max_state_dim=8,
        max_action_dim=8,
        resize_imgs_with_padding=(IMAGE, IMAGE),
        tokenizer_max_length=6,
        num_steps=3,
        num_vlm_layers=4,
        num_expert_layers=num_expert_layers,
        self_attn_every_n_layers=self_attn_every_n_layers,
        expert_width_multiplier=0.75,
        vlm_model_name="tiny-smolvlm",
        load_vlm_weights=False,
        device="cpu",
        input_features={
            "observation.images.base": visual,
            "observation.images.wrist": visual,
            "observation.state": PolicyFeature(FeatureType.STATE, (5,)),
        },
        output_features={"action": PolicyFeature(FeatureType.ACTION, (7,))},
    )
    policy = SmolVLAPolicy(config)
    with torch.no_grad():  # random everything, norms included, so that no tensor goes unchecked
        for param in policy.parameters():
            param.copy_(torch.randn_like(param) * 0.2)
    policy.eval()
    ckpt = out / "ckpt"
    policy.save_pretrained(ckpt)
    data = json.loads((ckpt / "config.json").read_text())
    data["rlinf_architecture"] = {"vlm_config": _vlm_config().to_diff_dict()}
    (ckpt / "config.json").write_text(json.dumps(data, indent=4) + "\n")

    g = torch.Generator().manual_seed(1)
    images = torch.rand(2, 2, 3, IMAGE, IMAGE, generator=g) * 2 - 1  # [B, camera, 3, H, W] in [-1, 1]
    image_masks = torch.tensor([[True, True], [True, False]])  # the second sample lacks its wrist camera
    tokens = torch.randint(0, TEXT["vocab_size"], (2, 6), generator=g)
    token_mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    state, actions = torch.randn(2, 8, generator=g), torch.randn(2, 4, 8, generator=g)
    noise, time = torch.randn(2, 4, 8, generator=g), torch.tensor([0.3, 0.9])
    cams, masks = list(images.unbind(1)), list(image_masks.unbind(1))
    model = policy.model
    with torch.no_grad():
        losses = model.forward(cams, masks, tokens, token_mask, state, actions, noise, time)
        sampled = model.sample_actions(cams, masks, tokens, token_mask, state, noise=noise.clone())
    save_file(
        {
            "images": images,
            "image_masks": image_masks,
            "tokens": tokens,
            "token_mask": token_mask,
            "state": state,
            "actions": actions,
            "noise": noise,
            "time": time,
            "losses": losses,
            "sampled": sampled,
        },
        str(out / "reference.safetensors"),
    )

    raw = torch.rand(2, 3, 20, 28, generator=g)  # non-square: resized to 32 x 22, padded on the top
    prepared, _ = policy.prepare_images(
        {"observation.images.base": raw, "observation.images.wrist": raw.flip(-1)}
    )
    save_file({"raw": raw, "base": prepared[0], "wrist": prepared[1]}, str(out / "images.safetensors"))

    gs = torch.Generator().manual_seed(2)
    stats = {
        feature: {"mean": torch.randn(dim, generator=gs), "std": torch.rand(dim, generator=gs) + 0.5}
        for feature, dim in (("observation.state", 5), ("action", 7))
    }
    normalizer = NormalizerProcessorStep(
        features={**config.input_features, **config.output_features},
        norm_map={
            FeatureType.STATE: NormalizationMode.MEAN_STD,
            FeatureType.ACTION: NormalizationMode.MEAN_STD,
        },
        stats=stats,
    )
    save_file(
        normalizer.state_dict(), str(ckpt / "policy_preprocessor_step_5_normalizer_processor.safetensors")
    )
    raw_state, raw_action = torch.randn(3, 5, generator=gs), torch.randn(3, 7, generator=gs)
    done = normalizer(
        {TransitionKey.OBSERVATION: {"observation.state": raw_state}, TransitionKey.ACTION: raw_action}
    )
    save_file(
        {
            "raw_state": raw_state,
            "raw_action": raw_action,
            "state": done[TransitionKey.OBSERVATION]["observation.state"],
            "action": done[TransitionKey.ACTION],
        },
        str(out / "normalized.safetensors"),
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
