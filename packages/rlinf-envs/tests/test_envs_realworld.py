"""The real-world backend against dummy Franka servers running in their own processes, reached over 127.0.0.1."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rlinf_envs import (
    EnvConfig,
    VecEnv,
    VecEnvConfig,
    env_config_problems,
    env_spec_without_worker,
    make_vec_env,
)
from rlinf_envs.realworld import (
    DummyFranka,
    EmergencyStopped,
    PegScene,
    RealWorldVecEnv,
    RobotClient,
    RobotFault,
    RobotState,
    RobotUnreachable,
    SafetyLimits,
    SafetyViolation,
    encode_message,
    pack_arrays,
    realworld_spec,
    recv_message,
    send_message,
    unpack_arrays,
)
from rlinf_envs.realworld._dummy import tool_down_pose

ENV_ID = "FrankaPegInsertion-v1"
DUMMY = {"is_dummy": True}
WIDE = SafetyLimits(
    xyz_min=(-1.0, -1.0, -1.0),
    xyz_max=(1.0, 1.0, 1.0),
    rpy_min=(-np.pi, -np.pi, -np.pi),
    rpy_max=(np.pi, np.pi, np.pi),
    max_translation_m=1.0,
    max_rotation_rad=np.pi,
)
"""Limits that let everything through the client, to reach the dummy arm's own envelope."""


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a running process (a zombie, exited but not reaped, counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _dummy_children() -> list[int]:
    """Pids of this process's live children that run the dummy robot server."""
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == os.getpid() and fields[0] != "Z" and b"dummy_robot" in cmdline:
            out.append(int(proc.name))
    return out


def _start_server(tmp_path: Path, *extra: str, seed: int = 0) -> tuple[subprocess.Popen[bytes], int]:
    """``python -m rlinf_envs.realworld.dummy_robot --port 0 --port-file F``: the process and its port."""
    port_file = tmp_path / f"port-{time.monotonic_ns()}"
    cmd = [
        sys.executable,
        "-m",
        "rlinf_envs.realworld.dummy_robot",
        "--port",
        "0",
        "--port-file",
        str(port_file),
    ]
    proc = subprocess.Popen([*cmd, "--seed", str(seed), *extra], stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not port_file.exists():
        assert proc.poll() is None, "the dummy server exited before listening"
        assert time.monotonic() < deadline, "the dummy server did not listen within 30 s"
        time.sleep(0.02)
    return proc, int(port_file.read_text())


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """One dummy server for the tests that leave it as they found it: its port."""
    proc, port = _start_server(tmp_path_factory.mktemp("robot"))
    yield port
    _stop(proc)


@pytest.fixture
def client(server: int) -> Iterator[RobotClient]:
    c = RobotClient(("127.0.0.1", server), name="Franka unit 7", limits=SafetyLimits(), timeout_s=5.0)
    c.reset(tool_down_pose(0.5, 0.0, 0.15), 0.0)
    yield c
    c.close()


# -- protocol ------------------------------------------------------------------------------------------------


def test_wire_format_round_trips_headers_and_arrays() -> None:
    frames: dict[str, np.ndarray] = {
        "front": np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3),
        "depth": np.ones((2, 2), np.int16),
    }
    meta, payload = pack_arrays(frames)
    a, b = socket.socketpair()
    with a, b:
        send_message(a, {"op": "frames", "id": 3, "arrays": meta}, payload)
        send_message(a, {"op": "state", "id": 4})
        header, got = recv_message(b, time.monotonic() + 5)
        assert header == {"op": "frames", "id": 3, "arrays": meta}
        back = unpack_arrays(header["arrays"], got)
        assert back.keys() == frames.keys()
        for k, v in frames.items():
            np.testing.assert_array_equal(back[k], v)
            assert back[k].dtype == v.dtype
        assert recv_message(b, time.monotonic() + 5) == ({"op": "state", "id": 4}, b"")
        a.sendall(b"\xff\xff\xff\xff\x00\x00\x00\x00")  # a 4 GiB header: refused unread
        with pytest.raises(ValueError, match="too large"):
            recv_message(b, time.monotonic() + 5)
        with pytest.raises(TimeoutError):
            recv_message(b, time.monotonic() + 0.05)
        a.sendall(encode_message({"op": "x"})[:5])
        a.close()
        with pytest.raises(EOFError, match="closed by the peer"):
            recv_message(b, time.monotonic() + 5)
    with pytest.raises(ValueError, match="does not fit"):
        unpack_arrays([{"name": "x", "dtype": "|u1", "shape": [4], "offset": 0, "nbytes": 4}], b"abc")


def test_robot_state_vector_and_validation() -> None:
    state = RobotState(tcp_pose=[0.5, 0, 0.1, 1, 0, 0, 0], tcp_vel=range(6), tcp_force=[1, 2, 3], gripper=0.5)
    vec = state.state_vector()
    assert vec.shape == (19,) and vec.dtype == np.float32
    np.testing.assert_array_equal(vec[7:13], np.arange(6))
    np.testing.assert_array_equal(vec[13:16], [1, 2, 3])
    assert RobotState.from_dict(state.to_dict()) == state
    with pytest.raises(ValueError, match="tcp_pose must be 7 finite numbers"):
        RobotState(tcp_pose=[0.0] * 6)
    with pytest.raises(ValueError, match=r"lacks \['tcp_force'"):
        RobotState.from_dict({k: v for k, v in state.to_dict().items() if k != "tcp_force"})


def test_safety_limits_validate_and_name_the_field() -> None:
    with pytest.raises(ValueError, match=r"xyz_min\[2\] \(z: 0.5\) must be below xyz_max\[2\] \(0.2\)"):
        SafetyLimits(xyz_min=(0.4, -0.1, 0.5), xyz_max=(0.6, 0.1, 0.2))
    with pytest.raises(ValueError, match="max_translation_m must be a finite number > 0"):
        SafetyLimits(max_translation_m=0)
    with pytest.raises(ValueError, match=r"rpy_max must be angles in \[-π, π\]"):
        SafetyLimits(rpy_max=(4.0, 0.5, 0.5))
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['xyz_mn'\]; allowed: xyz_min, xyz_max"):
        SafetyLimits.from_mapping({"xyz_mn": [0, 0, 0]})
    limits = SafetyLimits()
    down = tool_down_pose(0.5, 0.0, 0.15)
    limits.check(down, 0.0, down, robot="r")  # roll π lies in the default arc wrapping through ±π
    clipped = limits.clip_pose(tool_down_pose(0.9, 0.0, 0.15, yaw=1.2))
    np.testing.assert_allclose(clipped[:3], [0.6, 0.0, 0.15])
    limits.check_pose(clipped, robot="r")


# -- the dummy robot over its socket --------------------------------------------------------------------------


def test_hello_state_frames_and_move(client: RobotClient) -> None:
    assert client.info["robot_type"] == "Franka" and set(client.info["cameras"]) == {"front", "wrist"}
    state = client.state()
    np.testing.assert_allclose(state.tcp_pose, tool_down_pose(0.5, 0.0, 0.15), atol=1e-9)
    frames = client.frames()
    assert {k: (v.shape, v.dtype) for k, v in frames.items()} == {
        "front": ((64, 64, 3), np.dtype(np.uint8)),
        "wrist": ((64, 64, 3), np.dtype(np.uint8)),
    }
    after = client.move(tool_down_pose(0.5, 0.0, 0.13), 0.0)
    assert 0.13 < after.tcp_pose[2] < 0.135  # first-order tracking: most of the way in one period
    assert after.tcp_vel[2] < 0
    assert not np.array_equal(client.frames()["wrist"], frames["wrist"])  # the camera moved with the arm


def test_unsafe_command_raises_and_never_reaches_the_robot(client: RobotClient) -> None:
    before = client.stats()
    with pytest.raises(
        SafetyViolation, match="Franka unit 7: command refused, nothing sent: workspace z"
    ) as e:
        client.move(tool_down_pose(0.5, 0.0, 0.01), 0.0)
    assert e.value.robot == "Franka unit 7" and e.value.value == pytest.approx(0.01)
    assert e.value.allowed == "[0.05, 0.25] m"
    with pytest.raises(SafetyViolation, match="translation per command"):
        client.move(tool_down_pose(0.5, 0.05, 0.15), 0.0)
    with pytest.raises(SafetyViolation, match="workspace yaw"):
        client.move(tool_down_pose(0.5, 0.0, 0.15, yaw=0.7), 0.0)
    after = client.stats()
    assert after["moves_received"] == before["moves_received"]
    assert after["moves_executed"] == before["moves_executed"]


def test_robot_hard_envelope_latches_a_fault_until_reset(server: int) -> None:
    with RobotClient(("127.0.0.1", server), name="Franka unit 1", limits=WIDE, timeout_s=5.0) as c:
        c.reset(tool_down_pose(0.5, 0.0, 0.15), 0.0)
        with pytest.raises(RobotFault, match="hard limits latched a fault"):
            c.move(tool_down_pose(0.5, 0.0, 0.35), 0.0)  # 20 cm in one period: beyond the arm's own limit
        with pytest.raises(RobotFault, match="fault latched"):
            c.move(tool_down_pose(0.5, 0.0, 0.14), 0.0)  # harmless, but refused until the reset
        assert c.stats()["fault"] is not None
        c.reset(tool_down_pose(0.5, 0.0, 0.15), 0.0)
        c.move(tool_down_pose(0.5, 0.0, 0.14), 0.0)
        assert c.stats()["fault"] is None


def test_estop_refuses_moves_until_cleared(client: RobotClient) -> None:
    client.estop()
    try:
        before = client.stats()
        assert before["estopped"] is True
        for _ in range(2):
            with pytest.raises(
                EmergencyStopped, match="Franka unit 7: move refused: emergency stop is latched"
            ):
                client.move(tool_down_pose(0.5, 0.0, 0.14), 0.0)
        with pytest.raises(EmergencyStopped):
            client.reset(tool_down_pose(0.5, 0.0, 0.15), 0.0)
        after = client.stats()
        assert after["moves_refused"] == before["moves_refused"] + 2
        assert after["moves_executed"] == before["moves_executed"]
    finally:
        client.clear_estop()
    assert client.move(tool_down_pose(0.5, 0.0, 0.14), 0.0).tcp_pose[2] < 0.15


def test_killed_robot_raises_unreachable_within_the_timeout(tmp_path: Path) -> None:
    proc, port = _start_server(tmp_path)
    try:
        c = RobotClient(("127.0.0.1", port), name="Franka unit 3", limits=SafetyLimits(), timeout_s=1.0)
        c.state()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        start = time.monotonic()
        with pytest.raises(RobotUnreachable) as e:
            c.state()
        assert time.monotonic() - start < 1.5
        assert f"Franka unit 3 at 127.0.0.1:{port} did not answer the 'state' request within 1 s" in str(
            e.value
        )
        assert (e.value.robot, e.value.request, e.value.address) == (
            "Franka unit 3",
            "state",
            ("127.0.0.1", port),
        )
        with pytest.raises(RobotUnreachable, match="'connect' request"):
            c.move(tool_down_pose(0.5, 0.0, 0.14), 0.0)  # reconnecting fails too: nobody listens
        with pytest.raises(RobotUnreachable, match=r"Franka unit 4 at 127\.0\.0\.1"):
            RobotClient(("127.0.0.1", port), name="Franka unit 4", limits=SafetyLimits(), timeout_s=1.0)
    finally:
        _stop(proc)


def test_silent_robot_raises_unreachable_after_the_timeout() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:  # accepts, never answers
        port = listener.getsockname()[1]
        start = time.monotonic()
        with pytest.raises(RobotUnreachable, match=r"'hello' request within 0\.3 s: no reply"):
            RobotClient(("127.0.0.1", port), name="Franka unit 5", limits=SafetyLimits(), timeout_s=0.3)
        assert 0.25 < time.monotonic() - start < 1.0


def test_server_exits_on_close_and_when_its_parent_dies(tmp_path: Path) -> None:
    proc, port = _start_server(tmp_path)
    RobotClient(("127.0.0.1", port), name="r", limits=SafetyLimits()).shutdown_server()
    assert proc.wait(5) == 0
    port_file = tmp_path / "orphan.port"
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time\n"
            "p = subprocess.Popen([sys.executable, '-m', 'rlinf_envs.realworld.dummy_robot', '--port-file', "
            f"{str(port_file)!r}, '--poll-s', '0.05'])\n"
            "print(p.pid, flush=True)\n"
            "time.sleep(60)\n",
        ],
        stdout=subprocess.PIPE,
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    deadline = time.monotonic() + 30
    while not port_file.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _alive(child)
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


