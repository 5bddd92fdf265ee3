"""MegatronActorBackend on a real GPU (one process, TP = PP = 1). Skipped without CUDA or megatron-core.

NOT RUN in this repository (no GPU on the development machine); see docs/gpu_backends.md. Run on a GPU host with
``uv sync --extra megatron --package rlinf-models`` then ``uv run pytest -m gpu packages/rlinf-models/tests/test_models_megatron_gpu.py``.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
pytest.importorskip("megatron.core", reason='needs megatron-core: pip install "rlinf-models[megatron]"')

from rlinf_core.config import AlgorithmConfig  # noqa: E402
from rlinf_models._config import OptimConfig  # noqa: E402
from rlinf_models.llm import CausalLMPolicy, LLMActorConfig, LLMModelConfig, load_causal_lm  # noqa: E402
from rlinf_models.llm.megatron import MegatronActorBackend, MegatronConfig  # noqa: E402
from rlinf_models.llm.testing import make_tiny_model_dir  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model_dir(
        tmp_path_factory.mktemp("m"), arch="qwen2", hidden_size=64, num_layers=2, vocab_size=320
    )


@pytest.fixture(scope="module")
def backend(tiny: Path) -> Iterator[MegatronActorBackend]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(
        RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    cfg = LLMActorConfig(
        model=LLMModelConfig(model_path=str(tiny), dtype="float32"),
        optim=OptimConfig(lr=1e-3, clip_grad=1.0),
        global_batch_size=4,
        micro_batch_size=2,
        temperature=0.9,
    )
    alg = AlgorithmConfig(
        adv_type="grpo", loss_type="actor", kl_beta=0.01, update_epoch=2, entropy_bonus=0.001
    )
    be = MegatronActorBackend(cfg, MegatronConfig(), alg, total_steps=10)
    yield be
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    torch.distributed.destroy_process_group()


def _batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 300, (4, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    mask[1, 10:] = 0
    mask[3, :1] = 0
    mask[3, 11:] = 0
    ids = ids * mask + 2 * (1 - mask)
    loss_mask = torch.zeros_like(ids)
    loss_mask[:, 6:] = 1
    adv = torch.tensor([[1.0], [0.5], [-0.5], [-1.0]]).expand(4, 12).contiguous()
    return {"input_ids": ids, "attention_mask": mask, "loss_mask": loss_mask * mask, "advantages": adv}


def _scored(mask: torch.Tensor) -> torch.Tensor:
    first = torch.zeros_like(mask, dtype=torch.bool)
    first[torch.arange(mask.shape[0]), mask.argmax(1)] = True
    return mask.bool() & ~first


def test_logprobs_match_the_hf_policy(backend: MegatronActorBackend, tiny: Path) -> None:
    b = _batch()
    out = backend.compute_logprobs(b)
    policy = CausalLMPolicy(load_causal_lm(LLMModelConfig(model_path=str(tiny)))).eval()
    with torch.no_grad():
        ref = policy(b["input_ids"], b["attention_mask"], temperature=0.9)["logprobs"]
    s = _scored(b["attention_mask"])
    torch.testing.assert_close(out["logprobs"][s], ref[s], rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(out["ref_logprobs"], out["logprobs"])


def test_training_moves_logprobs_with_the_advantage_and_export_reproduces_them(
    backend: MegatronActorBackend, tiny: Path
) -> None:
    b = _batch()
    before = backend.compute_logprobs(b)["logprobs"]
    metrics = backend.run_training(b)
    assert metrics["actor/num_optimizer_steps"] == 2.0 and metrics["actor/grad_norm"] > 0
    after = backend.compute_logprobs(b)["logprobs"]
    change = ((after - before) * b["loss_mask"]).sum(1)
    assert change[0] > 0 > change[3]
    hf = backend.export_hf_state_dict()
    policy = CausalLMPolicy(load_causal_lm(LLMModelConfig(model_path=str(tiny)))).eval()
    policy.model.load_state_dict(hf, strict=False)
    with torch.no_grad():
        exported = policy(b["input_ids"], b["attention_mask"], temperature=0.9)["logprobs"]
    s = _scored(b["attention_mask"])
    torch.testing.assert_close(exported[s], after[s], rtol=1e-3, atol=1e-3)


def test_offload_onload_keeps_the_weights_and_the_optimizer_reaching_them(
    backend: MegatronActorBackend,
) -> None:
    b = _batch()
    backend.run_sft(b)  # the optimizer now has state to move
    before = backend.compute_logprobs(b)["logprobs"]
    allocated = torch.cuda.memory_allocated()
    backend.offload()
    assert torch.cuda.memory_allocated() < allocated
    inner = getattr(backend.optimizer, "chained_optimizers", [backend.optimizer])
    state = [v for o in inner for s in o.optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    assert state and not any(v.is_cuda for v in state)
    backend.onload()
    torch.testing.assert_close(backend.compute_logprobs(b)["logprobs"], before)
    # With fp32 weights the optimizer's parameters are views into the DDP buffer: after a round trip its steps
    # must still change the model.
    backend.run_sft(b)
    assert not torch.allclose(backend.compute_logprobs(b)["logprobs"], before)


def test_sft_step_and_save_hf(backend: MegatronActorBackend, tmp_path: Path) -> None:
    b = _batch()
    out = backend.run_sft(b)
    assert out["sft/loss"] > 0 and out["sft/num_tokens"] == float(b["loss_mask"][:, 1:].sum())
    saved = Path(backend.save_hf(tmp_path / "hf"))
    model = load_causal_lm(LLMModelConfig(model_path=str(saved)))
    assert sum(p.numel() for p in model.parameters()) > 0


def _fused_adam() -> bool:
    """Whether megatron-core finds a fused Adam (Transformer Engine or apex) instead of torch's."""
    import importlib.util

    return any(importlib.util.find_spec(m) is not None for m in ("transformer_engine", "apex"))


@pytest.mark.parametrize(
    "fmt",
    [
        "dp_reshardable",
        pytest.param(
            "fully_reshardable",
            marks=pytest.mark.xfail(
                not _fused_adam(),
                raises=KeyError,
                reason="megatron-core 0.16.1 loads fully_reshardable state only for fused Adam ('step' key)",
            ),
        ),
    ],
)
def test_checkpoint_round_trip(backend: MegatronActorBackend, tmp_path: Path, fmt: str) -> None:
    backend.megatron = attrs.evolve(backend.megatron, optimizer_checkpoint_format=fmt)
    b = _batch()
    backend.save_checkpoint(tmp_path)
    saved = backend.compute_logprobs(b)["logprobs"]
    backend.run_sft(b)
    backend.load_checkpoint(tmp_path)
    torch.testing.assert_close(backend.compute_logprobs(b)["logprobs"], saved)
