"""The converter against the REAL megatron-core (``rlinf-models[megatron]``), on CPU where megatron allows it.

Skipped when megatron-core is not installed (the shared dev environment does not install the extra). With it
installed (any machine):

- ``TransformerConfig`` accepts the translated kwargs (its ``__post_init__`` validates them);
- a ``GPTModel`` built on CPU (``use_cpu_initialization``, local layer spec) loads the converted weights with
  no missing or unexpected key, and exports back to the identical HF tensors;
- its forward pass equals the HF model's logits, and the backend's log-prob path (left alignment, vocab-parallel
  log-softmax, re-alignment) equals :class:`~rlinf_models.llm.CausalLMPolicy` on a left-padded batch.

Megatron-core's forward hard-codes two CUDA calls (``RotaryEmbedding`` moves ``inv_freq`` to
``torch.cuda.current_device()``; the TP RNG tracker forks CUDA RNG states). On a machine without CUDA, and for
these CPU-only tests only, the two are redirected to the CPU (``_cpu_shims``); the model code itself runs
unchanged. On a GPU machine the shims are not applied.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

pytest.importorskip("megatron.core", reason='needs megatron-core: pip install "rlinf-models[megatron]"')
pytest.importorskip("transformers")

import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.tensor_parallel import random as mcore_random
from megatron.core.transformer import TransformerConfig
from rlinf_models.llm import CausalLMPolicy, LLMModelConfig, load_causal_lm
from rlinf_models.llm.megatron import (
    aligned_token_logprobs,
    gpt_model_kwargs,
    hf_to_megatron,
    left_align,
    megatron_to_hf,
    padded_vocab_size,
    parse_hf_config,
    transformer_config_kwargs,
)
from rlinf_models.llm.testing import make_tiny_model_dir
from safetensors.torch import load_file

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def megatron_world() -> Iterator[None]:
    """A one-rank gloo group with Megatron's parallel state (TP = PP = 1)."""
    if dist.is_initialized():
        pytest.skip("a torch.distributed group already exists in this process")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    try:
        yield
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


@pytest.fixture
def cpu_shims(monkeypatch: pytest.MonkeyPatch) -> None:
    if torch.cuda.is_available():
        return
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
    tracker = mcore_random.get_cuda_rng_tracker()
    monkeypatch.setattr(tracker, "fork", lambda *a, **k: contextlib.nullcontext())


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def tiny(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    # vocab 320 -> Megatron pads to 384: the padding path is exercised
    return make_tiny_model_dir(
        tmp_path_factory.mktemp(request.param),
        arch=request.param,
        hidden_size=32,
        num_layers=2,
        vocab_size=320,
    )


def _gpt(path: Path) -> tuple[GPTModel, dict[str, torch.Tensor]]:
    arch = parse_hf_config(path)
    pv = padded_vocab_size(arch.vocab_size)
    cfg = TransformerConfig(**transformer_config_kwargs(arch, dtype="float32", use_cpu_initialization=True))
    spec = get_gpt_layer_local_spec(normalization="RMSNorm", qk_layernorm=arch.qk_layernorm)
    model = GPTModel(config=cfg, transformer_layer_spec=spec, **gpt_model_kwargs(arch, padded_vocab=pv))
    hf = load_file(str(path / "model.safetensors"))
    return model, hf


def test_transformer_config_accepts_translated_kwargs_for_parallel_layouts(
    megatron_world: None, tiny: Path
) -> None:
    arch = parse_hf_config(tiny)
    for kw in (
        {"dtype": "bfloat16", "recompute": True},
        {
            "tensor_parallel_size": 2,
            "pipeline_parallel_size": 2,
            "sequence_parallel": True,
            "dtype": "bfloat16",
        },
    ):
        cfg = TransformerConfig(**transformer_config_kwargs(arch, **kw))  # type: ignore[arg-type]
        assert cfg.num_query_groups == arch.num_key_value_heads and cfg.kv_channels == arch.head_dim
        assert cfg.bf16 and cfg.params_dtype == torch.bfloat16


def test_converted_weights_load_strictly_and_export_back(megatron_world: None, tiny: Path) -> None:
    model, hf = _gpt(tiny)
    arch = parse_hf_config(tiny)
    mg = hf_to_megatron(hf, arch, padded_vocab=padded_vocab_size(arch.vocab_size))
    expected = {k for k in model.state_dict() if not k.endswith("_extra_state")}
    assert set(mg) == expected
    for k, t in model.state_dict().items():
        if k in mg:
            assert tuple(t.shape) == tuple(mg[k].shape), k
    result = model.load_state_dict(mg, strict=False)
    assert not result.unexpected_keys
    assert all(k.endswith("_extra_state") for k in result.missing_keys)
    exported = megatron_to_hf(model.state_dict(), arch)
    assert sorted(exported) == sorted(k for k in hf if k != "lm_head.weight" or not arch.tie_word_embeddings)
    for k, t in exported.items():
        torch.testing.assert_close(t, hf[k], rtol=0, atol=0, msg=k)


def test_megatron_forward_matches_hf_and_policy_logprobs(
    megatron_world: None, cpu_shims: None, tiny: Path
) -> None:
    model, hf_sd = _gpt(tiny)
    arch = parse_hf_config(tiny)
    model.load_state_dict(
        hf_to_megatron(hf_sd, arch, padded_vocab=padded_vocab_size(arch.vocab_size)), strict=False
    )
    model.eval()
    cfg = LLMModelConfig(model_path=str(tiny))
    policy = CausalLMPolicy(load_causal_lm(cfg)).eval()

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, arch.vocab_size, (3, 9), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding
    mask[1, 7:] = 0  # right padding
    mask[2, :1] = 0
    mask[2, 8:] = 0
    ids = ids * mask + 2 * (1 - mask)
    aligned, shifts = left_align(ids, mask)
    t = ids.shape[1]
    positions = torch.arange(t).unsqueeze(0).expand_as(ids)
    causal = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)[None, None]
    with torch.no_grad():
        logits = model(aligned, positions, causal)
        assert logits.shape == (3, t, padded_vocab_size(arch.vocab_size))
        # full rows: identical to HF's logits
        hf_logits = policy.model(ids[1:2, :7]).logits
        torch.testing.assert_close(logits[1:2, :7, : arch.vocab_size], hf_logits, rtol=1e-4, atol=1e-4)
        lp, ent = aligned_token_logprobs(
            logits, aligned, shifts, mask, vocab_size=arch.vocab_size, temperature=0.8, compute_entropy=True
        )
        ref = policy(ids, mask, temperature=0.8, compute_entropy=True)
    valid = mask.bool()
    valid[0, 3] = valid[1, 0] = valid[2, 1] = False  # each row's first token has no prediction
    torch.testing.assert_close(lp[valid], ref["logprobs"][valid], rtol=1e-4, atol=1e-4)
    assert ent is not None
    torch.testing.assert_close(ent[valid], ref["entropy"][valid], rtol=1e-4, atol=1e-4)
    assert not lp[~mask.bool()].any()


def test_backend_module_imports_with_megatron_installed() -> None:
    from rlinf_models.llm.megatron import MegatronActorBackend, initialize_model_parallel

    assert callable(initialize_model_parallel) and MegatronActorBackend.__name__ == "MegatronActorBackend"
    if not torch.cuda.is_available():
        from rlinf_models.llm.megatron import MegatronConfig

        with pytest.raises(RuntimeError, match="needs CUDA"):
            initialize_model_parallel(MegatronConfig(), seed=0)