def test_dummy_contact_force_rises_when_pressing_off_the_hole() -> None:
    scene = PegScene()
    robot = DummyFranka(scene, seed=0)
    robot.reset(tool_down_pose(0.53, 0.0, scene.surface_z), 0.0)
    forces = []
    for depth in (0.0, 0.005, 0.01):
        state = robot.move(tool_down_pose(0.53, 0.0, scene.surface_z - depth), 0.0)
        assert state.tcp_pose[2] == pytest.approx(scene.surface_z)  # the board stops the peg
        forces.append(state.tcp_force[2])
    assert forces[0] < 1.0 < forces[1] < forces[2]
    robot.reset(tool_down_pose(0.5, 0.0, scene.surface_z + 0.005), 0.0)
    for _ in range(10):
        state = robot.move(tool_down_pose(0.5, 0.0, scene.bottom_z), 0.0)
    assert state.tcp_pose[2] == pytest.approx(scene.bottom_z, abs=1e-4) and abs(state.tcp_force[2]) < 1.0


# -- the vectorised env ---------------------------------------------------------------------------------------


def _toward_hole(obs: Any, target: np.ndarray, scale: float = 0.01) -> np.ndarray:
    """A scripted policy: align over the hole, then go down (``[N, 1, 6]``)."""
    state = obs["state"] if isinstance(obs, dict) else obs
    err = target[None, :3] - state[:, :3]
    aligned = np.linalg.norm(err[:, :2], axis=1) < 0.002
    err[~aligned, 2] = 0.0
    actions = np.zeros((len(state), 1, 6))
    actions[:, 0, :3] = np.clip(err / scale, -1.0, 1.0)
    return actions


