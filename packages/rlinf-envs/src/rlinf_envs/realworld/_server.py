"""The dummy robot server: a :class:`DummyFranka` behind the framed protocol on a TCP socket.

Run as ``python -m rlinf_envs.realworld.dummy_robot --port 0 --port-file F [--seed S] [--image-size H W]
[--target-pose x y z qx qy qz qw]``. It listens on ``--host`` (default ``127.0.0.1``), writes the port it got
into ``--port-file`` (atomically, once listening), and serves clients one request at a time (several clients
may stay connected). It exits after replying to ``close``, on SIGTERM, and when its parent process dies (the
parent pid is polled every ``--poll-s`` seconds; ``PR_SET_PDEATHSIG`` is not used because it fires when the
parent *thread* that started the server exits, which in a thread-pooled worker is not the parent's death).
"""

from __future__ import annotations

import argparse
import os
import selectors
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ._dummy import CAMERAS, DummyFranka, PegScene, Refused
from ._protocol import PROTOCOL_VERSION, pack_arrays, recv_message, send_message

__all__ = ["handle_request", "main", "serve"]

_READ_TIMEOUT_S = 5.0
"""How long a client may take to send the rest of a frame once its first bytes arrived."""


def handle_request(robot: DummyFranka, header: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
    """The reply header and payload for one request (``close`` is answered here and acted on by :func:`serve`)."""
    op = header.get("op")
    try:
        if op == "hello":
            h, w = robot.image_size
            return {
                "ok": True,
                "protocol": PROTOCOL_VERSION,
                "robot_type": "Franka",
                "serial": f"dummy-franka-{robot.seed}",
                "cameras": {name: f"dummy-{robot.seed}-{name}" for name in CAMERAS},
                "image_shape": [h, w, 3],
                "control_hz": 1.0 / robot.dt,
            }, b""
        if op == "state":
            return {"ok": True, "state": robot.state().to_dict()}, b""
        if op == "frames":
            meta, payload = pack_arrays(robot.frames())
            return {"ok": True, "arrays": meta}, payload
        if op == "move":
            state = robot.move(header["pose"], float(header["gripper"]))
            return {"ok": True, "state": state.to_dict()}, b""
        if op == "reset":
            seed = header.get("seed")
            state = robot.reset(header["pose"], float(header["gripper"]), None if seed is None else int(seed))
            return {"ok": True, "state": state.to_dict()}, b""
        if op == "estop":
            robot.estop()
            return {"ok": True}, b""
        if op == "clear_estop":
            robot.clear_estop()
            return {"ok": True}, b""
        if op == "stats":
            return {
                "ok": True,
                "stats": dict(robot.counts),
                "estopped": robot.estopped,
                "fault": robot.fault,
            }, b""
        if op == "close":
            return {"ok": True}, b""
    except Refused as e:
        return {"ok": False, "error": e.error, "message": str(e)}, b""
    except (KeyError, TypeError, ValueError) as e:
        return {"ok": False, "error": "bad_request", "message": f"malformed {op!r} request: {e!r}"}, b""
    return {"ok": False, "error": "bad_request", "message": f"unknown op {op!r}"}, b""


def _parent_alive(parent_pid: int) -> bool:
    return os.getppid() == parent_pid


def serve(robot: DummyFranka, listener: socket.socket, *, parent_pid: int, poll_s: float = 0.2) -> None:
    """Answer requests on ``listener`` until ``close``, or until ``parent_pid`` is no longer this process's parent."""
    sel = selectors.DefaultSelector()
    listener.setblocking(False)
    sel.register(listener, selectors.EVENT_READ)
    try:
        while _parent_alive(parent_pid):
            for key, _ in sel.select(timeout=poll_s):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if sock is listener:
                    conn, _ = listener.accept()
                    conn.setblocking(True)
                    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    sel.register(conn, selectors.EVENT_READ)
                    continue
                outcome = _answer(robot, sock)
                if outcome == "close":
                    return
                if outcome == "broken":
                    sel.unregister(sock)
                    sock.close()
    finally:
        for key in list(sel.get_map().values()):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            sock.close()
        sel.close()


def _answer(robot: DummyFranka, conn: socket.socket) -> str:
    """Serve one request from ``conn``: ``"close"`` (it asked the server to exit), ``"broken"`` or ``"ok"``."""
    conn.settimeout(_READ_TIMEOUT_S)
    try:
        header, _ = recv_message(conn)
    except (EOFError, OSError, ValueError):
        return "broken"
    reply, payload = handle_request(robot, header)
    if "id" in header:
        reply["id"] = header["id"]
    try:
        send_message(conn, reply, payload)
    except OSError:
        return "broken"
    return "close" if header.get("op") == "close" else "ok"


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="A dummy Franka robot server (peg insertion) for rlinf_envs.realworld."
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0: any free port (see --port-file)")
    p.add_argument("--port-file", type=Path, default=None, help="write the listening port here")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--image-size", type=int, nargs=2, default=(64, 64), metavar=("H", "W"))
    p.add_argument("--control-hz", type=float, default=10.0)
    p.add_argument(
        "--target-pose",
        type=float,
        nargs=7,
        default=None,
        metavar="V",
        help="fully inserted TCP pose (xyz + xyzw)",
    )
    p.add_argument(
        "--parent-pid", type=int, default=None, help="exit when this process dies (default: the parent)"
    )
    p.add_argument("--poll-s", type=float, default=0.2)
    args = p.parse_args(argv)
    if min(args.image_size) < 1:
        p.error(f"--image-size must be positive, got {args.image_size}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m rlinf_envs.realworld.dummy_robot``; returns the exit code."""
    args = _parse(argv)
    parent = os.getppid() if args.parent_pid is None else args.parent_pid
    scene = PegScene() if args.target_pose is None else PegScene.from_target(args.target_pose)
    h, w = args.image_size
    robot = DummyFranka(scene, seed=args.seed, image_size=(h, w), control_hz=args.control_hz)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((args.host, args.port))
    listener.listen()
    if args.port_file is not None:
        tmp = args.port_file.with_suffix(".tmp")
        tmp.write_text(str(listener.getsockname()[1]))
        tmp.replace(args.port_file)
    serve(robot, listener, parent_pid=parent, poll_s=args.poll_s)
    return 0
