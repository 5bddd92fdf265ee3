"""Auto-placement: candidates, the step-time model and the search on synthetic costs, fitting from traces, CLI."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from rlinf_runners.autoplace import (
    CallCost,
    Candidate,
    EmbodiedCosts,
    Machine,
    SequentialCosts,
    blocks,
    calibrate,
    candidates,
    canonical,
    fit,
    main,
    measure,
    predict,
    rank_candidates,
)
from rlinf_runners.autoplace._fit import _fit_call
from rlinf_scheduler import DRIVER, ProcessTrace, Span, Timeline

APPS = Path(__file__).resolve().parents[3] / "apps"
EMBODIED = ("actor", "rollout", "env")


def _cand(stages: int = 1, **blocks_: tuple[int, int]) -> Candidate:
    return Candidate(tuple((c, blocks_[c]) for c in EMBODIED), stages)


GPU4 = Machine(1, 4, cores=64.0, simulated=False)


# ------------------------------------------------------------------------------------------- candidates
def test_blocks_are_aligned_and_cut_like_accelerator_topologies() -> None:
    assert blocks(Machine(1, 4, 8.0)) == [(0, 1), (1, 2), (2, 3), (3, 4), (0, 2), (2, 4), (0, 4)]
    assert (0, 8) in blocks(Machine(2, 4, 8.0)) and (2, 6) not in blocks(Machine(2, 4, 8.0))
    assert {hi - lo for lo, hi in blocks(Machine(1, 6, 8.0))} == {1, 2, 3, 6}
    assert len(list(candidates(EMBODIED, Machine(1, 2, 2.0), (1, 2)))) == 3**3 * 2


def test_modes_and_the_config_mapping() -> None:
    c = _cand(actor=(0, 2), rollout=(0, 2), env=(0, 2))
    assert c.mode == "collocated" and c.component_placement() == {"actor,rollout,env": "0-1"}
    d = _cand(2, actor=(0, 2), rollout=(2, 3), env=(3, 4))
    assert d.mode == "disaggregated" and d.component_placement() == {
        "actor": "0-1",
        "rollout": "2",
        "env": "3",
    }
    h = _cand(2, actor=(0, 1), rollout=(1, 2), env=(0, 1))
    assert h.mode == "hybrid" and h.component_placement() == {"actor,env": "0", "rollout": "1"}
    assert h.describe() == "actor,env: 0, rollout: 1 (2 stages)"


def test_canonical_merges_slot_relabellings_only() -> None:
    m = Machine(2, 2, 8.0)
    a = _cand(actor=(0, 1), rollout=(0, 2), env=(1, 2))
    b = _cand(actor=(1, 2), rollout=(0, 2), env=(0, 1))  # slots 0 and 1 swapped
    c = _cand(actor=(2, 3), rollout=(2, 4), env=(3, 4))  # the same on the other node
    d = _cand(actor=(0, 1), rollout=(0, 2), env=(2, 3))  # env on another node: not the same
    assert canonical(a, m) == canonical(b, m) == canonical(c, m) != canonical(d, m)
    assert canonical(a, m) != canonical(Candidate(a.blocks, 2), m)


# ----------------------------------------------------------------------------------------------- model
COSTS = EmbodiedCosts(
    env=CallCost(0.001, 0.016),
    rollout=CallCost(0.002, 0.004),
    actor=CallCost(0.05, 0.2),
    chunks=10,
    sync_s=0.01,
    overhead_s=0.02,
)


def test_collocated_steps_alternate_env_and_rollout_then_train() -> None:
    c = _cand(actor=(0, 1), rollout=(0, 1), env=(0, 1))
    expected = 10 * (0.001 + 0.016 + 0.002 + 0.004) + (0.05 + 0.2) + 0.01 + 0.02
    assert predict(c, COSTS, GPU4) == pytest.approx(expected)


def test_pipeline_stages_overlap_only_on_separate_accelerators() -> None:
    env, infer = 0.001 + 0.016 / 2, 0.002 + 0.004 / 2  # one stage: half of the batch
    rest = 0.25 + 0.03
    apart = _cand(2, actor=(0, 1), rollout=(1, 2), env=(2, 3))
    assert predict(apart, COSTS, GPU4) == pytest.approx(10 * (2 * max(env, infer) + min(env, infer)) + rest)
    shared = _cand(2, actor=(0, 1), rollout=(1, 2), env=(1, 2))  # one GPU runs one thing at a time
    assert predict(shared, COSTS, GPU4) == pytest.approx(10 * 2 * (env + infer) + rest)
    # simulated slots are labels on CPU processes: env and rollout overlap when the cores allow
    cpu = Machine(1, 4, cores=4.0, simulated=True)
    assert predict(shared, COSTS, cpu) == pytest.approx(predict(apart, COSTS, GPU4))


def test_ranks_beyond_the_cores_do_not_help() -> None:
    one = _cand(actor=(0, 1), rollout=(0, 1), env=(0, 1))
    four = _cand(actor=(0, 1), rollout=(0, 1), env=(0, 4))
    roomy, tight = Machine(1, 4, 4.0), Machine(1, 4, 1.0)
    env_time = lambda n: COSTS.chunks * (0.001 + 0.016 / n)  # noqa: E731
    gain = predict(one, COSTS, roomy) - predict(four, COSTS, roomy)
    assert gain == pytest.approx(env_time(1) - env_time(4))
    # one core: four env ranks each take four times as long (their fixed part too)
    assert predict(four, COSTS, tight) - predict(one, COSTS, tight) == pytest.approx(
        4 * env_time(4) - env_time(1)
    )


def test_sequential_steps_add_their_phases() -> None:
    costs = SequentialCosts(
        phases=(
            ("rollout", CallCost(1.0, 8.0)),
            ("reward", CallCost(0.5, 0.0)),
            ("actor", CallCost(0.0, 4.0)),
        ),
        sync_s=0.5,
        overhead_s=0.25,
    )
    c = Candidate((("actor", (0, 2)), ("rollout", (0, 4)), ("reward", (0, 1))))
    assert predict(c, costs, GPU4) == pytest.approx((1.0 + 8.0 / 4) + 0.5 + 4.0 / 2 + 0.75)


def test_search_finds_the_brute_force_minimum() -> None:
    env_heavy = EmbodiedCosts(
        env=CallCost(0.0005, 0.05), rollout=CallCost(0.003, 0.002), actor=CallCost(0.02, 0.1), chunks=20
    )
    pool = list(candidates(EMBODIED, GPU4, (1, 2, 4)))
    ranked = rank_candidates(pool, env_heavy, GPU4)
    brute = min(predict(c, env_heavy, GPU4) for c in pool)
    assert ranked[0][0] == pytest.approx(brute)
    assert all(a[0] <= b[0] + 1e-12 for a, b in itertools.pairwise(ranked))
    # every component splits its batch over the accelerators: all on all four, taking turns
    assert ranked[0][1].mode == "collocated" and ranked[0][1].ranks("env") == 4
    # on one CPU core more processes only add their fixed costs: one slot each is fastest
    cpu = Machine(1, 4, cores=1.0, simulated=True)
    best = rank_candidates(pool, env_heavy, cpu)[0][1]
    assert {best.ranks(c) for c in EMBODIED} == {1} and best.stages == 1


# ------------------------------------------------------------------------------------------------ fitting
def test_fit_call_fixed_and_split_parts() -> None:
    def parts(points: list[tuple[float, float]]) -> tuple[float, float]:
        cost = _fit_call(points)
        return cost.fixed_s, cost.split_s

    assert parts([(1.0, 3.0), (0.25, 1.5)]) == pytest.approx((1.0, 2.0))
    assert parts([(1.0, 1.0), (0.5, 1.2)]) == pytest.approx((1.1, 0.0))  # slower when split: a fixed cost
    assert parts([(1.0, 2.0), (0.5, 0.6)])[0] == 0.0  # no negative fixed part
    assert parts([(0.5, 1.0)]) == (0.0, 2.0)  # one point: all of it splits


def _synthetic_run(
    candidate: Candidate, costs: EmbodiedCosts, steps: int = 3, threads: float = -1.0
) -> Timeline:
    """A timeline as a run of ``candidate`` with exactly ``costs`` would record (cores to spare).

    ``costs`` are wall seconds; with ``threads`` > 0 each span used that many cores (its CPU time is recorded).
    """
    s = candidate.stages
    n_env, n_roll, n_act = (candidate.ranks(c) for c in ("env", "rollout", "actor"))
    env_s = costs.env.seconds(1 / (n_env * s)) * 1e6
    roll_s = costs.rollout.seconds(1 / (n_roll * s)) * 1e6
    act_s = costs.actor.seconds(1 / n_act) * 1e6
    spans: dict[str, list[Span]] = {
        f"{g}:{r}": [] for g, n in (("env", n_env), ("rollout", n_roll), ("actor", n_act)) for r in range(n)
    }
    driver: list[Span] = []
    t = 0.0
    for step in range(1, steps + 1):
        driver.append(Span("sync_weights", "compute", t, costs.sync_s * 1e6, "main"))
        t += costs.sync_s * 1e6
        start = t
        for _ in range(int(costs.chunks) * s):  # a component's ranks at once, components in turn
            for r in range(n_env):
                spans[f"env:{r}"].append(Span("env_step", "compute", t, env_s, "main", env_s * threads))
            t += env_s
            for r in range(n_roll):
                spans[f"rollout:{r}"].append(
                    Span("inference", "compute", t, roll_s, "main", roll_s * threads)
                )
            t += roll_s
        for r in range(n_act):
            spans[f"actor:{r}"].append(
                Span("actor/run_training", "compute", t, act_s, "main", act_s * threads)
            )
        t += act_s
        t += costs.overhead_s * 1e6
        driver.append(Span(f"train_step {step}", "compute", start, t - start, "main"))
    timeline = Timeline()
    for label, s_ in spans.items():
        timeline.add(ProcessTrace(label, "node", 1, tuple(s_)))
    timeline.add(ProcessTrace(DRIVER, "node", 1, tuple(driver)))
    return timeline


@pytest.mark.parametrize("threads", [-1.0, 1.0, 3.0], ids=["no-cpu-times", "one-thread", "three-threads"])
def test_fit_recovers_the_costs_of_two_profiled_placements(threads: float) -> None:
    truth = EmbodiedCosts(
        env=CallCost(0.0005, 0.02),
        rollout=CallCost(0.0005, 0.01),
        actor=CallCost(0.0, 0.1),
        chunks=5,
        sync_s=0.01,
    )
    machine = Machine(1, 2, cores=8.0)  # at most 2 processes at once in these timelines: no contention
    one = _cand(actor=(0, 1), rollout=(0, 1), env=(0, 1))
    two = _cand(actor=(0, 1), rollout=(0, 2), env=(0, 2))
    runs = [measure(_synthetic_run(c, truth, threads=threads), c, machine, "embodied") for c in (one, two)]
    assert runs[0].chunks == 5 and runs[0].steps == 2  # the first step is left out
    got = fit(runs)
    assert isinstance(got, EmbodiedCosts)
    cores = max(threads, 1.0)
    for part in ("env", "rollout", "actor"):
        want, have = getattr(truth, part), getattr(got, part)
        assert have.parallelism == pytest.approx(cores), part
        assert have.fixed_s == pytest.approx(want.fixed_s * cores, abs=1e-9), part  # CPU seconds
        assert have.split_s == pytest.approx(want.split_s * cores, rel=1e-6), part
    assert got.sync_s == pytest.approx(0.01) and got.overhead_s == pytest.approx(0.0, abs=1e-9)
    for c in (one, two):  # the fitted model gives back both profiled placements' step times
        step = measure(_synthetic_run(c, truth), c, machine, "embodied").step_s
        assert predict(c, got, machine) == pytest.approx(step, rel=1e-6)
    # two stages overlap env and rollout (simulated slots, cores to spare): shorter than taking turns
    three = _cand(2, actor=(0, 1), rollout=(0, 1), env=(1, 2))
    assert predict(three, got, machine) < predict(one, got, machine)


def test_measure_takes_contention_out_of_the_spans() -> None:
    """Two env ranks stepping at once on one core: each call took twice its uncontended time."""
    machine = Machine(1, 2, cores=1.0)
    c = _cand(actor=(0, 1), rollout=(0, 1), env=(0, 2))
    spans: dict[str, list[Span]] = {"env:0": [], "env:1": [], "rollout:0": [], "actor:0": []}
    driver = []
    t = 0.0
    for step in (1, 2):
        start = t
        for _ in range(4):
            for r in (0, 1):
                spans[f"env:{r}"].append(Span("env_step", "compute", t, 2000.0, "main"))  # together
            t += 2000.0
            spans["rollout:0"].append(Span("inference", "compute", t, 500.0, "main"))
            t += 500.0
        spans["actor:0"].append(Span("actor/run_training", "compute", t, 1000.0, "main"))
        t += 1000.0
        driver.append(Span(f"train_step {step}", "compute", start, t - start, "main"))
    timeline = Timeline()
    for label, s in spans.items():
        timeline.add(ProcessTrace(label, "node", 1, tuple(s)))
    timeline.add(ProcessTrace(DRIVER, "node", 1, tuple(driver)))
    run = measure(timeline, c, machine, "embodied")
    assert run.calls["env"] == pytest.approx(0.001)  # 2 ms with two busy processes on one core
    assert run.calls["rollout"] == pytest.approx(0.0005) and run.calls["actor"] == pytest.approx(0.001)
    assert run.chunks == 4


# -------------------------------------------------------------------------------------------------- CLI
def _profiled_trace(path: Path, candidate: Candidate, costs: EmbodiedCosts, slots: int) -> Path:
    other = {
        "cluster": {
            "num_nodes": 1,
            "simulated_accelerators_per_node": slots,
            "component_placement": candidate.component_placement(),
        },
        "pipeline_stage_num": candidate.stages,
        "driver_cpu_count": 4,
    }
    return _synthetic_run(candidate, costs).write(path, other)


def test_cli_ranks_placements_from_given_traces(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    truth = EmbodiedCosts(
        env=CallCost(0.0005, 0.02), rollout=CallCost(0.001, 0.002), actor=CallCost(0.0, 0.05), chunks=8
    )
    one = _cand(actor=(0, 1), rollout=(0, 1), env=(0, 1))
    two = _cand(actor=(0, 1), rollout=(0, 2), env=(0, 2))
    traces = [_profiled_trace(tmp_path / f"t{i}.json", c, truth, 4) for i, c in enumerate((one, two))]
    config = APPS / "embodied" / "config" / "cartpole_ppo.yaml"
    out = tmp_path / "ranking.json"
    argv = [str(config), "--nodes", "1", "--accelerators-per-node", "4", "--cores", "4", "--json", str(out)]
    assert main([*argv, "--trace", str(traces[0]), "--trace", str(traces[1])]) == 0
    printed = capsys.readouterr().out
    assert "best for 1 node(s) x 4 slot(s):\ncluster:\n  component_placement:" in printed
    ranking = json.loads(out.read_text())
    assert [r["predicted_step_s"] for r in ranking] == sorted(r["predicted_step_s"] for r in ranking)
    best = ranking[0]
    assert best["overrides"][1] == f"cluster.component_placement={json.dumps(best['component_placement'])}"
    # every listed placement passed the app's checks: e.g. the actor's batch does not split over 2+ ranks
    assert all(r["component_placement"] for r in ranking)
    assert all(
        not any(k.split(",")[0] == "actor" and "-" in v for k, v in r["component_placement"].items())
        for r in ranking
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--nodes", "0", "--accelerators-per-node", "2"], "--nodes must be >= 1"),
        (["--nodes", "1", "--accelerators-per-node", "2", "--profile-steps", "1"], "--profile-steps must be"),
    ],
)
def test_cli_refuses_bad_arguments(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main([str(APPS / "embodied" / "config" / "cartpole_ppo.yaml"), *argv])
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("config", "argv", "message"),
    [
        ("cartpole_ppo", ["--app", "robots"], "allowed: embodied"),
        ("cartpole_async_ppo", [], "runner.mode='async' is not modeled"),
        ("pendulum_async_sac", [], "supported: runner.mode=sync"),
        ("cartpole_ppo", ["runner.max_epochs=0"], "max_epochs"),
    ],
)
def test_cli_refuses_a_bad_config_before_profiling(
    config: str, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = APPS / "embodied" / "config" / f"{config}.yaml"
    assert main([str(path), "--nodes", "1", "--accelerators-per-node", "2", *argv]) == 2
    assert message in capsys.readouterr().err


def test_profile_runs_refuse_an_async_config_before_running(tmp_path: Path) -> None:
    """The library entry the bench uses refuses what the model does not cover before any profiling run."""
    from rlinf_runners.apps import EmbodiedApp
    from rlinf_runners.autoplace import profile_runs

    app = EmbodiedApp(APPS / "embodied")
    config = APPS / "embodied" / "config" / "pendulum_async_sac.yaml"
    with pytest.raises(
        ValueError, match=r"runner\.mode='async' is not modeled.*supported: runner\.mode=sync"
    ):
        profile_runs(app, config, [], Machine(1, 2, 2.0), 3, tmp_path)
    assert not list(tmp_path.iterdir())  # nothing ran


def test_effective_cores_come_from_runs_where_ranks_shared_a_node() -> None:
    from rlinf_runners.autoplace import Measured, effective_cores

    machine = Machine(1, 2, cores=2.0)

    def run(env: tuple[int, int], cpu_per_wall: float, rollout: float = 1.0) -> Measured:
        c = _cand(actor=(0, 1), rollout=(0, 1), env=env)
        calls = {"env": 0.01, "rollout": 0.001, "actor": 0.1}
        ratio = {"env": cpu_per_wall, "rollout": rollout, "actor": 1.0}
        return Measured(c, machine, "embodied", calls, ratio, 10.0, 0.0, 1.0, 3)

    assert effective_cores([run((0, 1), 0.99)]) is None  # one env process: says nothing about sharing
    # two env processes got 0.87 of a core each: the node gave them 1.74 cores
    assert effective_cores([run((0, 1), 0.99), run((0, 2), 0.87)]) == pytest.approx(1.74)
    assert effective_cores([run((0, 2), 1.5)]) == 2.0  # never more than the node has
    # never fewer than one process got: the rollout's two threads alone had 1.9 of them
    assert effective_cores([run((0, 2), 0.87, rollout=1.9)]) == pytest.approx(1.9)


def test_cli_refuses_dynamic_scaling_before_profiling(capsys: pytest.CaptureFixture[str]) -> None:
    """Auto-placement searches static placements; a config that scales dynamically is refused with the fix."""
    path = APPS / "reasoning" / "config" / "grpo_smollm2_disaggregated.yaml"
    argv = [str(path), "--nodes", "1", "--accelerators-per-node", "2", "runner.dynamic_scaling=true"]
    assert main(argv) == 2
    assert "set runner.dynamic_scaling=false" in capsys.readouterr().err


def test_cli_refuses_an_explicit_pipeline_and_profiles_in_sequence(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The cost model adds phases up: ``runner.pipeline=true`` is refused, and every candidate it runs or prints
    turns the pipeline off (a disaggregated candidate would otherwise be pipelined by default)."""
    path = APPS / "reasoning" / "config" / "grpo_smollm2_pipeline.yaml"
    argv = [str(path), "--nodes", "1", "--accelerators-per-node", "2"]
    assert main(argv) == 2
    assert "set runner.pipeline=null" in capsys.readouterr().err
    from rlinf_runners.apps import ReasoningApp
    from rlinf_runners.autoplace._cli import placement_overrides

    app = ReasoningApp(APPS / "reasoning")
    machine = Machine(1, 2, 2.0, True)
    candidate = next(candidates(app.components, machine))
    assert "runner.pipeline=false" in placement_overrides(app, candidate, machine)