def test_vec_env_contract_shapes_groups_and_chunks() -> None:
    env = RealWorldVecEnv(ENV_ID, 4, group_size=2, env_kwargs=DUMMY)
    try:
        assert isinstance(env, VecEnv)
        assert env.spec == realworld_spec(ENV_ID, "state")
        assert env.spec.obs_shape == (19,) and env.spec.action_dim == 6 and env.spec.action_low == (-1.0,) * 6
        obs = env.reset(seed=5)
        assert isinstance(obs, np.ndarray) and obs.shape == (4, 19) and obs.dtype == np.float32
        np.testing.assert_array_equal(obs[0, :7], obs[1, :7])  # a group shares its reset offset
        assert not np.array_equal(obs[0, :7], obs[2, :7])
        actions = np.random.default_rng(0).uniform(-1, 1, (4, 3, 6))
        res = env.chunk_step(actions)
        assert isinstance(res.obs, np.ndarray) and isinstance(res.final_obs, np.ndarray)
        assert res.obs.shape == (4, 19) and res.final_obs.shape == (4, 19)
        assert res.rewards.shape == (4, 3) and res.rewards.dtype == np.float32
        assert res.terminations.shape == res.truncations.shape == (4, 3)
        assert ((res.rewards > 0) & (res.rewards <= 1)).all()
        with pytest.raises(ValueError, match=r"actions must be \[num_envs=4, chunk, action_dim=6\]"):
            env.chunk_step(np.zeros((4, 3, 4)))
    finally:
        env.close()


