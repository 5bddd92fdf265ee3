"""Regenerate ``lerobot_gr00t_tiny/`` with LeRobot's own GR00T N1.5 (``GR00TN15``, not a test).

LeRobot cannot join RLinf's lock (it pins old torch/transformers), so this runs in a throwaway environment
with ``lerobot==0.4.4`` and its ``groot`` extra's packages, e.g.::

    uv venv -p 3.11 /tmp/lerobot-venv && VIRTUAL_ENV=/tmp/lerobot-venv uv pip install "lerobot==0.4.4" \
        diffusers "transformers>=4.57.1,<4.58" "peft>=0.13,<0.18" "dm-tree>=0.1.8"
    /tmp/lerobot-venv/bin/python make_lerobot_gr00t_reference.py .

LeRobot builds GR00T's Eagle backbone from NVIDIA's Eagle config and processor files on the Hub
(``lerobot/eagle2hg-processor-groot-n1p5``), which cannot be downloaded here: ``ensure_eagle_cache_ready`` is
skipped, ``AutoConfig.from_pretrained`` returns a tiny ``Eagle25VLConfig`` of the published structure (a SigLIP
vision tower, one linear projector without pixel shuffle, a Qwen3 text model, as ``eagle_er-qwen3_1_7B-Siglip2_
400M_..._1mlp_nops``) and ``AutoModel.from_config`` builds LeRobot's vendored ``Eagle25VLForConditionalGeneration``
from it. Eagle asks for flash-attention 2 (its config's default, and forced on the vision tower), which has no
CPU kernel: SDPA is used instead (the same attention). LeRobot's ``GR00TN15`` then truncates the text model to ``select_layer`` and
builds the action head exactly as for the published model; every parameter is filled with random values and the
model runs in eval mode. The directory gets:

- ``model.safetensors``: ``GR00TN15.state_dict()`` (the published key names) and ``config.json``'s
  ``backbone_cfg`` / ``action_head_cfg``;
- ``reference.safetensors``: fixed Eagle inputs (pixels, prompt ids with the image placeholders), state,
  actions, embodiment ids, the training noise and time, and LeRobot's outputs: the backbone features, the
  predicted velocity on the training input, the loss, the initial sampling noise and ``get_action``'s actions.

``lerobot_gr00t_n15_shapes.json`` is the name and shape of every tensor of LeRobot's ``GR00TN15`` built at the
published size (on the meta device, from ``nvidia/GR00T-N1.5-3B``'s ``backbone_cfg`` / ``action_head_cfg`` and
the Eagle sizes of :data:`PUBLISHED_EAGLE`, the ones ``rlinf_models.gr00t`` has built in).
"""

import json
import sys
from pathlib import Path

import torch
from lerobot.policies.groot import groot_n1
from lerobot.policies.groot.action_head import flow_matching_action_head as fm
from lerobot.policies.groot.eagle2_hg_model import modeling_eagle2_5_vl as eagle
from lerobot.policies.groot.eagle2_hg_model.configuration_eagle2_5_vl import Eagle25VLConfig
from safetensors.torch import save_file

IMAGE_TOKEN = 103  # the last id of the 104-token vocabulary
EAGLE = {  # rlinf_models.gr00t.testing.TINY_GR00T's Eagle
    "vision_config": {
        "model_type": "siglip_vision_model",
        "hidden_size": 16,
        "intermediate_size": 24,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "patch_size": 8,
        "image_size": 32,
        "layer_norm_eps": 1e-6,
        "hidden_act": "gelu_pytorch_tanh",
    },
    "text_config": {
        "architectures": ["Qwen3ForCausalLM"],
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "vocab_size": 104,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000.0,
        "max_position_embeddings": 512,
        "tie_word_embeddings": True,
        "hidden_act": "silu",
        "attention_bias": False,
    },
    "force_image_size": 32,
    "select_layer": -1,
    "use_pixel_shuffle": False,
    "mlp_connector_layers": 1,
    "image_token_index": IMAGE_TOKEN,
    "_attn_implementation": "sdpa",  # the config's default, flash-attention 2, has no CPU kernel
}
BACKBONE = {"select_layer": 2, "project_to_dim": None, "tune_llm": False, "tune_visual": True}
HEAD = {  # TINY_GR00T's action head with 4 embodiments (a smaller fixture)
    "action_dim": 8,
    "action_horizon": 8,
    "add_pos_embed": True,
    "backbone_embedding_dim": 32,
    "diffusion_model_cfg": {
        "attention_head_dim": 8,
        "cross_attention_dim": 32,
        "dropout": 0.2,
        "final_dropout": True,
        "interleave_self_attention": True,
        "norm_type": "ada_norm",
        "num_attention_heads": 4,
        "num_layers": 2,
        "output_dim": 24,
        "positional_embeddings": None,
    },
    "hidden_size": 24,
    "input_embedding_dim": 32,
    "max_action_dim": 8,
    "max_state_dim": 8,
    "max_num_embodiments": 4,
    "max_seq_len": 16,
    "noise_beta_alpha": 1.5,
    "noise_beta_beta": 1.0,
    "noise_s": 0.999,
    "num_inference_timesteps": 4,
    "num_target_vision_tokens": 4,
    "num_timestep_buckets": 1000,
    "tune_diffusion_model": True,
    "tune_projector": True,
    "use_vlln": True,
    "vl_self_attention_cfg": {
        "attention_head_dim": 8,
        "dropout": 0.2,
        "final_dropout": True,
        "num_attention_heads": 4,
        "num_layers": 1,
        "positional_embeddings": None,
    },
}
BATCH, CAMERAS, IMAGE_TOKENS = 2, 2, 16