# ------------------------------------------------------------------ the fitted model gives back its profiles
SEQUENTIAL = ("actor", "rollout", "reward")

Truth = dict[str, tuple[CallCost, float, float]]
"""Per component: CPU seconds of a call on one rank, the cores one rank gets alone, the cores several get."""


def _contended_run(
    candidate: Candidate,
    truth: Truth,
    *,
    chunks: int = 0,
    gap_s: float = 0.3,
    steps: int = 4,
    slow: int = 0,
) -> Timeline:
    """A run of ``candidate`` on one node where each call's wall time is its CPU time over the cores it got.

    One rank of a component alone gets ``truth[c][1]`` cores (a thread short of a whole core, or several
    threads), ``n`` ranks at once share ``truth[c][2]`` (collectives, memory). Embodied (``chunks`` > 0): per
    chunk the env ranks, then the rollout ranks, then the actor; sequential: rollout, reward, actor. Each
    phase is followed by ``gap_s`` of driver work, each step by a 0.2 s weight sync. In step ``slow`` every
    call gets half its cores (another tenant's burst).
    """
    order = [("env", "env_step"), ("rollout", "inference")] * chunks + [("actor", "actor/run_training")]
    if not chunks:
        order = [("rollout", "generate"), ("reward", "reward"), ("actor", "actor/run_training")]
    names = {c for c, _ in order}
    spans: dict[str, list[Span]] = {f"{c}:{r}": [] for c in names for r in range(candidate.ranks(c))}
    driver: list[Span] = []
    t = 0.0
    for step in range(1, steps + 1):
        driver.append(Span("sync_weights", "compute", t, 0.2e6, "main"))
        t += 0.2e6
        start = t
        for component, name in order:
            n = candidate.ranks(component)
            cost, alone, together = truth[component]
            cpu = cost.seconds(1.0 / n) * 1e6
            wall = cpu / (alone if n == 1 else min(alone, together / n)) * (2.0 if step == slow else 1.0)
            for r in range(n):
                spans[f"{component}:{r}"].append(Span(name, "compute", t, wall, "main", cpu))
            t += wall + gap_s * 1e6
        driver.append(Span(f"train_step {step}", "compute", start, t - start, "main"))
    timeline = Timeline()
    for label, s_ in spans.items():
        timeline.add(ProcessTrace(label, "node", 1, tuple(s_)))
    timeline.add(ProcessTrace(DRIVER, "node", 1, tuple(driver)))
    return timeline


