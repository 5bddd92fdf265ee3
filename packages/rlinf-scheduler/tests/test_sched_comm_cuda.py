"""GPU transports of send/recv: route choice, CUDA-tagged metadata, NCCL link ordering, and (with GPUs) IPC/NCCL.

Most tests run on CPU: they check the logic around the CUDA calls (which path a payload takes, the split of a
payload into host bytes and device buffers, the announce-then-reuse protocol of the directed pair groups,
with a gloo group standing in for NCCL). The ``gpu`` tests need CUDA (the cross-node NCCL one is in ``test_sched_comm_cuda_multinode.py``).
"""

from __future__ import annotations

import dataclasses
import sys
import threading
from collections.abc import Iterator
from typing import Any

import cloudpickle
import numpy as np
import pytest
import ray
import torch
from rlinf_scheduler import Cluster, PackedPlacementStrategy, Worker, WorkerGroup, _comm
from rlinf_scheduler import _transport as tp
from rlinf_scheduler import _transport_cuda as tc
from rlinf_scheduler._transport_gloo import _build as build_gloo

cloudpickle.register_pickle_by_value(sys.modules[__name__])

BIG = 512 * 1024  # float32 elements: 2 MB, above the inline limit
HAS_CUDA = torch.cuda.is_available()
GPUS = torch.cuda.device_count() if HAS_CUDA else 0


# ------------------------------------------------------------------------------------------ CPU tests


@pytest.mark.parametrize(
    ("same_node", "src", "peer", "expected"),
    [
        (True, {"GPU-a"}, ("GPU-a",), "ipc"),
        (True, {"GPU-a"}, ("GPU-b", "GPU-a"), "ipc"),  # the receiver sees it under another index
        (True, {"GPU-a", "GPU-b"}, ("GPU-a",), "host"),  # one tensor's GPU is not visible there
        (True, {"GPU-a"}, ("GPU-b",), "host"),
        (True, {"GPU-a"}, (), "host"),  # receiver without CUDA
        (False, {"GPU-a"}, ("GPU-z",), "nccl"),
        (False, {"GPU-a"}, (), "host"),
    ],
)
def test_route_per_receiver(same_node: bool, src: set[str], peer: tuple[str, ...], expected: str) -> None:
    assert tc.route(same_node=same_node, src_uuids=src, peer_uuids=peer) == expected


def test_device_index_and_receiver_device() -> None:
    assert tc.device_index("cuda:3") == 3
    with pytest.raises(ValueError, match="must be a CUDA device, got 'cpu'"):
        tc.device_index("cpu")
    assert tc.local_device(1, 2) == 1
    assert tc.local_device(3, 2) == 0  # the receiver has fewer GPUs: its first one


def _as_cuda(enc: tp.Encoded, indices: list[int]) -> tp.Encoded:
    """Tag some specs of a CPU payload as CUDA tensors (what ``encode`` writes for them on a GPU)."""
    specs = [dataclasses.replace(s, device="cuda:0") if i in indices else s for i, s in enumerate(enc.specs)]
    return tp.Encoded(enc.meta, specs, enc.sources, enc.total)


def _payload() -> dict[str, Any]:
    return {
        "cpu": torch.arange(BIG, dtype=torch.float32),
        "w": torch.nn.Parameter(torch.randn(4, 5, dtype=torch.bfloat16)),
        "g": torch.randn(300, 7).requires_grad_(True),
        "np": np.arange(6, dtype=np.int16),
        "empty": torch.empty(0, 3),
        "z": torch.randn(2, 3, dtype=torch.complex64),
        "meta": {"step": 3},
    }