def test_rgb_observations_follow_the_spec() -> None:
    env = RealWorldVecEnv(ENV_ID, 2, obs_mode="rgb", image_size=(48, 40), env_kwargs=DUMMY)
    try:
        assert env.spec == realworld_spec(ENV_ID, "rgb", (48, 40))
        assert env.spec.obs_dict is not None and env.spec.obs_shape == ()
        obs = env.reset(seed=0)
        assert isinstance(obs, dict)
        for key, spec in env.spec.obs_dict.items():
            assert obs[key].shape == (2, *spec.shape) and obs[key].dtype == np.dtype(spec.dtype)
        res = env.chunk_step(np.zeros((2, 2, 6)))
        assert isinstance(res.obs, dict) and res.obs["rgb"].shape == (2, 48, 40, 3)
        assert env.render().shape == (2, 48, 40, 3)
    finally:
        env.close()


def test_truncation_auto_reset_and_episode_stats() -> None:
    env = RealWorldVecEnv(ENV_ID, 2, max_episode_steps=5, env_kwargs=DUMMY)
    try:
        env.reset(seed=0)
        zeros = np.zeros((2, 3, 6))
        first = env.chunk_step(zeros)
        assert not first.dones.any() and first.episodes.lengths == []
        second = env.chunk_step(zeros)
        np.testing.assert_array_equal(second.truncations, [[False, True, False]] * 2)
        assert not second.terminations.any()
        assert second.episodes.lengths == [5, 5] and second.episodes.successes == [False, False]
        assert second.episodes.returns == pytest.approx(first.rewards.sum(1) + second.rewards[:, :2].sum(1))
        third = env.chunk_step(zeros)  # the new episodes run on: 1 + 3 steps, not truncated yet
        assert not third.dones.any()
    finally:
        env.close()


