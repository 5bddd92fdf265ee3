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
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


@pytest.fixture(scope="module")
def tiny_qwen2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model_dir(
        tmp_path_factory.mktemp("q"), arch="qwen2", hidden_size=32, num_layers=2, vocab_size=320
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


# The whole MegatronActorBackend on CPU, in a child process (the shims below patch torch globally):
# megatron-core hard-codes CUDA in places (``device="cuda"`` tensors, ``.cuda()``, CUDA RNG tracker), so every
# CUDA device request is redirected to the CPU there. This exercises the backend's own code — building from an
# HF dir, DDP, the pipeline schedule with our loss functions, optimizer steps, metrics, export, save_hf — with
# megatron's non-distributed optimizer (its DistributedOptimizer refuses CPU tensors). Numerics under these
# shims drift by ~5e-3 in the logits (megatron code paths chosen for "CUDA"), hence the loose tolerance.
_SMOKE = r"""
import contextlib, functools, json, os, sys, warnings
warnings.filterwarnings("ignore")
import torch
torch.set_num_threads(1)
path, out_dir, rank, world, port, tp, pp = sys.argv[1], sys.argv[2], *(int(x) for x in sys.argv[3:8])
os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
_D = torch.device
def _is_cuda(x):
    return (isinstance(x, int) and not isinstance(x, bool)) or (isinstance(x, (str, _D)) and str(x).startswith("cuda"))
def _cpuify(fn):
    @functools.wraps(fn)
    def w(*a, **k):
        if k.get("device") is not None and _is_cuda(k["device"]):
            k["device"] = "cpu"
        return fn(*a, **k)
    return w
for _n in ("tensor", "zeros", "empty", "ones", "full", "arange", "zeros_like", "empty_like", "ones_like", "randn", "rand"):
    setattr(torch, _n, _cpuify(getattr(torch, _n)))
_to = torch.Tensor.to
def _to_cpu(self, *a, **k):
    a = tuple("cpu" if _is_cuda(x) else x for x in a)
    if "device" in k and _is_cuda(k["device"]):
        k["device"] = "cpu"
    return _to(self, *a, **k)
torch.Tensor.to = _to_cpu
torch.Tensor.cuda = lambda self, *a, **k: self
torch.nn.Module.cuda = lambda self, *a, **k: self
for _name in ("set_device", "synchronize", "empty_cache"):
    setattr(torch.cuda, _name, lambda *a, **k: None)
torch.cuda.is_available = lambda: True
torch.cuda.current_device = lambda: 0
torch.cuda.device_count = lambda: 1
torch.optim.Optimizer._accelerator_graph_capture_health_check = lambda self: None
from megatron.core import tensor_parallel
from megatron.core.tensor_parallel import random as mcore_random
mcore_random.get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()
import rlinf_models.llm.megatron._backend as B
B.tensor_parallel.model_parallel_cuda_manual_seed = lambda *a, **k: None
from rlinf_core.config import AlgorithmConfig
from rlinf_models._config import OptimConfig
from rlinf_models.llm import CausalLMPolicy, LLMActorConfig, LLMModelConfig, load_causal_lm
from rlinf_models.llm.megatron import MegatronConfig

cfg = LLMActorConfig(model=LLMModelConfig(model_path=path), optim=OptimConfig(lr=1e-3, clip_grad=None),
                     global_batch_size=4, micro_batch_size=2, temperature=0.9)
alg = AlgorithmConfig(adv_type="grpo", loss_type="actor", kl_beta=0.01, update_epoch=2, entropy_bonus=0.001)
layout = MegatronConfig(use_distributed_optimizer=False, nccl_backend="gloo", tensor_parallel_size=tp, pipeline_parallel_size=pp)
be = B.MegatronActorBackend(cfg, layout, alg, total_steps=10)
g = torch.Generator().manual_seed(0)
ids = torch.randint(3, 300, (4, 10), generator=g)
mask = torch.ones_like(ids); mask[0, :2] = 0; mask[1, 8:] = 0; mask[3, :1] = 0; mask[3, 9:] = 0
ids = ids * mask + 2 * (1 - mask)
lm = torch.zeros_like(ids); lm[:, 5:] = 1; lm = lm * mask
first = torch.zeros_like(mask, dtype=torch.bool); first[torch.arange(4), mask.argmax(1)] = True
scored = mask.bool() & ~first
before = be.compute_logprobs({"input_ids": ids, "attention_mask": mask})
policy = CausalLMPolicy(load_causal_lm(cfg.model)).eval()
with torch.no_grad():
    ref = policy(ids, mask, temperature=0.9)["logprobs"]
adv = torch.tensor([[1.0], [0.5], [-0.5], [-1.0]]).expand(4, 10).contiguous()
batch = {"input_ids": ids, "attention_mask": mask, "loss_mask": lm, "advantages": adv}
metrics = be.run_training(batch)
after = be.compute_logprobs(batch)
sft = be.run_sft(batch)
hf = be.export_hf_state_dict()
policy.model.load_state_dict(hf, strict=False)
with torch.no_grad():
    exported = policy(ids, mask, temperature=0.9)["logprobs"]
final = be.compute_logprobs(batch)["logprobs"]
saved = be.save_hf(out_dir)
if rank == 0:
  json.dump({
    "initial_vs_policy": float((before["logprobs"] - ref).abs()[scored].max()),
    "ref_equals_policy_at_start": bool(torch.equal(before["ref_logprobs"], before["logprobs"])),
    "zero_outside_mask": bool((before["logprobs"][~mask.bool()] == 0).all()),
    "metrics": metrics, "sft": sft,
    "row_change": ((after["logprobs"] - before["logprobs"]) * lm).sum(1).tolist(),
    "export_keys": sorted(hf), "hf_keys": sorted(load_causal_lm(cfg.model).state_dict()),
    "exported_vs_backend": float((exported - final).abs()[scored].max()),
    "saved_files": sorted(os.listdir(saved)),
  }, open(os.path.join(out_dir, "..", "smoke.json"), "w"))
"""


# A trained backend's distributed checkpoint, and its log-probs after the step, for rlinf-export. Under a main
# guard: dist_checkpointing's writer starts a multiprocessing manager, which re-imports the main module.
_SAVE_BODY = (
    _SMOKE[: _SMOKE.index("be = B.MegatronActorBackend")]
    + r"""
be = B.MegatronActorBackend(cfg, layout, alg, total_steps=10)
g = torch.Generator().manual_seed(0)
ids = torch.randint(3, 300, (4, 10), generator=g)
mask = torch.ones_like(ids)
lm = torch.zeros_like(ids); lm[:, 5:] = 1
adv = torch.tensor([[1.0], [0.5], [-0.5], [-1.0]]).expand(4, 10).contiguous()
batch = {"input_ids": ids, "attention_mask": mask, "loss_mask": lm, "advantages": adv}
be.run_training(batch)
be.save_checkpoint(os.path.join(out_dir, "..", "ckpt"))
lp = be.compute_logprobs(batch)["logprobs"]
if rank == 0:
    torch.save({"input_ids": ids, "logprobs": lp}, os.path.join(out_dir, "..", "trained.pt"))
    json.dump({}, open(os.path.join(out_dir, "..", "smoke.json"), "w"))
"""
)
_SAVE = (
    "def main():\n"
    + "".join(f"    {line}\n" for line in _SAVE_BODY.splitlines())
    + ("\nif __name__ == '__main__':\n    main()\n")
)


def _run_smoke(
    model: Path, out: Path, *, world: int = 1, tp: int = 1, pp: int = 1, script_text: str = _SMOKE
) -> dict[str, Any]:
    import json
    import subprocess
    import sys

    out.mkdir(parents=True, exist_ok=True)
    script = out / "smoke.py"
    script.write_text(script_text)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    args = [str(model), str(out / "hf"), "{rank}", str(world), str(port), str(tp), str(pp)]
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), *(a.format(rank=r) for a in args)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(world)
    ]
    try:
        errors = [p.communicate(timeout=400)[1] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert all(p.returncode == 0 for p in procs), "\n".join(e[-2000:] for e in errors)
    return dict(json.loads((out / "smoke.json").read_text()))


@pytest.mark.slow
def test_backend_runs_end_to_end_on_cpu_with_cuda_redirected(tiny: Path, tmp_path: Path) -> None:
    r = _run_smoke(tiny, tmp_path)
    assert r["initial_vs_policy"] < 0.05 and r["ref_equals_policy_at_start"] and r["zero_outside_mask"]
    m = r["metrics"]
    assert m["actor/num_optimizer_steps"] == 2.0 and m["actor/lr"] == pytest.approx(1e-3)
    assert m["actor/kl_loss"] != 0 and m["actor/grad_norm"] > 0  # the second step saw a moved policy (k1 KL)
    assert m["actor/total_loss"] == pytest.approx(
        m["actor/policy_loss"] - 0.001 * m["actor/entropy"] + 0.01 * m["actor/kl_loss"], abs=1e-4
    )
    up, _, _, down = r["row_change"]
    assert up > 0 > down  # positive advantage raises the trained tokens' log-probs, negative lowers them
    assert r["sft"]["sft/num_tokens"] == 17.0 and r["sft"]["sft/loss"] > 0
    tied = "lm_head.weight" not in r["export_keys"]
    assert r["export_keys"] == [k for k in r["hf_keys"] if not (tied and k == "lm_head.weight")]
    assert r["exported_vs_backend"] < 0.05
    assert "model.safetensors" in r["saved_files"] and "config.json" in r["saved_files"]


@pytest.mark.slow
@pytest.mark.parametrize(("world", "tp", "pp"), [(2, 2, 1), (2, 1, 2), (2, 1, 1)], ids=["tp2", "pp2", "dp2"])
def test_parallel_layouts_make_the_same_update_as_one_rank(
    tiny_qwen2: Path, tmp_path: Path, world: int, tp: int, pp: int
) -> None:
    """Real megatron TP / PP / DP process groups (gloo, CPU-redirected): same metrics, same new log-probs.

    The tied Qwen2 model exercises the vocab-parallel embedding/output split (TP), the last stage's output-layer
    copy synchronised through megatron's embedding group (PP), and gradient averaging (DP).
    """
    one = _run_smoke(tiny_qwen2, tmp_path / "one")
    many = _run_smoke(tiny_qwen2, tmp_path / "many", world=world, tp=tp, pp=pp)
    for key in ("actor/policy_loss", "actor/grad_norm", "actor/entropy", "actor/kl_loss", "actor/total_loss"):
        assert many["metrics"][key] == pytest.approx(one["metrics"][key], rel=1e-4, abs=1e-5), key
    assert many["row_change"] == pytest.approx(one["row_change"], rel=1e-4, abs=1e-4)
    assert many["sft"]["sft/loss"] == pytest.approx(one["sft"]["sft/loss"], rel=1e-4)
    assert many["export_keys"] == one["export_keys"]


@pytest.mark.slow
def test_rlinf_export_of_a_tp2_checkpoint_reproduces_the_backend_logprobs(
    tiny_qwen2: Path, tmp_path: Path
) -> None:
    """The distributed checkpoint of a trained TP=2 run → an HF directory, read without megatron or a GPU."""
    import json

    from rlinf_core.checkpoint import CheckpointManager
    from rlinf_models.llm._export import export_checkpoint

    _run_smoke(tiny_qwen2, tmp_path / "run", world=2, tp=2, script_text=_SAVE)
    manager = CheckpointManager(tmp_path / "log")
    staging = manager.begin(1)
    (tmp_path / "run" / "ckpt" / "actor").rename(staging / "actor")
    config = {"actor": {"model": {"model_path": str(tiny_qwen2)}, "training_backend": "megatron"}}
    manager.commit(1, staging, {"config": config})
    out = export_checkpoint(tmp_path / "log", tmp_path / "hf")
    assert json.loads((out / "rlinf_export.json").read_text())["backend"] == "megatron"
    trained = torch.load(tmp_path / "run" / "trained.pt", weights_only=True)
    ids = trained["input_ids"]
    policy = CausalLMPolicy(load_causal_lm(LLMModelConfig(model_path=str(out)))).eval()
    base = CausalLMPolicy(load_causal_lm(LLMModelConfig(model_path=str(tiny_qwen2)))).eval()
    with torch.no_grad():
        got = policy(ids, torch.ones_like(ids), temperature=0.9)["logprobs"][:, 1:]
        before = base(ids, torch.ones_like(ids), temperature=0.9)["logprobs"][:, 1:]
    want = trained["logprobs"][:, 1:]
    # Under the CPU shims the backend's own forward drifts by ~5e-3 from HF's (see _SMOKE); the weights match.
    assert (got - want).abs().max() < 0.05 < (before - want).abs().max()


def test_megatron_worker_offers_every_method_of_the_fsdp_actor() -> None:
    """A runner written against LLMActorWorker drives MegatronLLMActorWorker unchanged."""
    import inspect

    from rlinf_models.llm import LLMActorWorker
    from rlinf_models.llm.megatron import MegatronLLMActorWorker

    public = {
        n
        for n, f in vars(LLMActorWorker).items()
        if callable(f) and not n.startswith("_") and n != "create_group"
    }
    assert public, "LLMActorWorker has no public methods?"
    for name in sorted(public):
        theirs = inspect.signature(getattr(LLMActorWorker, name))
        ours = inspect.signature(getattr(MegatronLLMActorWorker, name))
        assert list(ours.parameters) == list(theirs.parameters), name
