"""Point-to-point send/recv and broadcast between workers of different groups on one node."""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Iterator
from typing import Any

import cloudpickle
import numpy as np
import pytest
import ray
import torch
from rlinf_scheduler import Cluster, PackedPlacementStrategy, Worker, WorkerGroup
from rlinf_scheduler._comm import CommMixin

pytestmark = pytest.mark.ray

cloudpickle.register_pickle_by_value(sys.modules[__name__])

BIG = 512 * 1024  # float32 elements: 2 MB, above the inline limit, so it takes the shared-memory path
INLINE_F32 = 60_000  # float32 elements: 240 KB, the largest kind of message that travels inside its frame


@dataclasses.dataclass
class Batch:
    obs: torch.Tensor
    extras: dict[str, Any]


class Peer(Worker):
    def send_to(self, obj: Any, group: str, rank: int) -> None:
        self.send(obj, group, rank)

    def recv_from(self, group: str, rank: int, timeout: float = 30) -> Any:
        return self.recv(group, rank, timeout=timeout)

    # Worker records any exception escaping a public method (even a nested call) as a run failure, so
    # the expected errors below go through CommMixin's unwrapped methods.
    def recv_error(self, group: str, rank: int, timeout: float) -> str:
        start = time.monotonic()
        try:
            CommMixin.recv(self, group, rank, timeout=timeout)
        except TimeoutError as e:
            return f"{type(e).__name__} after {time.monotonic() - start:.2f}: {e}"
        return "received"

    def call_error(self, method: str, *args: Any) -> str:
        try:
            getattr(CommMixin, method)(self, *args)
        except (ValueError, RuntimeError) as e:
            return f"{type(e).__name__}: {e}"
        return "ok"

    def timed_error(self, method: str, *args: Any) -> tuple[str, float]:
        start = time.monotonic()
        try:
            result = getattr(CommMixin, method)(self, *args)
            if method == "irecv":
                result.wait(0.1)
        except (ValueError, RuntimeError, TimeoutError) as e:
            return f"{type(e).__name__}: {e}", time.monotonic() - start
        return "ok", time.monotonic() - start

    def send_many(self, group: str, rank: int, n: int) -> None:
        for i in range(n):
            payload = torch.full((BIG,), float(i)) if i % 3 == 0 else {"i": i}
            self.send(payload, group, rank)

    def recv_many(self, group: str, rank: int, n: int) -> list[int]:
        out = []
        for _ in range(n):
            obj = self.recv(group, rank, timeout=30)
            out.append(int(obj[0].item()) if isinstance(obj, torch.Tensor) else obj["i"])
        return out

    def exchange(self, group: str, rank: int, n: int) -> list[float]:
        # Both sides call this at once: every send goes out before any recv (crossed directions).
        works = [self.isend(torch.full((BIG,), float(self.rank * 100 + i)), group, rank) for i in range(n)]
        works += [self.isend({"small": i}, group, rank) for i in range(n)]
        for w in works:
            w.wait(timeout=30)
        got = [float(self.recv(group, rank, timeout=30)[0]) for _ in range(n)]
        got += [float(self.recv(group, rank, timeout=30)["small"]) for _ in range(n)]
        return got

    def claim_then_cross(self, group: str, rank: int, n: int) -> tuple[bool, list[int]]:
        # Both sides call this at once. After the hello, each holds the other's connection claimed; then both
        # send n inline messages (more bytes than the sockets buffer) before receiving any.
        self.send({"hello": self.rank}, group, rank)
        self.recv(group, rank, timeout=30)  # the first frame makes the peer's connection known
        claimed = self._comm().conns[(group, rank)].claim(5.0)  # as a receive that has to wait does
        payload = np.zeros(INLINE_F32, np.float32)
        for i in range(n):
            payload[0] = i
            self.send(payload, group, rank)
        return claimed, [int(self.recv(group, rank, timeout=60)[0]) for _ in range(n)]

    def claim_then_sleep(self, group: str, rank: int, seconds: float, n: int) -> tuple[bool, list[int]]:
        self.recv(group, rank, timeout=30)  # the first frame makes the peer's connection known
        self.send("ready", group, rank)
        self.recv(group, rank, timeout=30)  # waits, so it claims the connection (almost always)
        claimed = self._comm().conns[(group, rank)].claim(5.0)  # (and surely)
        time.sleep(seconds)  # busy with something else: the claim must not stop the peer's sends
        return claimed, [int(self.recv(group, rank, timeout=60)[0]) for _ in range(n)]

    def hello_then_flood(self, group: str, rank: int, n: int) -> float:
        self.send("hello", group, rank)
        self.recv(group, rank, timeout=30)
        self.send("hello again", group, rank)
        payload = np.zeros(INLINE_F32, np.float32)
        start = time.monotonic()
        for i in range(n):
            payload[0] = i
            self.send(payload, group, rank)
        return time.monotonic() - start

    def buffered(self, group: str, rank: int) -> int:
        return len(self._comm().inbox((group, rank), "p2p").ready)

    def irecv_then_check(self, group: str, rank: int) -> tuple[bool, bool, float]:
        work = self.irecv(group, rank)
        before = work.done()
        deadline = time.monotonic() + 30
        while not work.done() and time.monotonic() < deadline:
            time.sleep(0.01)
        after = work.done()
        return before, after, float(work.wait(timeout=5).sum())

    def bcast(self, obj: Any, groups: list[tuple[str, Any]], src: tuple[str, int]) -> Any:
        return self.broadcast(obj, groups, src, timeout=30)

    def bcast_default(self, obj: Any, groups: list[tuple[str, Any]]) -> Any:
        return self.broadcast(obj, groups, timeout=30)

    def transport_stats(self) -> dict[str, int]:
        return dict(self._comm().stats)

    def pool_stats(self) -> dict[str, int]:
        return self._comm().pool.stats()

    def send_cuda(self, group: str, rank: int) -> None:
        payload = {"g": torch.arange(BIG, device="cuda", dtype=torch.float32), "c": torch.ones(2)}
        self.send(payload, group, rank)

    def recv_devices(self, group: str, rank: int) -> tuple[str, str, float]:
        got = self.recv(group, rank, timeout=60)
        return got["g"].device.type, got["c"].device.type, float(got["g"].sum().cpu())

    def recv_mutate_and_report(self, group: str, rank: int) -> tuple[float, bool]:
        t = self.recv(group, rank, timeout=30)
        t += 1  # received tensors are writable
        return float(t.sum()), bool(t.is_contiguous())


