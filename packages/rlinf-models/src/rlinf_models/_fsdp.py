"""FSDP2 (``torch.distributed.fsdp.fully_shard``) helpers: process group, sharding, full state dicts, offload, files.

CPU runs use gloo, CUDA runs NCCL (with gloo kept for CPU-side collectives). One rank needs none of this: the
module stays a plain ``nn.Module`` and the same full-state-dict functions work on it without a process group.

``torch.distributed.fsdp`` and ``torch.distributed.checkpoint`` load on first use (importing them costs ~2 s of
CPU): a one-rank actor never loads them for its weights, and a process that only looks up an actor worker (Ray
imports the worker's module there) does not pay for them either. For a plain module the full state dicts are
built directly, in the same layout as ``torch.distributed.checkpoint.state_dict`` gives (parameter names as
keys), so checkpoints move freely between one rank and many.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import os
import sys
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import Any, cast

import attrs
import torch
import torch.distributed as dist
from rlinf_core.checkpoint import atomic_write_bytes, capture_rng_state, restore_rng_state
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

__all__ = [
    "full_model_state_dict",
    "full_optimizer_state_dict",
    "init_distributed",
    "load_full_model_state_dict",
    "load_full_optimizer_state_dict",
    "load_rank_rng",
    "move_training_state",
    "save_checkpoint_files",
    "save_rank_rng",
    "select_device",
    "shard_module",
]


def _is_sharded(module: nn.Module) -> bool:
    """Whether ``fully_shard`` was applied to ``module`` (it cannot have been if FSDP was never imported)."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    return fsdp is not None and isinstance(module, fsdp.FSDPModule)


def _dcp() -> Any:
    import torch.distributed.checkpoint.state_dict as dcp

    return dcp


def _full_options(*, cpu_offload: bool) -> Any:
    return _dcp().StateDictOptions(full_state_dict=True, cpu_offload=cpu_offload)


def _param_names(module: nn.Module, optimizer: torch.optim.Optimizer) -> list[list[str]]:
    """The parameter names of each of ``optimizer``'s groups, in the optimizer's order."""
    names = {id(p): n for n, p in module.named_parameters()}
    out = []
    for group in optimizer.param_groups:
        missing = [i for i, p in enumerate(group["params"]) if id(p) not in names]
        if missing:
            raise ValueError(f"optimizer parameters {missing} of a group are not parameters of the module")
        out.append([names[id(p)] for p in group["params"]])
    return out


def init_distributed(device: torch.device) -> DeviceMesh:
    """Join the default process group from ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT``; return a 1-D mesh.

    Args:
        device: ``cpu`` (gloo) or ``cuda`` (NCCL for CUDA tensors, gloo for CPU ones).
    """
    if device.type == "cuda":
        torch.cuda.set_device(device)  # the placement made this process's GPU(s) the only visible ones
    if not dist.is_initialized():
        backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend)
    return init_device_mesh(device.type, (dist.get_world_size(),))


FORWARD_METHODS_ATTR = "FSDP_FORWARD_METHODS"
"""The class attribute (``ClassVar[tuple[str, ...]]``) naming the methods, besides ``forward``, through which
callers use a module's parameters; :func:`shard_module` has FSDP2 all-gather the unit around each of them."""


def _output_tensors(out: Any) -> list[torch.Tensor]:
    """The tensors in a method's output, also inside ``attrs`` classes (FSDP2's traversal skips those)."""
    if isinstance(out, torch.Tensor):
        return [out]
    if attrs.has(type(out)):
        out = [getattr(out, f.name) for f in attrs.fields(type(out))]
    elif dataclasses.is_dataclass(out) and not isinstance(out, type):
        out = [getattr(out, f.name) for f in dataclasses.fields(out)]
    elif isinstance(out, Mapping):
        out = list(out.values())
    if isinstance(out, list | tuple):
        return [t for x in out for t in _output_tensors(x)]
    return []


