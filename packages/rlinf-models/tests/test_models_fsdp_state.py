"""Full state dicts of a plain (one-rank) module: built without torch.distributed.checkpoint, in its layout.

Each result is compared with what ``torch.distributed.checkpoint.state_dict`` itself gives for the same module
and optimizer, so a checkpoint written by one rank loads on many ranks and back.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
import torch
from rlinf_models._fsdp import (
    full_model_state_dict,
    full_optimizer_state_dict,
    load_full_model_state_dict,
    load_full_optimizer_state_dict,
)
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)

FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def _model_and_optimizer(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    model.register_buffer("scale", torch.ones(1))
    params = list(model.parameters())
    opt = torch.optim.Adam([{"params": params[:2], "lr": 1e-3}, {"params": params[2:], "lr": 2e-3}])
    torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 - 0.1 * step)  # adds initial_lr to the groups
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(5, 3)).square().sum().backward()
        opt.step()
    return model, opt


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        # torch.distributed.checkpoint's loader turns tuples in param groups (Adam's betas) into lists
        return (
            isinstance(b, (list, tuple))
            and len(a) == len(b)
            and all(_same(x, y) for x, y in zip(a, b, strict=True))
        )
    return bool(a == b)


def test_model_state_dict_equals_torch_distributed_checkpoint() -> None:
    model, _ = _model_and_optimizer(0)
    assert _same(full_model_state_dict(model), dict(get_model_state_dict(model, options=FULL)))


def test_optimizer_state_dict_equals_torch_distributed_checkpoint() -> None:
    model, opt = _model_and_optimizer(0)
    ours = full_optimizer_state_dict(model, opt)
    assert _same(ours, dict(get_optimizer_state_dict(model, opt, options=FULL)))
    assert set(ours["state"]) == {"0.weight", "0.bias", "2.weight", "2.bias"}


def test_loading_either_layout_restores_the_optimizer_exactly() -> None:
    model, opt = _model_and_optimizer(0)
    saved = full_optimizer_state_dict(model, opt)
    for loader in ("ours", "dcp"):
        fresh_model, fresh_opt = _model_and_optimizer(1)
        load_full_model_state_dict(fresh_model, full_model_state_dict(model))
        if loader == "ours":
            load_full_optimizer_state_dict(fresh_model, fresh_opt, saved)
        else:
            set_optimizer_state_dict(
                fresh_model, fresh_opt, saved, options=StateDictOptions(full_state_dict=True)
            )
        assert _same(fresh_opt.state_dict(), opt.state_dict()), loader
        assert _same(fresh_model.state_dict(), model.state_dict()), loader


def test_loading_matches_parameters_by_name_not_by_position() -> None:
    model, opt = _model_and_optimizer(0)
    saved = full_optimizer_state_dict(model, opt)
    saved["param_groups"] = [{**g, "params": g["params"][::-1]} for g in saved["param_groups"]]
    fresh_model, fresh_opt = _model_and_optimizer(1)
    load_full_optimizer_state_dict(fresh_model, fresh_opt, saved)
    assert _same(fresh_opt.state_dict(), opt.state_dict())


def test_a_state_of_other_parameters_is_refused_with_their_names() -> None:
    model, opt = _model_and_optimizer(0)
    saved = full_optimizer_state_dict(model, opt)
    saved["param_groups"][0]["params"] = ["0.weight", "head.bias"]
    with pytest.raises(ValueError, match=r"head\.bias"):
        load_full_optimizer_state_dict(model, opt, saved)


def test_the_actor_worker_module_imports_without_fsdp() -> None:
    # Ray imports an actor's module in every process that looks the actor up; FSDP costs ~2 s of CPU there.
    code = (
        "import sys\n"
        "from rlinf_models import EmbodiedActorWorker\n"
        "assert 'torch.distributed.fsdp' not in sys.modules\n"
        "assert 'torch.distributed.checkpoint' not in sys.modules\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