@pytest.fixture(scope="module")
def groups() -> Iterator[tuple[WorkerGroup, WorkerGroup]]:
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        with Cluster(num_nodes=1, simulated_accelerators_per_node=3) as cluster:
            a = Peer.create_group().launch(cluster, PackedPlacementStrategy(0, 1), name="ca")
            b = Peer.create_group().launch(cluster, PackedPlacementStrategy(2, 2), name="cb")
            yield a, b
    finally:
        ray.shutdown()


def test_payload_kinds_roundtrip(groups: tuple[WorkerGroup, WorkerGroup]) -> None:
    a, b = groups
    payload = {
        "f32": torch.arange(12, dtype=torch.float32).reshape(3, 4),
        "bf16": torch.linspace(0, 1, 7, dtype=torch.bfloat16),
        "bool": torch.tensor([True, False, True]),
        "scalar": torch.tensor(3.5),
        "empty": torch.empty(0, 5),
        "strided": torch.arange(20.0).reshape(4, 5).t(),
        "grad": torch.ones(2, requires_grad=True),
        "param": torch.nn.Parameter(torch.zeros(2)),
        "np": np.arange(6, dtype=np.int16).reshape(2, 3),
        "np_obj": np.array(["x", None], dtype=object),
        "nested": [Batch(torch.ones(2, 2), {"k": (torch.zeros(1), "s")}), {1, 2}],
        "big": torch.randn(BIG),
        "fn": lambda x: x + 1,
    }
    recv = b.execute_on(0).recv_from("ca", 0)
    a.execute_on(0).send_to(payload, "cb", 0).wait(timeout=60)
    (got,) = recv.wait(timeout=60)
    for key in ["f32", "bf16", "bool", "scalar", "empty", "strided", "big"]:
        assert got[key].dtype == payload[key].dtype and got[key].shape == payload[key].shape, key
        assert torch.equal(got[key], payload[key]), key
    assert got["grad"].requires_grad and torch.equal(got["grad"].detach(), torch.ones(2))
    assert isinstance(got["param"], torch.nn.Parameter)
    assert got["np"].dtype == np.int16 and np.array_equal(got["np"], payload["np"])
    assert list(got["np_obj"]) == ["x", None]
    batch = got["nested"][0]
    # (Batch travels by value: a class rebuilt from its pickle, so compare by name.)
    assert dataclasses.is_dataclass(batch) and type(batch).__name__ == "Batch"
    assert torch.equal(batch.obs, torch.ones(2, 2))
    assert torch.equal(batch.extras["k"][0], torch.zeros(1)) and batch.extras["k"][1] == "s"
    assert got["nested"][1] == {1, 2}
    assert got["fn"](1) == 2
    assert a.execute_on(0).transport_stats().wait(timeout=30)[0]["shm"] >= 1