def test_without_auto_reset_a_finished_robot_is_left_alone() -> None:
    env = RealWorldVecEnv(ENV_ID, 1, auto_reset=False, max_episode_steps=2, env_kwargs=DUMMY)
    try:
        env.reset(seed=0)
        res = env.chunk_step(np.zeros((1, 4, 6)))
        np.testing.assert_array_equal(res.truncations, [[False, True, False, False]])
        np.testing.assert_array_equal(res.terminations, [[False, False, True, True]])
        assert (res.rewards[:, 2:] == 0).all() and res.episodes.lengths == [2]
        assert env.clients[0].stats()["moves_received"] == 2
    finally:
        env.close()


def test_scripted_policy_reaches_the_hole_and_succeeds() -> None:
    env = RealWorldVecEnv(ENV_ID, 2, env_kwargs={**DUMMY, "reward": {"type": "dense"}})
    try:
        target = np.asarray(env.settings.target_pose)
        obs = env.reset(seed=3)
        rewards: list[np.ndarray] = []
        stats: list[tuple[bool, int]] = []
        for _ in range(40):
            res = env.chunk_step(_toward_hole(obs, target))
            obs = res.obs
            rewards.append(res.rewards[:, 0])
            stats += zip(res.episodes.successes, res.episodes.lengths, strict=True)
            if len(stats) >= 2:
                break
        assert [s for s, _ in stats[:2]] == [True, True]
        assert all(n < 30 for _, n in stats[:2])
        assert rewards[-1].min() > 0.9 > 0.5 > rewards[0].max()  # the dense reward rises toward the hole
        idle = env.chunk_step(np.zeros((2, 5, 6)))  # standing still at the reset pose gets nowhere
        assert not idle.terminations.any() and idle.rewards.max() < 0.5
    finally:
        env.close()


