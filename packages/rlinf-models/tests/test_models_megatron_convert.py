"""HF ↔ Megatron weight conversion, config translation and vocab-parallel log-probs (pure torch, no Megatron)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from rlinf_models.llm.megatron import (
    MegatronConfig,
    globalize_layers,
    gpt_model_kwargs,
    hf_to_megatron,
    left_align,
    megatron_to_hf,
    merge_tp_shards,
    padded_vocab_size,
    parse_hf_config,
    restore_alignment,
    shard_state_dict,
    shift_logprobs,
    stage_layers,
    transformer_config_kwargs,
    vocab_parallel_logprobs,
)

torch.set_num_threads(1)

QWEN2 = {
    "model_type": "qwen2",
    "vocab_size": 300,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
    "max_position_embeddings": 512,
    "tie_word_embeddings": True,
    "hidden_act": "silu",
    "use_sliding_window": False,
}
LLAMA = {
    "model_type": "llama",
    "vocab_size": 301,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    "max_position_embeddings": 1024,
    "tie_word_embeddings": False,
    "attention_bias": False,
}
QWEN3 = {**QWEN2, "model_type": "qwen3", "head_dim": 8, "num_hidden_layers": 2, "attention_bias": False}


def _hf_state_dict(cfg: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    """A random HF-named state dict with the shapes ``cfg`` implies (built by hand, independent of the converter)."""
    g = torch.Generator().manual_seed(seed)
    arch = parse_hf_config(cfg)
    h, d = arch.hidden_size, arch.head_dim
    q_out, kv_out = arch.num_attention_heads * d, arch.num_key_value_heads * d

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g)

    sd = {"model.embed_tokens.weight": r(arch.vocab_size, h), "model.norm.weight": r(h)}
    for i in range(arch.num_layers):
        p = f"model.layers.{i}."
        sd |= {
            p + "input_layernorm.weight": r(h),
            p + "post_attention_layernorm.weight": r(h),
            p + "self_attn.q_proj.weight": r(q_out, h),
            p + "self_attn.k_proj.weight": r(kv_out, h),
            p + "self_attn.v_proj.weight": r(kv_out, h),
            p + "self_attn.o_proj.weight": r(h, q_out),
            p + "mlp.gate_proj.weight": r(arch.intermediate_size, h),
            p + "mlp.up_proj.weight": r(arch.intermediate_size, h),
            p + "mlp.down_proj.weight": r(h, arch.intermediate_size),
        }
        if arch.qkv_bias:
            sd |= {p + "self_attn.q_proj.bias": r(q_out), p + "self_attn.k_proj.bias": r(kv_out)}
            sd[p + "self_attn.v_proj.bias"] = r(kv_out)
        if arch.qk_layernorm:
            sd |= {p + "self_attn.q_norm.weight": r(d), p + "self_attn.k_norm.weight": r(d)}
    if not arch.tie_word_embeddings:
        sd["lm_head.weight"] = r(arch.vocab_size, h)
    return sd


def _assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, msg=k)


# ----------------------------------------------------------------------------------------------- config
def test_parse_hf_config_reads_transformers5_and_4_rope_keys() -> None:
    q = parse_hf_config(QWEN2)
    assert (q.rope_theta, q.rope_scaling_factor, q.qkv_bias, q.qk_layernorm, q.head_dim) == (
        1e6,
        None,
        True,
        False,
        4,
    )
    ll = parse_hf_config(LLAMA)
    assert (ll.rope_theta, ll.rope_scaling_factor, ll.qkv_bias, ll.head_dim, ll.heads_per_group) == (
        5e5,
        32.0,
        False,
        8,
        2,
    )
    assert parse_hf_config(QWEN3).qk_layernorm


def test_parse_hf_config_reads_a_checkpoint_dir_or_file(tmp_path: Path) -> None:
    import json

    (tmp_path / "config.json").write_text(json.dumps(LLAMA))
    assert parse_hf_config(tmp_path) == parse_hf_config(tmp_path / "config.json") == parse_hf_config(LLAMA)


@pytest.mark.parametrize(
    ("patch", "match"),
    [
        ({"model_type": "gpt2"}, "model_type 'gpt2' is not supported"),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
        ({"use_sliding_window": True}, "sliding-window"),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1.0}}, "rope_type 'yarn'"),
        ({"num_key_value_heads": 3}, "multiple of num_key_value_heads"),
    ],
)
def test_parse_hf_config_rejects_what_gptmodel_cannot_express(patch: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_hf_config({**QWEN2, **patch})


def test_llama3_rope_with_other_constants_is_rejected() -> None:
    bad = {**LLAMA, "rope_scaling": {**LLAMA["rope_scaling"], "high_freq_factor": 2.0}}
    with pytest.raises(ValueError, match="high_freq_factor"):
        parse_hf_config(bad)


def test_transformer_and_gpt_kwargs() -> None:
    arch = parse_hf_config(LLAMA)
    kw = transformer_config_kwargs(
        arch, tensor_parallel_size=2, sequence_parallel=True, dtype="bfloat16", recompute=True
    )
    assert kw["num_query_groups"] == 2 and kw["kv_channels"] == 8 and kw["ffn_hidden_size"] == 64
    assert (
        kw["normalization"] == "RMSNorm"
        and kw["gated_linear_unit"]
        and kw["activation_func"] is torch.nn.functional.silu
    )
    assert kw["bf16"] and kw["params_dtype"] == torch.bfloat16 and kw["sequence_parallel"]
    assert kw["recompute_granularity"] == "full" and not kw["add_qkv_bias"]
    assert transformer_config_kwargs(arch, dtype="float32")["params_dtype"] == torch.float32
    assert not transformer_config_kwargs(arch, sequence_parallel=True)["sequence_parallel"]  # TP 1
    g = gpt_model_kwargs(arch, padded_vocab=512)
    assert g["rope_scaling"] and g["rope_scaling_factor"] == 32.0 and g["rotary_base"] == 5e5
    assert not g["share_embeddings_and_output_weights"] and g["vocab_size"] == 512
    with pytest.raises(ValueError, match="padded_vocab"):
        gpt_model_kwargs(arch, padded_vocab=300)


def test_padded_vocab_size_matches_megatron_rule() -> None:
    assert padded_vocab_size(300) == 384
    assert padded_vocab_size(384) == 384
    assert padded_vocab_size(300, tensor_parallel_size=4) == 512
    assert padded_vocab_size(151936, tensor_parallel_size=8) == 152576
    with pytest.raises(ValueError, match="vocab_size"):
        padded_vocab_size(0)


def test_megatron_config_validation() -> None:
    assert MegatronConfig(tensor_parallel_size=2, pipeline_parallel_size=3).model_parallel_size == 6
    with pytest.raises(ValueError, match="sequence_parallel"):
        MegatronConfig(sequence_parallel=True)
    with pytest.raises(ValueError, match="transformer_impl"):
        MegatronConfig(transformer_impl="apex")  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------- conversion
@pytest.mark.parametrize("cfg", [QWEN2, LLAMA, QWEN3], ids=["qwen2", "llama", "qwen3"])
@pytest.mark.parametrize("te", [False, True], ids=["local", "te"])
def test_hf_megatron_round_trip_is_exact(cfg: dict, te: bool) -> None:
    arch = parse_hf_config(cfg)
    hf = _hf_state_dict(cfg)
    mg = hf_to_megatron(hf, arch, padded_vocab=padded_vocab_size(arch.vocab_size), te_layernorm=te)
    assert mg["embedding.word_embeddings.weight"].shape == (384, arch.hidden_size)
    assert ("output_layer.weight" in mg) == (not arch.tie_word_embeddings)
    norm = "self_attention.linear_qkv.layer_norm_weight" if te else "input_layernorm.weight"
    assert f"decoder.layers.0.{norm}" in mg
    _assert_same(megatron_to_hf(mg, arch, te_layernorm=te), hf)


def test_qkv_layout_is_grouped_by_kv_head() -> None:
    """Megatron's fused QKV rows: for each kv group g, the q heads of g, then k_g, then v_g."""
    arch = parse_hf_config(QWEN2)  # 8 heads, 4 kv heads, head_dim 4 -> 2 q heads per group
    hf = _hf_state_dict(QWEN2)
    mg = hf_to_megatron(hf, arch, padded_vocab=384)
    qkv = mg["decoder.layers.1.self_attention.linear_qkv.weight"]
    d = arch.head_dim
    q, k, v = (hf[f"model.layers.1.self_attn.{n}_proj.weight"] for n in "qkv")
    for g in range(arch.num_key_value_heads):
        block = qkv[g * 4 * d : (g + 1) * 4 * d]
        torch.testing.assert_close(block[: 2 * d], q[g * 2 * d : (g + 1) * 2 * d])
        torch.testing.assert_close(block[2 * d : 3 * d], k[g * d : (g + 1) * d])
        torch.testing.assert_close(block[3 * d :], v[g * d : (g + 1) * d])
    fc1 = mg["decoder.layers.1.mlp.linear_fc1.weight"]
    torch.testing.assert_close(fc1[: arch.intermediate_size], hf["model.layers.1.mlp.gate_proj.weight"])
    bias = mg["decoder.layers.1.self_attention.linear_qkv.bias"]
    torch.testing.assert_close(bias[2 * d : 3 * d], hf["model.layers.1.self_attn.k_proj.bias"][:d])