def test_fifo_per_pair_with_mixed_sizes(groups: tuple[WorkerGroup, WorkerGroup]) -> None:
    a, b = groups
    n = 60
    recv = b.execute_on(0).recv_many("ca", 1, n)
    a.execute_on(1).send_many("cb", 0, n).wait(timeout=120)
    assert recv.wait(timeout=120) == [list(range(n))]


def test_crossed_sends_do_not_deadlock(groups: tuple[WorkerGroup, WorkerGroup]) -> None:
    a, b = groups
    n = 5
    left = a.execute_on(0).exchange("cb", 0, n)
    right = b.execute_on(0).exchange("ca", 0, n)
    (got_a,) = left.wait(timeout=120)
    (got_b,) = right.wait(timeout=120)
    assert got_a == [float(i) for i in range(n)] + [float(i) for i in range(n)]  # cb rank 0 sends 0*100+i
    assert got_b == [float(i) for i in range(n)] * 2  # ca rank 0 also has rank 0


def test_claimed_connections_do_not_deadlock_crossed_inline_floods(
    groups: tuple[WorkerGroup, WorkerGroup],
) -> None:
    # A receive reads its peer's connection itself and keeps it claimed; a send that would block gives the
    # claims back to the reader threads, so two workers flooding each other still drain each other.
    a, b = groups
    n = 60  # 14 MB each way: more than two loopback sockets buffer
    left = a.execute_on(0).claim_then_cross("cb", 0, n)
    right = b.execute_on(0).claim_then_cross("ca", 0, n)
    for claimed, got in (left.wait(timeout=120)[0], right.wait(timeout=120)[0]):
        assert claimed
        assert got == list(range(n))


def test_an_idle_claim_goes_back_to_the_reader_thread(groups: tuple[WorkerGroup, WorkerGroup]) -> None:
    # The receiver claims the connection, then sleeps inside the same method: its reader thread takes the
    # connection back and drains it, so the sender is not held up until the receiver reads again.
    a, b = groups
    n, sleep_s = 100, 6.0  # 24 MB: far more than the sockets buffer
    recv = a.execute_on(0).claim_then_sleep("cb", 0, sleep_s, n)
    (sent_s,) = b.execute_on(0).hello_then_flood("ca", 0, n).wait(timeout=120)
    claimed, got = recv.wait(timeout=120)[0]
    assert claimed and got == list(range(n))
    assert sent_s < sleep_s / 2, f"the sender waited {sent_s:.1f} s for a claimed connection"
    # After the method returned, the reader thread buffers what arrives while nobody receives.
    b.execute_on(0).send_many("ca", 0, 3).wait(timeout=60)
    deadline = time.monotonic() + 30
    while a.execute_on(0).buffered("cb", 0).wait(timeout=30)[0] < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert a.execute_on(0).buffered("cb", 0).wait(timeout=30)[0] == 3
    assert a.execute_on(0).recv_many("cb", 0, 3).wait(timeout=60)[0] == [0, 1, 2]


def test_isend_irecv_work(groups: tuple[WorkerGroup, WorkerGroup]) -> None:
    a, b = groups
    check = b.execute_on(0).irecv_then_check("ca", 1)
    time.sleep(0.3)
    a.execute_on(1).send_to(torch.ones(BIG), "cb", 0).wait(timeout=60)
    (before, after, total) = check.wait(timeout=60)[0]
    assert before is False and after is True and total == BIG


def test_recv_timeout_names_the_peer(groups: tuple[WorkerGroup, WorkerGroup]) -> None:
    _, b = groups
    (msg,) = b.execute_on(0).recv_error("ca", 1, 0.3).wait(timeout=30)
    assert msg.startswith("TimeoutError after 0.")
    assert "('ca', 1)" in msg


def test_invalid_peers_are_clear_errors(groups: tuple[WorkerGroup, WorkerGroup]) -> None:
    a, _ = groups
    r = a.execute_on(0)
    assert r.call_error("send", 1, "ca", 0).wait(timeout=30) == [
        "ValueError: a worker cannot send to itself: ('ca', 0)"
    ]
    (msg,) = r.call_error("send", 1, "nope", 3).wait(timeout=30)
    assert msg.startswith("ValueError: no worker ('nope', 3)")
    (msg,) = r.call_error("send", 1, "cb", -1).wait(timeout=30)
    assert msg == "ValueError: destination rank must be an int >= 0, got -1"


