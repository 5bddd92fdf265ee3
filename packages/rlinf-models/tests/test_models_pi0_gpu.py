"""rlinf_models.pi0 on CUDA: LeRobot's tiny checkpoints on the GPU, float32 and bfloat16 towers (skipped without one).

Not run where this was written (no GPU); see docs/vla.md.
"""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
import torch

pytest.importorskip("transformers")

from rlinf_models.pi0 import Pi0Config, load_pi0
from safetensors.torch import load_file

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

ROOT = Path(__file__).parent / "data"


def _run(variant: str, config: Pi0Config | None) -> tuple[torch.Tensor, torch.Tensor, Pi0Config]:
    directory = ROOT / f"lerobot_{variant}_tiny"
    model, _ = load_pi0(directory / "ckpt", config=config, device="cuda")
    ref = {k: v.cuda() for k, v in load_file(str(directory / "reference.safetensors")).items()}
    state = None if model.config.pi05 else ref["state"]
    with torch.no_grad():
        prefix = model.eval().encode_prefix(
            list(ref["images"].unbind(1)),
            list(ref["image_masks"].unbind(1)),
            ref["tokens"],
            ref["token_mask"],
        )
        losses = model.flow_matching_loss(prefix, state, ref["actions"], ref["noise"], ref["time"])
        sampled = model.sample_actions(prefix, state, ref["noise"], num_steps=3)
    return losses, sampled, model.config


@pytest.mark.parametrize("variant", ["pi0", "pi05"])
def test_float32_on_cuda_matches_lerobot(variant: str) -> None:
    losses, sampled, _ = _run(variant, None)
    ref = load_file(str(ROOT / f"lerobot_{variant}_tiny" / "reference.safetensors"))
    torch.testing.assert_close(losses.cpu(), ref["losses"], atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(sampled.cpu(), ref["sampled"], atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("variant", ["pi0", "pi05"])
def test_bfloat16_towers_on_cuda_stay_near_float32(variant: str) -> None:
    config = Pi0Config.from_json(ROOT / f"lerobot_{variant}_tiny" / "ckpt" / "config.json")
    _, sampled32, _ = _run(variant, config)
    _, sampled16, used = _run(variant, attrs.evolve(config, dtype="bfloat16"))
    assert used.dtype == "bfloat16" and sampled16.dtype == torch.float32
    assert torch.isfinite(sampled16).all()
    # On the CPU the bfloat16 towers stay within 0.4 % of float32 here (test_models_pi0.py checks < 2 %).
    error = (sampled16 - sampled32).norm() / sampled32.norm()
    assert error < 0.05, error