def test_padding_rows_are_zero_and_cut_on_export() -> None:
    arch = parse_hf_config(LLAMA)
    mg = hf_to_megatron(_hf_state_dict(LLAMA), arch, padded_vocab=512)
    assert mg["output_layer.weight"].shape[0] == 512
    assert not mg["output_layer.weight"][arch.vocab_size :].any()
    assert megatron_to_hf(mg, arch)["lm_head.weight"].shape[0] == arch.vocab_size


def test_missing_and_unmapped_tensors_are_named() -> None:
    arch = parse_hf_config(QWEN2)
    hf = _hf_state_dict(QWEN2)
    del hf["model.layers.2.mlp.up_proj.weight"]
    with pytest.raises(KeyError, match=r"model\.layers\.2\.mlp\.up_proj\.weight"):
        hf_to_megatron(hf, arch, padded_vocab=384)
    hf = _hf_state_dict(QWEN2) | {"model.layers.0.extra.weight": torch.zeros(1)}
    with pytest.raises(ValueError, match=r"model\.layers\.0\.extra\.weight"):
        hf_to_megatron(hf, arch, padded_vocab=384)
    mg = hf_to_megatron(_hf_state_dict(QWEN2), arch, padded_vocab=384) | {"decoder.foo": torch.zeros(1)}
    with pytest.raises(ValueError, match=r"decoder\.foo"):
        megatron_to_hf(mg, arch)