def test_get_state_and_set_state_restore_counters_and_generators() -> None:
    kwargs: dict[str, Any] = {"max_episode_steps": 6, "group_size": 1, "env_kwargs": DUMMY}
    actions = np.random.default_rng(1).uniform(-1, 1, (2, 3, 6))
    a = RealWorldVecEnv(ENV_ID, 2, **kwargs)
    b = RealWorldVecEnv(ENV_ID, 2, **kwargs)
    try:
        a.reset(seed=2)
        a.chunk_step(actions)
        saved = a.get_state()
        a.chunk_step(actions)
        a.set_state(saved)
        b.set_state(saved)
        ra, rb = a.chunk_step(actions), b.chunk_step(actions)
        # The counters continue: 3 restored + 3 steps hits the 6-step limit at the chunk's end.
        np.testing.assert_array_equal(ra.truncations[:, -1], [True, True])
        # (and the generators: the auto-reset offsets drawn after the restore agree, so the obs below do)
        for x, y in ((ra.obs, rb.obs), (ra.rewards, rb.rewards), (ra.final_obs, rb.final_obs)):
            np.testing.assert_array_equal(x, y)
        assert ra.episodes == rb.episodes and ra.episodes.lengths == [6, 6]
        with pytest.raises(ValueError, match="cannot be loaded into a RealWorldVecEnv"):
            a.set_state({**saved, "num_envs": 3})
    finally:
        a.close()
        b.close()


def test_close_stops_every_dummy_server() -> None:
    others = set(_dummy_children())  # the module's shared server
    env = RealWorldVecEnv(ENV_ID, 3, env_kwargs=DUMMY)
    pids = env.dummy_pids
    assert len(pids) == 3 and all(_alive(p) for p in pids)
    assert set(_dummy_children()) - others == set(pids)
    env.close()
    env.close()  # idempotent
    assert not any(_alive(p) for p in pids) and set(_dummy_children()) == others and env.dummy_pids == []
    with pytest.raises(RuntimeError, match="closed"):
        env.reset(seed=0)


def test_a_robot_that_dies_mid_run_raises_unreachable_naming_it() -> None:
    others = set(_dummy_children())
    env = RealWorldVecEnv(ENV_ID, 2, env_kwargs={**DUMMY, "request_timeout_s": 1.0})
    try:
        env.reset(seed=0)
        os.kill(env.dummy_pids[1], signal.SIGKILL)
        with pytest.raises(
            RobotUnreachable, match=r"Franka unit 1 at 127\.0\.0\.1:\d+ did not answer the 'move'"
        ):
            env.chunk_step(np.zeros((2, 1, 6)))
    finally:
        env.close()
    assert set(_dummy_children()) == others


def test_hardware_entries_drive_already_running_robots(tmp_path: Path) -> None:
    proc, port = _start_server(tmp_path, seed=4)
    try:
        entry = {
            "node_rank": 0,
            "robot_ip": "127.0.0.1",
            "robot_port": port,
            "camera_serials": ["dummy-4-wrist"],
        }
        cfg = VecEnvConfig(env_type="realworld", env_id=ENV_ID, total_num_envs=1, obs_mode="rgb")
        env = make_vec_env(cfg, hardware=[entry])
        try:
            assert isinstance(env, RealWorldVecEnv) and env.dummy_pids == []
            assert env.reset(seed=0)["rgb"].shape == (1, 64, 64, 3)
        finally:
            env.close()
        assert proc.poll() is None  # closing the env leaves a robot it did not start running
        with pytest.raises(ValueError, match=r"camera_serials \['nope'\] are not cameras of Franka unit 0"):
            make_vec_env(cfg, hardware=[{**entry, "camera_serials": ["nope"]}])
    finally:
        _stop(proc)
    with pytest.raises(ValueError, match=r"envs \[0\] have no robot: .* or set env_kwargs\.is_dummy: true"):
        RealWorldVecEnv(ENV_ID, 1)
    with pytest.raises(ValueError, match=r"hardware\[0\]: unknown key\(s\) \['robot_adress'\]; allowed:"):
        RealWorldVecEnv(ENV_ID, 1, hardware=[{"node_rank": 0, "robot_adress": "x"}], env_kwargs=DUMMY)