def test_split_device_moves_cuda_bytes_out_of_the_host_area() -> None:
    obj = _payload()
    enc = tp.encode(obj)
    names = ["cpu", "w", "g", "np", "empty", "z"]  # spec order is the order arrays are met
    assert tp.cuda_indices(enc) == []
    assert tp.cuda_indices(_as_cuda(enc, [4])) == []  # an empty CUDA tensor has no bytes to move
    cuda = _as_cuda(enc, [1, 2, 5])
    assert tp.cuda_indices(cuda) == [1, 2, 5]
    part = tp.split_device(cuda, [1, 2, 5], "nccl")
    assert [s.transport for s in part.specs] == ["host", "nccl", "nccl", "host", "host", "nccl"]
    host = [s for s in part.specs if s.transport == "host"]
    assert all(s.offset % 64 == 0 for s in host)
    assert part.total == sum(-(-s.nbytes // 64) * 64 for s in host) < enc.total
    # Host bytes go to the area; device specs are skipped by write_buffers and come as buffers instead.
    area = np.zeros(part.total, dtype=np.uint8)
    tp.write_buffers(part, area)
    device = {i: enc.sources[i].reshape(-1).view(torch.uint8) for i in tp.cuda_indices(cuda)}
    got = _comm._decode(None, ("a", 0), ("inline", part.meta, part.specs, area.tobytes()), device)  # type: ignore[arg-type]
    for name in names:
        assert type(got[name]) is type(obj[name])
        if isinstance(obj[name], torch.Tensor):
            assert got[name].dtype == obj[name].dtype and torch.equal(got[name].detach(), obj[name].detach())
            assert got[name].requires_grad == obj[name].requires_grad
    assert np.array_equal(got["np"], obj["np"]) and got["meta"] == {"step": 3}
    assert got["g"].data_ptr() == enc.sources[2].data_ptr()  # device buffers are viewed, not copied


def test_split_device_rejects_bad_arguments() -> None:
    enc = tp.encode({"t": torch.ones(3)})
    with pytest.raises(ValueError, match="transport must be 'ipc' or 'nccl', got 'gloo'"):
        tp.split_device(_as_cuda(enc, [0]), [0], "gloo")
    with pytest.raises(ValueError, match="spec 0 is on 'cpu', not a CUDA device"):
        tp.split_device(enc, [0], "ipc")


class _FakeWork:
    def __init__(self, done: bool) -> None:
        self.done, self.waited = done, False

    def is_completed(self) -> bool:
        return self.done

    def wait(self) -> None:
        self.waited = True


class _FakeLinks:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def post_recvs(self, peer: Any, src_dev: int, address: Any, sizes: list[int], device: Any) -> list[Any]:
        self.calls.append((peer, src_dev, address, list(sizes)))
        return [(_FakeWork(False), torch.full((n,), src_dev, dtype=torch.uint8)) for n in sizes]


def test_receiver_posts_nccl_receives_in_frame_order_and_decodes_them() -> None:
    enc = _as_cuda(tp.encode([torch.ones(4), torch.zeros(2, dtype=torch.int8), torch.ones(3)]), [0, 1, 2])
    part = tp.split_device(enc, [0, 1, 2], "nccl")
    st = _comm._CommState.__new__(_comm._CommState)  # only what _post touches
    st.lock = threading.Lock()
    st.nccl = _FakeLinks()
    entries = [(0, ("10.0.0.1", 1234), [(0, 16), (2, 12)]), (1, None, [(1, 2)])]
    msg = ("cuda", ("inline", part.meta, part.specs, b""), ("nccl", entries))
    posted = st._post(("a", 0), msg)
    assert st.nccl.calls == [(("a", 0), 0, ("10.0.0.1", 1234), [16, 12]), (("a", 0), 1, None, [2])]
    assert posted[0] == "cuda" and posted[2][0] == "nccl-posted" and sorted(posted[2][1]) == [0, 1, 2]
    assert not _comm._msg_done(posted)
    for work, _ in posted[2][1].values():
        work.done = True
    assert _comm._msg_done(posted)
    got = _comm._decode(st, ("a", 0), posted)
    assert all(w.waited for w, _ in posted[2][1].values())
    assert got[0].shape == (4,) and got[1].dtype == torch.int8 and got[2].shape == (3,)
    assert int(got[1][0]) == 1  # spec 1 came from the link of the sender's cuda:1


class _LazyGloo:
    """Builds its gloo group on first use, as ProcessGroupNCCL creates its communicator on the first op."""

    def __init__(self, store: Any, rank: int) -> None:
        self._args = (store, rank)
        self._pg: Any = None
        self._lock = threading.Lock()

    def _get(self) -> Any:
        with self._lock:
            if self._pg is None:
                self._pg = build_gloo(self._args[0], self._args[1], 30.0)
            return self._pg

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> Any:
        return self._get().send(tensors, dst, tag)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> Any:
        return self._get().recv(tensors, src, tag)


def test_directed_links_announce_once_and_keep_send_order() -> None:
    out, inn = tc.NcclLinks(_LazyGloo), tc.NcclLinks(_LazyGloo)
    try:
        with pytest.raises(RuntimeError, match="used before it was announced"):
            inn.post_recvs(("a", 0), 0, None, [4], torch.device("cpu"))
        link, address = out.sender(("b", 0), 0)
        assert address is not None and address[1] > 0
        again, no_address = out.sender(("b", 0), 0)
        assert again is link and no_address is None
        msgs = [
            [torch.arange(5, dtype=torch.float64) * k, torch.tensor([k] * 3, dtype=torch.int16)]
            for k in range(3)
        ]
        sent: list[Any] = []
        sender = threading.Thread(target=lambda: [sent.extend(out.post_sends(link, m)) for m in msgs])
        sender.start()
        got = [
            inn.post_recvs(("a", 0), 0, address if k == 0 else None, [40, 6], torch.device("cpu"))
            for k in range(3)
        ]
        for pairs in got:
            for work, _ in pairs:
                assert work.wait()
        sender.join(timeout=30)
        assert not sender.is_alive()
        for w in sent:
            w.wait()
        for k, pairs in enumerate(got):
            assert torch.equal(pairs[0][1].view(torch.float64), msgs[k][0])
            assert torch.equal(pairs[1][1].view(torch.int16), msgs[k][1])
    finally:
        out.close()
        inn.close()


# ------------------------------------------------------------------------------------------ GPU tests


class GpuPeer(Worker):
    def send_mixed(self, group: str, rank: int) -> float:
        g = torch.arange(BIG, device="cuda", dtype=torch.float32)
        self.send({"g": g, "c": torch.ones(BIG), "k": 7}, group, rank)
        g.fill_(-1.0)  # send returned: the buffer may be reused, the receiver must not see this
        return float(torch.arange(BIG, dtype=torch.float64).sum())

    def recv_mixed(self, group: str, rank: int) -> tuple[str, str, int, float, float]:
        got = self.recv(group, rank, timeout=120)
        torch.cuda.synchronize()
        return (
            got["g"].device.type,
            got["c"].device.type,
            got["k"],
            float(got["g"].double().sum()),
            float(got["c"].sum()),
        )

    def stats(self) -> dict[str, int]:
        return dict(self._comm().stats)


@pytest.fixture(scope="module")
def one_node_gpus() -> Iterator[tuple[WorkerGroup, WorkerGroup, WorkerGroup | None]]:
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        with Cluster(num_nodes=1) as cluster:
            a = GpuPeer.create_group().launch(cluster, PackedPlacementStrategy(0, 0), name="ga")
            b = GpuPeer.create_group().launch(cluster, PackedPlacementStrategy(0, 0), name="gb")  # same GPU
            c = (
                GpuPeer.create_group().launch(cluster, PackedPlacementStrategy(1, 1), name="gc")
                if GPUS > 1
                else None
            )
            yield a, b, c
    finally:
        ray.shutdown()


@pytest.mark.gpu
@pytest.mark.ray
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
def test_same_gpu_same_node_uses_cuda_ipc(one_node_gpus: tuple[WorkerGroup, WorkerGroup, Any]) -> None:
    a, b, _ = one_node_gpus
    recv = b.execute_on(0).recv_mixed("ga", 0)
    (expected,) = a.execute_on(0).send_mixed("gb", 0).wait(timeout=120)
    assert recv.wait(timeout=120) == [("cuda", "cpu", 7, expected, float(BIG))]
    assert a.execute_on(0).stats().wait(timeout=30)[0]["ipc"] >= 1


@pytest.mark.gpu
@pytest.mark.ray
@pytest.mark.skipif(GPUS < 2, reason="needs 2 CUDA devices")
def test_other_gpu_same_node_is_staged_through_host(
    one_node_gpus: tuple[WorkerGroup, WorkerGroup, Any],
) -> None:
    a, _, c = one_node_gpus
    before = a.execute_on(0).stats().wait(timeout=30)[0]
    recv = c.execute_on(0).recv_mixed("ga", 0)
    (expected,) = a.execute_on(0).send_mixed("gc", 0).wait(timeout=120)
    assert recv.wait(timeout=120) == [("cuda", "cpu", 7, expected, float(BIG))]
    after = a.execute_on(0).stats().wait(timeout=30)[0]
    assert after["ipc"] == before["ipc"] and after["shm"] > before["shm"]