_SEQ_TRUTH: Truth = {
    "rollout": (CallCost(1.0, 20.0), 1.8, 1.7),  # two torch threads alone; two ranks share 1.7 cores
    "reward": (CallCost(0.2, 0.4), 0.9, 1.6),  # one thread that does not get a whole core
    "actor": (CallCost(2.0, 30.0), 1.6, 1.1),  # two FSDP ranks wait on each other's collectives
}
_EMB_TRUTH: Truth = {
    "env": (CallCost(0.002, 0.03), 0.8, 1.7),  # a simulator thread that Ray's threads take a part of
    "rollout": (CallCost(0.004, 0.02), 1.5, 1.6),  # two inference ranks of two threads each on two cores
    "actor": (CallCost(0.05, 0.3), 1.4, 1.4),
}


@pytest.mark.parametrize("profiles", [1, 2], ids=["one-profile", "two-profiles"])
@pytest.mark.parametrize("kind", ["sequential", "embodied"])
def test_the_fitted_model_predicts_each_profiled_placement_as_measured(kind: str, profiles: int) -> None:
    """The two profiles autoplace runs (one slot; a node's two slots) on a two-core node: predicting a profiled
    placement gives back the step time measured in its profile, whatever the contention its processes met."""
    machine = Machine(1, 2, cores=2.0)
    if kind == "sequential":
        truth, chunks, gap, components = _SEQ_TRUTH, 0, 0.3, SEQUENTIAL
    else:
        truth, chunks, gap, components = _EMB_TRUTH, 6, 0.005, EMBODIED
    one = Candidate(tuple((c, (0, 1)) for c in components))
    two = Candidate(tuple((c, (0, 1) if c == "actor" and kind == "embodied" else (0, 2)) for c in components))
    placements = [one, two][:profiles]
    runs = [
        measure(_contended_run(c, truth, chunks=chunks, gap_s=gap), c, machine, kind)  # type: ignore[arg-type]
        for c in placements
    ]
    runs, calibrated = calibrate(runs, machine)
    costs = fit(runs)
    for c, run in zip(placements, runs, strict=True):
        assert predict(c, costs, calibrated) == pytest.approx(run.step_s, rel=0.01), c.describe()
    if profiles == 2:  # the profiles' gaps (driver work) are alike: the constant is them
        assert costs.overhead_s == pytest.approx(gap * (3 if kind == "sequential" else 13), rel=0.01)


def test_measure_takes_the_median_step() -> None:
    """A step slowed by another tenant's burst (its calls got half the cores) does not move the figures."""
    machine = Machine(1, 2, cores=2.0)
    c = Candidate(tuple((g, (0, 1)) for g in SEQUENTIAL))
    steady = measure(_contended_run(c, _SEQ_TRUTH), c, machine, "sequential")
    run = measure(_contended_run(c, _SEQ_TRUTH, slow=3), c, machine, "sequential")
    assert run.steps == steady.steps == 3  # the first of four steps is left out
    assert run.step_s == pytest.approx(steady.step_s)
    assert run.calls == pytest.approx(dict(steady.calls))
    assert run.cpu_per_wall == pytest.approx(dict(steady.cpu_per_wall))
    # the mean of the three steps would have counted the burst
    assert measure(_contended_run(c, _SEQ_TRUTH, slow=3, steps=3), c, machine, "sequential").step_s > (
        1.2 * steady.step_s
    )