def test_make_vec_env_with_dummy_robots_and_its_spec() -> None:
    cfg = VecEnvConfig(
        env_type="realworld",
        env_id=ENV_ID,
        total_num_envs=2,
        obs_mode="rgb",
        image_size=(32, 32),
        env_kwargs=DUMMY,
    )
    env = make_vec_env(cfg)
    try:
        assert isinstance(env, RealWorldVecEnv) and len(env.dummy_pids) == 2
        assert env.spec == env_spec_without_worker(cfg)
        assert env.reset(seed=0)["rgb"].shape == (2, 32, 32, 3)
    finally:
        env.close()
    with pytest.raises(ValueError, match="env_type 'gymnasium' is a simulator and takes none"):
        make_vec_env(VecEnvConfig(), hardware=[{"node_rank": 0, "robot_ip": "10.0.0.2"}])


def test_settings_are_checked_before_any_robot_starts() -> None:
    others = set(_dummy_children())
    with pytest.raises(
        ValueError, match=r"action_scale\[0\] = 0\.05 m allows .*safety_limits\.max_translation_m = 0\.03"
    ):
        RealWorldVecEnv(ENV_ID, 1, env_kwargs={**DUMMY, "action_scale": [0.05, 0.05]})
    with pytest.raises(ValueError, match=r"env_kwargs: unknown key\(s\) \['is_dumy'\]; allowed: is_dummy"):
        RealWorldVecEnv(ENV_ID, 1, env_kwargs={"is_dumy": True})
    with pytest.raises(
        ValueError, match="realworld env_id 'PegInsertion' is not known; allowed: FrankaPegInsertion-v1"
    ):
        RealWorldVecEnv("PegInsertion", 1, env_kwargs=DUMMY)
    assert set(_dummy_children()) == others


def test_env_config_problems_name_the_key_and_allowed_values() -> None:
    good = VecEnvConfig(env_type="realworld", env_id=ENV_ID, env_kwargs=DUMMY)
    assert env_config_problems(EnvConfig(train=good, eval=good)) == []
    bad_id = VecEnvConfig(env_type="realworld", env_id="FrankaPeg-v1")
    bad_mode = VecEnvConfig(env_type="realworld", env_id=ENV_ID, obs_mode="depth")
    id_problem, mode_problem = env_config_problems(EnvConfig(train=bad_id, eval=bad_mode))
    assert id_problem.startswith("env.train.env_id: 'FrankaPeg-v1' is not a registered realworld environment")
    assert "FrankaPegInsertion-v1" in id_problem
    assert (
        mode_problem
        == "env.eval.obs_mode: 'depth' is not an observation mode of realworld; allowed: state, rgb"
    )
    bad_kwargs = VecEnvConfig(env_type="realworld", env_id=ENV_ID, env_kwargs={"reward": {"type": "shaped"}})
    (kwargs_problem,) = env_config_problems(EnvConfig(train=good, eval=bad_kwargs))
    assert kwargs_problem == "env.eval.env_kwargs.reward.type must be one of dense, sparse; got 'shaped'"


def test_robot_errors_survive_pickling() -> None:
    """Ray sends a worker's exception to the driver by pickling it: the robot errors must rebuild as they were."""
    import pickle

    from rlinf_envs.realworld import RobotUnreachable, SafetyViolation

    lost = RobotUnreachable("Franka unit 0", ("127.0.0.1", 5555), "move", 5.0, "connection lost")
    again = pickle.loads(pickle.dumps(lost))
    assert (str(again), again.robot, again.address, again.request) == (
        str(lost),
        "Franka unit 0",
        ("127.0.0.1", 5555),
        "move",
    )
    refused = SafetyViolation("Franka unit 0", "workspace z", 0.9, "[0, 0.5] m")
    assert str(pickle.loads(pickle.dumps(refused))) == str(refused)