def _register_forward_methods(module: nn.Module) -> None:
    """Make each method named by ``type(module).FSDP_FORWARD_METHODS`` gather ``module``'s unit, as ``forward`` does.

    ``torch.distributed.fsdp.register_fsdp_forward_method`` runs the unit's pre-/post-forward hooks around a
    method: the parameters are gathered for the call, and the post-forward hook puts a pre-backward hook (which
    gathers them again for the backward) on the output's tensors. Two things it does not cover are handled here:

    - Nested calls: when one registered method calls another (π0's ``flow_matching_loss`` calls ``velocity``,
      which calls ``expert_output``), the inner post-forward hook would reshard the parameters while the outer
      method still uses them. Only the outermost call runs the hooks; nested ones run as plain methods.
    - Outputs the hooks cannot see: FSDP2 looks for tensors in tensors, tuples, lists, dicts and dataclasses,
      not in ``attrs`` classes (``PrefixCache``, OpenVLA's ``ActionSample``); without a pre-backward hook the
      backward would meet resharded parameters. The hooked method also returns the output's tensors, found
      by :func:`_output_tensors`, for the hooks to see.

    Repeated (not nested) calls within one forward/backward (the denoising steps) each gather the unit, and
    each one's backward gathers it again and adds its reduce-scattered gradient into the same sharded ``.grad``.

    Raises:
        ValueError: a listed name is not a method of ``module``.
    """
    from torch.distributed.fsdp import register_fsdp_forward_method

    names: tuple[str, ...] = getattr(type(module), FORWARD_METHODS_ATTR, ())
    depth = [0]  # registered calls of this unit now running
    for name in names:
        plain = getattr(module, name, None)
        if not callable(plain) or isinstance(plain, nn.Module):
            raise ValueError(
                f"{type(module).__name__}.{FORWARD_METHODS_ATTR} lists {name!r}, which is not a method"
            )

        def exposed(*args: Any, _plain: Any = plain, **kwargs: Any) -> tuple[Any, list[torch.Tensor]]:
            out = _plain(*args, **kwargs)
            return out, _output_tensors(out)

        hooked_name = f"_fsdp_gathered_{name}"
        setattr(module, hooked_name, exposed)
        register_fsdp_forward_method(module, hooked_name)
        gathering = getattr(module, hooked_name)

        def call(*args: Any, _plain: Any = plain, _gathering: Any = gathering, **kwargs: Any) -> Any:
            if depth[0]:
                return _plain(*args, **kwargs)
            depth[0] += 1
            try:
                return _gathering(*args, **kwargs)[0]
            finally:
                depth[0] -= 1

        setattr(module, name, functools.wraps(plain)(call))


def shard_module(module: nn.Module, mesh: DeviceMesh, *, cpu_offload: bool = False) -> nn.Module:
    """Apply ``fully_shard`` to every direct child holding trainable parameters, then to the root (in place).

    Each child is one all-gather unit (each member of a ``ModuleList`` / ``ModuleDict`` child, e.g. the Q
    heads); parameters of the root itself (e.g. a state-independent ``log_std``) belong to the root unit.
    FSDP2 gathers a unit's parameters around its ``forward`` only: a unit whose class lists other entry points
    in ``FSDP_FORWARD_METHODS`` (a VLA network, which its policy calls through ``encode_prefix``,
    ``expert_output``, ``value``, ...) is gathered around those too (see :func:`_register_forward_methods`).
    Its parameters must then be used only inside its ``forward`` or those methods.
    ``cpu_offload`` keeps the sharded parameters and optimizer state on the CPU between uses
    (``CPUOffloadPolicy``; meaningful on CUDA only).

    Returns:
        ``module`` (now an FSDP module whose parameters are sharded ``DTensor``s).
    """
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

    kwargs: dict[str, Any] = {"mesh": mesh}
    if cpu_offload and mesh.device_type == "cuda":
        kwargs["offload_policy"] = CPUOffloadPolicy()
    for child in module.children():
        # A container has no forward of its own (FSDP2 gathers around forward): shard its members instead.
        members = list(child.children()) if isinstance(child, nn.ModuleList | nn.ModuleDict) else [child]
        for member in members:
            if any(p.requires_grad for p in member.parameters()):
                fully_shard(member, **kwargs)
                _register_forward_methods(member)
    fully_shard(module, **kwargs)
    _register_forward_methods(module)
    return module


def full_model_state_dict(module: nn.Module, keys: Collection[str] | None = None) -> dict[str, torch.Tensor]:
    """The full (unsharded) CPU state dict on rank 0 and ``{}`` on other ranks (collective under FSDP2).

    For a plain module (one rank) this is simply a CPU copy of its state dict. ``keys``: only these entries
    (the others are not copied to the CPU; under FSDP2 they are gathered, then dropped).
    """
    if not _is_sharded(module):
        return {k: v.cpu() for k, v in module.state_dict().items() if keys is None or k in keys}
    # Full state dicts of modules hold plain tensors only (ValueType also covers optimizer-state leaves).
    state = cast(
        dict[str, torch.Tensor],
        _dcp().get_model_state_dict(module, options=_full_options(cpu_offload=True)),
    )
    return state if keys is None else {k: v for k, v in state.items() if k in keys}