@pytest.mark.parametrize(
    ("method", "args", "expected"),
    [
        ("recv", ("nope", 0), "no worker ('nope', 0)"),
        ("recv", ("cb", 7), "no worker ('cb', 7)"),
        ("irecv", ("cb", 7), "no worker ('cb', 7)"),
        ("send", (1, "cb", 7), "no worker ('cb', 7)"),
        ("send", (torch.ones(BIG), "nope", 0), "no worker ('nope', 0)"),
        ("broadcast", (1, [("ca", [0, 1]), ("cb", 7)], ("ca", 0)), "no worker ('cb', 7)"),
        ("broadcast", (None, [("ca", [0, 1]), ("nope", 0)], ("ca", 1)), "no worker ('nope', 0)"),
    ],
)
def test_unknown_peers_fail_at_once_naming_them(
    groups: tuple[WorkerGroup, WorkerGroup], method: str, args: tuple[Any, ...], expected: str
) -> None:
    a, _ = groups
    # recv without a timeout would wait for ever if the peer were not checked.
    (msg, seconds) = a.execute_on(0).timed_error(method, *args).wait(timeout=30)[0]
    assert msg.startswith(f"ValueError: {expected}"), msg
    assert seconds < 2.0, (msg, seconds)
    if expected.startswith("no worker ('cb'"):
        assert "group 'cb' has ranks 0..0" in msg
    else:
        assert "no group 'nope' runs" in msg and "'ca'" in msg and "'cb'" in msg


def test_broadcast_source_defaults_to_the_first_listed_worker(
    groups: tuple[WorkerGroup, WorkerGroup],
) -> None:
    a, b = groups
    listed = [("cb", 0), ("ca", [1, 0])]  # RLinf's rule: the first worker listed is the source
    calls = [
        b.execute_on(0).call("bcast_default", {"w": torch.arange(4)}, listed),
        a.call("bcast_default", None, listed),
    ]
    results = [r for c in calls for r in c.wait(timeout=60)]
    assert all(torch.equal(r["w"], torch.arange(4)) for r in results)


def test_received_tensor_is_a_private_writable_copy(groups: tuple[WorkerGroup, WorkerGroup]) -> None:
    a, b = groups
    recv = b.execute_on(0).recv_mutate_and_report("ca", 0)
    a.execute_on(0).send_to(torch.zeros(BIG), "cb", 0).wait(timeout=60)
    assert recv.wait(timeout=60) == [(float(BIG), True)]


def test_shared_memory_segments_are_reused(groups: tuple[WorkerGroup, WorkerGroup]) -> None:
    a, b = groups
    (before,) = a.execute_on(1).pool_stats().wait(timeout=30)
    for i in range(6):
        recv = b.execute_on(0).recv_from("ca", 1)
        a.execute_on(1).send_to(torch.full((BIG,), float(i)), "cb", 0).wait(timeout=60)
        (got,) = recv.wait(timeout=60)
        assert float(got[0]) == i
        del got
    # The receiver dropped each tensor before the next send: the same arena chunks serve them all.
    (after,) = a.execute_on(1).pool_stats().wait(timeout=30)
    assert after == {"arenas": max(before["arenas"], 1), "segments": before["segments"], "busy_chunks": 0}


@pytest.mark.parametrize("size", [4, BIG])
def test_broadcast_same_result_whatever_the_group_order(
    groups: tuple[WorkerGroup, WorkerGroup], size: int
) -> None:
    a, b = groups
    obj = {"w": torch.arange(size, dtype=torch.float32), "step": 7}
    spec = [("ca", [0, 1]), ("cb", 0)]
    calls = [
        a.execute_on(0).bcast(obj, spec, ("ca", 1)),
        a.execute_on(1).bcast(obj, spec, ("ca", 1)),
        b.execute_on(0).bcast(None, list(reversed(spec)), ("ca", 1)),
    ]
    results = [c.wait(timeout=60)[0] for c in calls]
    for got in results:
        assert got["step"] == 7 and torch.equal(got["w"], obj["w"])


def test_broadcast_rejects_a_source_outside_groups(groups: tuple[WorkerGroup, WorkerGroup]) -> None:
    a, _ = groups
    (msg,) = a.execute_on(0).call_error("broadcast", 1, [("ca", [0, 1])], ("cb", 0)).wait(timeout=30)
    assert msg.startswith("ValueError: broadcast source ('cb', 0) is not among groups")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_tensors_arrive_on_a_gpu(groups: tuple[WorkerGroup, WorkerGroup]) -> None:
    a, b = groups
    recv = b.execute_on(0).recv_devices("ca", 0)
    a.execute_on(0).send_cuda("cb", 0).wait(timeout=60)
    assert recv.wait(timeout=60) == [("cuda", "cpu", float(BIG * (BIG - 1) / 2))]
