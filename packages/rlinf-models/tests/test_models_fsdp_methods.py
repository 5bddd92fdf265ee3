"""``shard_module`` gathers a unit around the methods its class lists in ``FSDP_FORWARD_METHODS``.

A toy network used the way the VLA policies use theirs: never through ``forward``, through methods that call
each other (nested), are called repeatedly in one forward (denoising steps) and return ``attrs`` objects. Two
gloo ranks, each on half the batch, make the one-rank SGD step.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

import attrs
import torch
from rlinf_models._fsdp import full_model_state_dict, init_distributed, shard_module
from torch import nn


@attrs.frozen
class Encoded:
    hidden: torch.Tensor


class Net(nn.Module):
    FSDP_FORWARD_METHODS: ClassVar[tuple[str, ...]] = ("encode", "step", "readout", "loss")

    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Linear(4, 8)
        self.head = nn.Linear(8, 8)
        self.out = nn.Linear(8, 1)

    def encode(self, x: torch.Tensor) -> Encoded:
        return Encoded(torch.tanh(self.enc(x)))

    def step(self, h: torch.Tensor, e: Encoded) -> torch.Tensor:
        return torch.tanh(self.head(h) + e.hidden)

    def readout(self, h: torch.Tensor) -> torch.Tensor:
        return self.out(h)

    def loss(self, x: torch.Tensor) -> torch.Tensor:
        """Calls the other registered methods (nested)."""
        e = self.encode(x)
        return self.readout(self.step(e.hidden, e)).square().mean()


class Policy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.model = Net()
        self.scale = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e = self.model.encode(x)
        h = e.hidden
        for _ in range(3):  # repeated calls within one forward
            h = self.model.step(h, e)
        return self.scale * self.model.readout(h).mean() + self.model.loss(x)


def sgd_step(rank: int, world: int) -> dict[str, torch.Tensor]:
    """One SGD step on rank ``rank``'s half (all of it on one rank); the full state dict (rank 0)."""
    torch.manual_seed(0)
    policy: nn.Module = Policy()
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(1))[rank::world]
    if world > 1:
        policy = shard_module(policy, init_distributed(torch.device("cpu")))
        assert all(isinstance(p, torch.distributed.tensor.DTensor) for p in policy.parameters())
    opt = torch.optim.SGD(policy.parameters(), lr=0.5)
    policy(x).backward()
    opt.step()
    return full_model_state_dict(policy)


_RANK = """
import sys, torch
sys.path.insert(0, sys.argv[1])
from test_models_fsdp_methods import sgd_step
state = sgd_step(int(sys.argv[2]), 2)
if sys.argv[2] == "0":
    torch.save(state, sys.argv[3])
"""


def test_two_ranks_gather_around_the_listed_methods_and_make_the_one_rank_step(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    out = tmp_path / "state.pt"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RANK, str(Path(__file__).parent), str(rank), str(out)],
            env={**env, "RANK": str(rank)},
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    for rank, proc in enumerate(procs):
        _, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, f"rank {rank}:\n{err[-3000:]}"
    two: dict[str, torch.Tensor] = torch.load(out)
    one = sgd_step(0, 1)
    torch.manual_seed(0)
    initial = Policy().state_dict()
    assert two.keys() == one.keys() == initial.keys()
    for key, value in one.items():
        assert not torch.equal(value, initial[key]), key  # every parameter learned
        torch.testing.assert_close(two[key], value, atol=1e-6, rtol=0, msg=key)


class _Bad(nn.Module):
    FSDP_FORWARD_METHODS: ClassVar[tuple[str, ...]] = ("lin",)

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)


_BAD = """
import sys, torch
sys.path.insert(0, sys.argv[1])
from test_models_fsdp_methods import _Bad
from rlinf_models._fsdp import init_distributed, shard_module
try:
    shard_module(_Bad(), init_distributed(torch.device("cpu")))
except ValueError as e:
    print(e)
"""


def test_a_listed_name_that_is_not_a_method_is_refused() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    out = subprocess.run(
        [sys.executable, "-c", _BAD, str(Path(__file__).parent)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "_Bad.FSDP_FORWARD_METHODS lists 'lin', which is not a method" in out.stdout