def _siglip_with_sdpa(config):
    config._attn_implementation = "sdpa"
    return _SIGLIP(config)


_SIGLIP = eagle.SiglipVisionModel


PUBLISHED_EAGLE = {  # Qwen3-1.7B and SigLIP-so400m/14 at 224, one linear projector (rlinf_models.gr00t's built-in)
    "vision_config": {
        "model_type": "siglip_vision_model",
        "hidden_size": 1152,
        "intermediate_size": 4304,
        "num_hidden_layers": 27,
        "num_attention_heads": 16,
        "patch_size": 14,
        "image_size": 224,
        "layer_norm_eps": 1e-6,
        "hidden_act": "gelu_pytorch_tanh",
    },
    "text_config": {
        "architectures": ["Qwen3ForCausalLM"],
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 151_936,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000.0,
        "max_position_embeddings": 40_960,
        "tie_word_embeddings": True,
    },
    "force_image_size": 224,
    "select_layer": -1,
    "use_pixel_shuffle": False,
    "mlp_connector_layers": 1,
    "image_token_index": 151_669,
    "_attn_implementation": "sdpa",
}
PUBLISHED_HEAD = {  # nvidia/GR00T-N1.5-3B's config.json action_head_cfg (max_num_embodiments: its default)
    "action_dim": 32,
    "action_horizon": 16,
    "add_pos_embed": True,
    "backbone_embedding_dim": 2048,
    "diffusion_model_cfg": {
        "attention_head_dim": 48,
        "cross_attention_dim": 2048,
        "dropout": 0.2,
        "final_dropout": True,
        "interleave_self_attention": True,
        "norm_type": "ada_norm",
        "num_attention_heads": 32,
        "num_layers": 16,
        "output_dim": 1024,
        "positional_embeddings": None,
    },
    "hidden_size": 1024,
    "input_embedding_dim": 1536,
    "max_action_dim": 32,
    "max_state_dim": 64,
    "max_num_embodiments": 32,
    "noise_beta_alpha": 1.5,
    "noise_beta_beta": 1.0,
    "noise_s": 0.999,
    "num_inference_timesteps": 4,
    "num_target_vision_tokens": 32,
    "num_timestep_buckets": 1000,
    "tune_diffusion_model": True,
    "tune_projector": True,
    "use_vlln": True,
    "vl_self_attention_cfg": {
        "attention_head_dim": 64,
        "dropout": 0.2,
        "final_dropout": True,
        "num_attention_heads": 32,
        "num_layers": 4,
        "positional_embeddings": None,
    },
}


def _published_shapes(root: Path) -> None:
    """Every tensor's name and shape of LeRobot's GR00TN15 at the published size, built on the meta device."""
    groot_n1.AutoConfig.from_pretrained = staticmethod(
        lambda *_a, **_k: Eagle25VLConfig(**json.loads(json.dumps(PUBLISHED_EAGLE)))
    )
    beta = fm.Beta
    fm.Beta = lambda *_a, **_k: None  # its argument checks cannot run on meta tensors (used only to train)
    try:
        config = groot_n1.GR00TN15Config(
            backbone_cfg={**BACKBONE, "select_layer": 12},
            action_head_cfg=json.loads(json.dumps(PUBLISHED_HEAD)),
            action_horizon=16,
            action_dim=32,
        )
        with torch.device("meta"):
            model = groot_n1.GR00TN15(config, local_model_path="")
    finally:
        fm.Beta = beta
    shapes = {name: list(tensor.shape) for name, tensor in model.state_dict().items()}
    (root / "lerobot_gr00t_n15_shapes.json").write_text(json.dumps(shapes, indent=0) + "\n")