@pytest.mark.parametrize(
    ("cfg", "tp", "pp"),
    [(QWEN2, tp, pp) for tp, pp in [(1, 1), (2, 1), (4, 2), (2, 2), (1, 2), (4, 4)]]
    + [(LLAMA, tp, pp) for tp, pp in [(1, 1), (2, 1), (2, 2), (1, 2)]],
    ids=lambda v: v["model_type"] if isinstance(v, dict) else str(v),
)
def test_tp_pp_shard_then_merge_round_trips(cfg: dict, tp: int, pp: int) -> None:
    arch = parse_hf_config(cfg)
    hf = _hf_state_dict(cfg)
    full = hf_to_megatron(hf, arch, padded_vocab=padded_vocab_size(arch.vocab_size, tensor_parallel_size=tp))
    stages = []
    for p in range(pp):
        local = stage_layers(
            full, num_layers=arch.num_layers, pp_size=pp, pp_rank=p, tied=arch.tie_word_embeddings
        )
        layer_ids = {int(k.split(".")[2]) for k in local if k.startswith("decoder.layers.")}
        assert layer_ids == set(range(arch.num_layers // pp))
        assert ("embedding.word_embeddings.weight" in local) == (p == 0)
        assert ("decoder.final_layernorm.weight" in local) == (p == pp - 1)
        # a tied model's last stage holds its own output-layer copy only with pipeline parallelism
        assert ("output_layer.weight" in local) == (p == pp - 1 and (pp > 1 or not arch.tie_word_embeddings))
        shards = [shard_state_dict(local, arch, tp_size=tp, tp_rank=r) for r in range(tp)]
        qkv = shards[0].get("decoder.layers.0.self_attention.linear_qkv.weight")
        assert (
            qkv is not None
            and qkv.shape[0]
            == (arch.num_attention_heads + 2 * arch.num_key_value_heads) * arch.head_dim // tp
        )
        stages.append(merge_tp_shards(shards))
    merged = globalize_layers(stages, num_layers=arch.num_layers, tied=arch.tie_word_embeddings)
    _assert_same(megatron_to_hf(merged, arch), hf)


def test_fc1_tp_shard_holds_matching_gate_and_up_rows() -> None:
    arch = parse_hf_config(QWEN2)
    hf = _hf_state_dict(QWEN2)
    full = hf_to_megatron(hf, arch, padded_vocab=384)
    shard = shard_state_dict(full, arch, tp_size=2, tp_rank=1)["decoder.layers.0.mlp.linear_fc1.weight"]
    half = arch.intermediate_size // 2
    torch.testing.assert_close(shard[:half], hf["model.layers.0.mlp.gate_proj.weight"][half:])
    torch.testing.assert_close(shard[half:], hf["model.layers.0.mlp.up_proj.weight"][half:])


def test_layout_errors_name_the_setting() -> None:
    arch = parse_hf_config(QWEN2)
    full = hf_to_megatron(_hf_state_dict(QWEN2), arch, padded_vocab=384)
    with pytest.raises(ValueError, match="tensor_parallel_size 3"):
        shard_state_dict(full, arch, tp_size=3, tp_rank=0)
    with pytest.raises(ValueError, match="pipeline_parallel_size 3"):
        stage_layers(full, num_layers=4, pp_size=3, pp_rank=0, tied=True)
    with pytest.raises(ValueError, match="tp_rank"):
        shard_state_dict(full, arch, tp_size=2, tp_rank=2)


# --------------------------------------------------------------------------------------------- logprobs
def _reference(logits: torch.Tensor, targets: torch.Tensor, vocab: int, temperature: float):
    lp = torch.log_softmax(logits[..., :vocab].double() / temperature, dim=-1)
    return lp.gather(-1, targets.unsqueeze(-1)).squeeze(-1), -(lp.exp() * lp).sum(-1)


def test_vocab_parallel_logprobs_single_rank_matches_log_softmax_and_masks_padding() -> None:
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 5, 40, generator=g, requires_grad=True)
    targets = torch.randint(0, 33, (3, 5), generator=g)
    lp, ent = vocab_parallel_logprobs(logits, targets, vocab_size=33, temperature=0.7, compute_entropy=True)
    ref_lp, ref_ent = _reference(logits.detach(), targets, 33, 0.7)
    torch.testing.assert_close(lp.double(), ref_lp, rtol=1e-5, atol=1e-5)
    assert ent is not None
    torch.testing.assert_close(ent.double(), ref_ent, rtol=1e-5, atol=1e-5)
    (lp.sum() + ent.sum()).backward()
    assert logits.grad is not None and torch.isfinite(logits.grad).all()
    assert not logits.grad[..., 33:].any()  # padding columns get no gradient


def test_vocab_parallel_logprobs_rejects_bad_temperature() -> None:
    with pytest.raises(ValueError, match="temperature"):
        vocab_parallel_logprobs(torch.zeros(1, 4), torch.zeros(1, dtype=torch.long), temperature=0.0)


_TP_SCRIPT = """
import os, sys, torch, torch.distributed as dist
from rlinf_models.llm.megatron import vocab_parallel_logprobs
torch.set_num_threads(1)
rank, world, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
dist.init_process_group("gloo", rank=rank, world_size=world)
g = torch.Generator().manual_seed(7)
full = torch.randn(2, 6, 48, generator=g)  # padded vocab 48, true vocab 45
targets = torch.randint(0, 45, (2, 6), generator=g)
shard = full.chunk(world, dim=-1)[rank].clone().requires_grad_(True)
lp, ent = vocab_parallel_logprobs(shard, targets, vocab_start=rank * 48 // world, vocab_size=45,
                                  temperature=1.3, compute_entropy=True, group=dist.group.WORLD)
(lp.sum() + 0.5 * ent.sum()).backward()
torch.save((lp.detach(), ent.detach(), shard.grad), out)
dist.destroy_process_group()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_vocab_parallel_logprobs_over_two_gloo_ranks_matches_full_softmax_and_its_gradient(
    tmp_path: Path,
) -> None:
    script = tmp_path / "tp.py"
    script.write_text(_TP_SCRIPT)
    port = str(_free_port())
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(r), "2", port, str(tmp_path / f"r{r}.pt")], env=env
        )
        for r in range(2)
    ]
    try:
        codes = [p.wait(timeout=90) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert codes == [0, 0]
    g = torch.Generator().manual_seed(7)
    full = torch.randn(2, 6, 48, generator=g).requires_grad_(True)
    targets = torch.randint(0, 45, (2, 6), generator=g)
    ref_lp, ref_ent = vocab_parallel_logprobs(
        full, targets, vocab_size=45, temperature=1.3, compute_entropy=True
    )
    assert ref_ent is not None
    (ref_lp.sum() + 0.5 * ref_ent.sum()).backward()
    assert full.grad is not None
    for rank in (0, 1):
        lp, ent, grad = torch.load(tmp_path / f"r{rank}.pt")
        torch.testing.assert_close(lp, ref_lp.detach(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ent, ref_ent.detach(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(grad, full.grad.chunk(2, dim=-1)[rank], rtol=1e-5, atol=1e-6)


def test_left_align_and_restore() -> None:
    pad = 0
    ids = torch.tensor([[pad, pad, 5, 6, 7, pad], [1, 2, 3, 4, pad, pad], [pad, 9, 8, 7, 6, 5]])
    mask = (torch.tensor([[0, 0, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0], [0, 1, 1, 1, 1, 1]])).long()
    aligned, shifts = left_align(ids, mask)
    assert shifts.tolist() == [2, 0, 1]
    assert aligned[0, :3].tolist() == [5, 6, 7] and aligned[2, :5].tolist() == [9, 8, 7, 6, 5]
    assert torch.equal(restore_alignment(aligned, shifts), ids)
    with pytest.raises(ValueError, match=r"rows \[0\]"):
        left_align(ids, torch.tensor([[1, 0, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0], [0, 1, 1, 1, 1, 1]]))


def test_shift_logprobs_puts_token_t_at_index_t() -> None:
    out = shift_logprobs(torch.tensor([[-1.0, -2.0]]))
    assert out.tolist() == [[0.0, -1.0, -2.0]]


def test_backend_without_megatron_names_the_extra() -> None:
    import importlib.util

    if importlib.util.find_spec("megatron") is not None:
        pytest.skip("megatron-core is installed here")
    import rlinf_models.llm.megatron as mod

    with pytest.raises(ImportError, match=r"rlinf-models\[megatron,hf\]"):
        _ = mod.MegatronActorBackend