def full_optimizer_state_dict(module: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The full optimizer state keyed by parameter names (rank 0; ``{}`` elsewhere; collective under FSDP2).

    ``{"state": {name: {...}}, "param_groups": [{..., "params": [name, ...]}]}``, as
    ``torch.distributed.checkpoint.state_dict.get_optimizer_state_dict`` gives it.
    """
    if not _is_sharded(module):
        by_index = optimizer.state_dict()
        names = [n for group in _param_names(module, optimizer) for n in group]
        state = {
            names[i]: {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in s.items()}
            for i, s in by_index["state"].items()
        }
        groups = [{**g, "params": [names[i] for i in g["params"]]} for g in by_index["param_groups"]]
        return {"state": state, "param_groups": groups}
    return cast(
        dict[str, Any],
        _dcp().get_optimizer_state_dict(module, optimizer, options=_full_options(cpu_offload=True)),
    )


def load_full_model_state_dict(module: nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Load a full state dict (every rank passes the same one; each keeps its shard)."""
    if not _is_sharded(module):
        module.load_state_dict(state)
        return
    full: dict[str, Any] = dict(state)
    _dcp().set_model_state_dict(module, full, options=_full_options(cpu_offload=False))


def load_full_optimizer_state_dict(
    module: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> None:
    """Load a full optimizer state dict saved by :func:`full_optimizer_state_dict` (any world size)."""
    if not _is_sharded(module):
        current = _param_names(module, optimizer)
        saved = [list(g["params"]) for g in state["param_groups"]]
        if [sorted(g) for g in saved] != [sorted(g) for g in current]:
            raise ValueError(
                f"optimizer state: its parameter groups {saved} do not hold the optimizer's parameters {current}"
            )
        index = {n: i for i, n in enumerate(n for group in current for n in group)}
        optimizer.load_state_dict(
            {
                "state": {index[n]: s for n, s in state["state"].items()},
                # in the optimizer's own order: load_state_dict pairs saved and current parameters by position
                "param_groups": [
                    {**g, "params": [index[n] for n in names]}
                    for g, names in zip(state["param_groups"], current, strict=True)
                ],
            }
        )
        return
    _dcp().set_optimizer_state_dict(module, optimizer, state, options=_full_options(cpu_offload=False))


def select_device() -> torch.device:
    """CUDA when the placement gave this process real GPUs (``RLINF_ACCELERATOR_TYPE=cuda``), else CPU."""
    if os.environ.get("RLINF_ACCELERATOR_TYPE", "cpu") == "cuda" and torch.cuda.is_available():
        return torch.device("cuda", 0)
    return torch.device("cpu")


def move_training_state(
    modules: Iterable[nn.Module], optimizer: torch.optim.Optimizer, device: torch.device
) -> None:
    """Move modules and the optimizer's tensor state (not its ``step`` counters) to ``device`` (offload/onload).

    Moving to the CPU empties the CUDA cache, so the freed memory is available to collocated workers.
    """
    for module in modules:
        module.to(device)
    for state in optimizer.state.values():
        for k, v in state.items():
            if isinstance(v, torch.Tensor) and k != "step":
                state[k] = v.to(device)
    if device.type == "cpu":
        torch.cuda.empty_cache()


def save_checkpoint_files(root: Path, files: Iterable[tuple[str, Any]]) -> None:
    """``torch.save`` each ``(name, obj)`` to ``root / name``, each file atomically."""
    for name, obj in files:
        buf = io.BytesIO()
        torch.save(obj, buf)
        atomic_write_bytes(root / name, buf.getvalue())


def save_rank_rng(root: Path, rank: int) -> None:
    """Write this process's RNG states to ``root / rng_rank<rank>.pkl`` (atomically)."""
    atomic_write_bytes(root / f"rng_rank{rank}.pkl", capture_rng_state())


def load_rank_rng(root: Path, rank: int) -> bool:
    """Restore what :func:`save_rank_rng` wrote; ``False`` when ``root`` has no file for ``rank``."""
    rng = root / f"rng_rank{rank}.pkl"
    if not rng.is_file():
        return False
    restore_rng_state(rng.read_bytes())
    return True