def _prompt(task_ids: list[int]) -> list[int]:
    """Token ids as the GR00T policy lays a prompt out: per camera a run of image placeholders, then text."""
    ids: list[int] = []
    for camera in range(CAMERAS):
        ids += [10 + camera, 20] + [IMAGE_TOKEN] * IMAGE_TOKENS + [21]
    return ids + task_ids


def main(root: Path) -> None:
    groot_n1.ensure_eagle_cache_ready = lambda *_a, **_k: None
    groot_n1.AutoConfig.from_pretrained = staticmethod(
        lambda *_a, **_k: Eagle25VLConfig(**json.loads(json.dumps(EAGLE)))
    )
    groot_n1.AutoModel.from_config = staticmethod(
        lambda config, **_k: eagle.Eagle25VLForConditionalGeneration(config)
    )
    eagle.SiglipVisionModel = _siglip_with_sdpa
    torch.manual_seed(0)
    config = groot_n1.GR00TN15Config(
        backbone_cfg=dict(BACKBONE),
        action_head_cfg=json.loads(json.dumps(HEAD)),
        action_horizon=8,
        action_dim=8,
    )
    model = groot_n1.GR00TN15(config, local_model_path="")
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.1 * torch.randn(param.shape))
    model.eval()
    head = model.action_head

    g = torch.Generator().manual_seed(1)
    pixels = torch.rand(BATCH * CAMERAS, 3, 32, 32, generator=g) * 2 - 1
    input_ids = torch.tensor([_prompt([40, 41, 42, 43, 44]), _prompt([50, 51, 52, 53, 54])])
    state = torch.randn(BATCH, 1, 8, generator=g)
    actions = torch.rand(BATCH, 8, 8, generator=g) * 2 - 1
    ids = torch.tensor([3, 1])
    noise = torch.randn(BATCH, 8, 8, generator=g)
    tau = torch.tensor([0.3, 0.8125])  # GR00T's time (0: noise, 1: actions)
    init = torch.randn(BATCH, 8, 8, generator=g)

    def inputs(**extra: torch.Tensor) -> dict[str, torch.Tensor]:
        return {
            "eagle_pixel_values": pixels,
            "eagle_input_ids": input_ids,
            "eagle_attention_mask": torch.ones_like(input_ids),
            "eagle_image_sizes": torch.tensor([[32, 32]] * (BATCH * CAMERAS)),
            "state": state,
            "embodiment_id": ids,
            **extra,
        }

    captured: dict[str, torch.Tensor] = {}
    head.action_decoder.register_forward_hook(lambda _m, _i, out: captured.__setitem__("pred", out))
    model.backbone.register_forward_hook(
        lambda _m, _i, out: captured.__setitem__("vl", out["backbone_features"])
    )
    real_randn = torch.randn
    try:
        fm.torch.randn = lambda *_a, **_k: noise.clone()
        head.sample_time = lambda *_a, **_k: tau.clone()
        with torch.no_grad():
            loss = model(inputs(action=actions, action_mask=torch.ones_like(actions)))["loss"]
        velocity = captured["pred"][:, -8:].clone()
        fm.torch.randn = lambda *_a, **_k: init.clone()
        with torch.no_grad():
            sampled = model.get_action(inputs())["action_pred"]
    finally:
        fm.torch.randn = real_randn
    out = root / "lerobot_gr00t_tiny"
    out.mkdir(parents=True, exist_ok=True)
    seen: set[int] = set()
    tensors = {}
    for name, tensor in model.state_dict().items():
        tensors[name] = tensor.clone() if tensor.data_ptr() in seen else tensor.contiguous()
        seen.add(tensor.data_ptr())
    save_file(tensors, str(out / "model.safetensors"))
    reference = {
        "pixel_values": pixels,
        "input_ids": input_ids,
        "state": state[:, 0],
        "actions": actions,
        "embodiment_id": ids,
        "noise": noise,
        "tau": tau,
        "backbone_features": captured["vl"],
        "velocity": velocity,
        "loss": loss.reshape(1),
        "init": init,
        "sampled": sampled,
    }
    save_file({k: v.contiguous() for k, v in reference.items()}, str(out / "reference.safetensors"))
    (out / "lerobot_config.json").write_text(
        json.dumps({"eagle": EAGLE, "backbone_cfg": BACKBONE, "action_head_cfg": HEAD}, indent=2) + "\n"
    )
    _published_shapes(root)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent)
