"""Timeline spans: the recorder, the busy / wait / idle sums, the trace file format, and spans from workers."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
from rlinf_scheduler import (
    COMPUTE,
    DRIVER,
    WAIT,
    Channel,
    Cluster,
    NodePlacementStrategy,
    ProcessTrace,
    Span,
    Timeline,
    Worker,
    enable_tracing,
    load_trace,
    now_us,
    take_trace,
    trace_span,
    tracing_enabled,
)
from rlinf_scheduler import _trace as trace_mod

cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture
def tracing() -> Iterator[None]:
    take_trace(DRIVER)  # nothing left over from another test
    enable_tracing(True)
    try:
        yield
    finally:
        enable_tracing(False)
        take_trace(DRIVER)


def _span(name: str, cat: str, start: float, end: float, thread: str = "main") -> Span:
    return Span(name, cat, start, end - start, thread)


def _proc(label: str, *spans: Span) -> ProcessTrace:
    return ProcessTrace(label, "host", 1, spans)


# ------------------------------------------------------------------------------------------------ recorder
def test_nothing_is_recorded_while_tracing_is_off() -> None:
    take_trace(DRIVER)
    assert not tracing_enabled()
    with trace_span("quiet"):
        pass
    assert take_trace(DRIVER).spans == ()


def test_spans_carry_name_category_thread_and_wall_clock(tracing: None) -> None:
    before = now_us()
    wall_before = time.time() * 1e6
    with trace_span("outer"), trace_span("inner", WAIT):
        time.sleep(0.02)

    def elsewhere() -> None:
        with trace_span("elsewhere"):
            pass

    worker = threading.Thread(target=elsewhere, name="helper")
    with trace_span("threaded"):
        worker.start()
        worker.join()
    out = take_trace(DRIVER)
    assert out.label == DRIVER
    by_name = {s.name: s for s in out.spans}
    assert by_name["inner"].cat == WAIT and by_name["outer"].cat == COMPUTE
    assert by_name["inner"].dur_us >= 20_000
    # the inner span lies within the outer one; both within the wall-clock window of the block
    assert by_name["outer"].start_us <= by_name["inner"].start_us
    assert by_name["inner"].end_us <= by_name["outer"].end_us
    assert before <= by_name["outer"].start_us
    assert abs(by_name["outer"].start_us - wall_before) < 50_000
    assert by_name["threaded"].thread == threading.current_thread().name
    assert by_name["elsewhere"].thread == "helper"
    assert take_trace(DRIVER).spans == ()  # taken means gone


def test_a_full_buffer_counts_what_it_drops(tracing: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trace_mod, "MAX_SPANS", 3)
    for _ in range(5):
        with trace_span("x"):
            pass
    out = take_trace(DRIVER)
    assert len(out.spans) == 3 and out.dropped == 2
    timeline = Timeline()
    timeline.add(out)
    assert timeline.spans(DRIVER) == out.spans


def test_worker_timer_records_a_span_of_its_category(tracing: None) -> None:
    class Local(Worker):
        pass

    w = Local()
    with w.timer("step"):
        pass
    with w.timer("blocked", wait=True):
        pass
    spans = {s.name: s.cat for s in w.pop_trace().spans}
    assert spans == {"step": COMPUTE, "blocked": WAIT}
    assert set(w.pop_timings()) == {"step", "blocked"}


# ------------------------------------------------------------------------------------------------- usage
def test_usage_subtracts_nested_waits_and_counts_threads_once() -> None:
    t = Timeline()
    t.add(
        _proc(
            "actor:0",
            _span("train", COMPUTE, 0, 600_000),
            _span("get", WAIT, 100_000, 300_000),  # inside train: waiting, not busy
            _span("log", COMPUTE, 500_000, 800_000, thread="other"),  # overlaps train on another thread
        )
    )
    u = t.usage(0, 1_000_000)["actor"]
    assert u.window_s == pytest.approx(1.0)
    assert u.busy_s == pytest.approx(0.6)  # [0, 0.8] minus the wait [0.1, 0.3]
    assert u.wait_s == pytest.approx(0.2)
    assert u.idle_s == pytest.approx(0.4)
    assert u.busy_frac == pytest.approx(0.6)


def test_usage_clips_to_the_window_and_averages_ranks() -> None:
    t = Timeline()
    t.add(_proc("env:0", _span("step", COMPUTE, -500_000, 500_000)))
    t.add(_proc("env:1"))  # no spans: idle the whole window
    t.add(_proc(DRIVER, _span("train_step", COMPUTE, 0, 1_000_000)))
    usage = t.usage(0, 1_000_000)
    assert usage["env"].busy_s == pytest.approx(0.25)  # (0.5 + 0) / 2
    assert usage["env"].idle_s == pytest.approx(0.75)
    assert usage[DRIVER].busy_frac == pytest.approx(1.0)


def test_usage_matches_a_brute_force_sweep() -> None:
    rng = __import__("random").Random(0)
    spans = []
    for i in range(60):
        a = rng.uniform(0, 1e6)
        spans.append(_span(f"s{i}", rng.choice((COMPUTE, WAIT)), a, a + rng.uniform(0, 2e5), f"t{i % 3}"))
    t = Timeline()
    t.add(_proc("rollout:0", *spans))
    u = t.usage(2e5, 9e5)["rollout"]
    # sweep the window in 1 µs-wide cells: busy = in some compute span and in no wait span
    busy = wait = 0
    for x in range(200_000, 900_000, 50):
        c = x + 25
        in_wait = any(s.cat == WAIT and s.start_us <= c < s.end_us for s in spans)
        in_compute = any(s.cat == COMPUTE and s.start_us <= c < s.end_us for s in spans)
        wait += in_wait
        busy += in_compute and not in_wait
    assert u.busy_s == pytest.approx(busy * 50 / 1e6, abs=2e-3)
    assert u.wait_s == pytest.approx(wait * 50 / 1e6, abs=2e-3)


# ----------------------------------------------------------------------------------------------- format
def test_written_trace_loads_and_names_every_process_and_thread(tmp_path: Path) -> None:
    t = Timeline()
    t.add(_proc(DRIVER, _span("train_step 1", COMPUTE, 10, 50)))
    t.add(_proc("actor:0", _span("run_training", COMPUTE, 20, 40), _span("get c", WAIT, 20, 25, "t2")))
    path = t.write(tmp_path / "trace.json", {"placement": "collocated"})
    events = load_trace(path)
    names = {e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert {n.split(" ")[0] for n in names} == {DRIVER, "actor:0"}
    threads = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert threads == {"main", "t2"}
    complete = [e for e in events if e["ph"] == "X"]
    assert {(e["name"], e["cat"], e["ts"], e["dur"]) for e in complete} == {
        ("train_step 1", COMPUTE, 10, 40),
        ("run_training", COMPUTE, 20, 20),
        ("get c", WAIT, 20, 5),
    }
    doc = json.loads(path.read_text())
    assert doc["otherData"] == {"placement": "collocated"} and doc["displayTimeUnit"] == "ms"
    assert not list(tmp_path.glob(".*tmp"))  # written through a temporary file, renamed


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ("not json", "not JSON"),
        ({"events": []}, "traceEvents"),
        ({"traceEvents": [{"ph": "Q"}]}, "'ph'"),
        ({"traceEvents": [{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 0}]}, "'dur'"),
        ({"traceEvents": [{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 0, "dur": -1}]}, "'dur'"),
        ({"traceEvents": [{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": "0", "dur": 1}]}, "'ts'"),
        ({"traceEvents": [{"ph": "X", "name": "a", "tid": 1, "ts": 0, "dur": 1}]}, "'pid'"),
        ({"traceEvents": [{"ph": "M", "name": "color", "pid": 1, "args": {}}]}, "metadata"),
        ({"traceEvents": [], "displayTimeUnit": "s"}, "displayTimeUnit"),
    ],
)
def test_load_trace_names_what_breaks_the_format(tmp_path: Path, doc: Any, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    with pytest.raises(ValueError, match=message):
        load_trace(path)


def test_load_trace_accepts_the_array_format(tmp_path: Path) -> None:
    path = tmp_path / "array.json"
    path.write_text(json.dumps([{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 0, "dur": 1}]))
    assert len(load_trace(path)) == 1


# -------------------------------------------------------------------------------------------- on workers
class Tracer(Worker):
    def work(self, channel: Channel) -> None:
        with self.timer("compute_phase"):
            time.sleep(0.05)
        with self.timer("waiting_phase", wait=True):
            time.sleep(0.02)
        peer = 1 - self.rank
        if self.rank == 0:
            self.send({"x": 1}, self.group_name, peer)
            channel.put(self.rank)
        else:
            self.recv(self.group_name, peer, timeout=30)
            channel.get(timeout=30)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    c = Cluster(num_nodes=1, simulated_accelerators_per_node=2, ray_address="local", num_cpus=2)
    try:
        yield c
    finally:
        c.shutdown()


@pytest.mark.ray
def test_workers_record_timers_messages_and_channel_waits(
    cluster: Cluster, tracing: None, tmp_path: Path
) -> None:
    group = Tracer.create_group().launch(cluster, NodePlacementStrategy([0, 0]), name="tracer")
    channel = Channel.create("trace-test")
    try:
        group.set_tracing(True).wait(timeout=60)
        start = now_us()
        group.work(channel).wait(timeout=60)
        end = now_us()
        traces: list[ProcessTrace] = group.pop_trace().wait(timeout=60)
        assert [t.label for t in traces] == ["tracer:0", "tracer:1"]
        names = [{(s.name, s.cat) for s in t.spans} for t in traces]
        assert {("compute_phase", COMPUTE), ("waiting_phase", WAIT), ("send tracer:1", WAIT)} <= names[0]
        assert ("put trace-test", WAIT) in names[0]
        assert {("recv tracer:0", WAIT), ("get trace-test", WAIT)} <= names[1]
        driver = take_trace(DRIVER)
        assert ("wait tracer.work", WAIT) in {(s.name, s.cat) for s in driver.spans}
        timeline = Timeline()
        for t in (*traces, driver):
            timeline.add(t)
        usage = timeline.usage(start, end)["tracer"]
        assert usage.busy_s >= 0.04 and usage.wait_s >= 0.015
        events = load_trace(timeline.write(tmp_path / "trace.json"))
        assert {e["pid"] for e in events if e["ph"] == "X"} == {1, 2, 3}
        group.set_tracing(False).wait(timeout=60)
        group.work(channel).wait(timeout=60)
        assert all(not t.spans for t in group.pop_trace().wait(timeout=60))
    finally:
        channel.shutdown()
        group.shutdown()


def test_a_written_timeline_loads_back(tmp_path: Path) -> None:
    t = Timeline()
    t.add(ProcessTrace("env:0", "nodeA", 42, (_span("env_step", COMPUTE, 10, 50, "main"),)))
    t.add(ProcessTrace(DRIVER, "nodeA", 7, (_span("train_step 1", COMPUTE, 0, 100, "MainThread"),)))
    path = t.write(tmp_path / "trace.json", {"world_sizes": {"env": 1}})
    back, other = Timeline.load(path)
    assert back.labels == ("env:0", DRIVER) and other == {"world_sizes": {"env": 1}}
    assert back.spans("env:0") == t.spans("env:0") and back.spans(DRIVER) == t.spans(DRIVER)
    assert back.usage(0, 100) == t.usage(0, 100)
    (tmp_path / "bare.json").write_text(json.dumps({"traceEvents": []}))
    with pytest.raises(ValueError, match="process_name"):
        Timeline.load(tmp_path / "bare.json")


def test_busy_intervals_are_compute_minus_waits() -> None:
    t = Timeline()
    t.add(
        _proc(
            "actor:0",
            _span("train", COMPUTE, 0, 600),
            _span("get", WAIT, 100, 300),
            _span("log", COMPUTE, 500, 800, thread="other"),
            _span("idle wait", WAIT, 900, 950),
        )
    )
    assert t.busy_intervals("actor:0") == [(0, 100), (300, 800)]
    assert t.busy_intervals("nobody") == []
