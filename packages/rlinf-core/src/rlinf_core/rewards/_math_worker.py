"""Entry point of one math-verify worker process (spawned by `MathVerifier`; not a public module).

Run as ``python -m rlinf_core.rewards._math_worker``; it imports only the standard library and
`rlinf_algos.rewards.math` (math-verify), never Ray.

Protocol (JSON lines): the worker first writes ``{"ready": true}`` (or ``{"ready": false, "error": ...}``),
then answers each ``{"id", "response", "references"}`` line on stdin with ``{"id", "ok"}`` on its protocol
channel. It exits at stdin EOF and, on Linux, when its parent process dies.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from typing import Any, TextIO


def _die_with_parent(parent: int) -> None:
    """Ask Linux to SIGKILL this process when the parent goes away (a verifier stuck in C code ignores EOF)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(0)


def _reply(channel: TextIO, message: dict[str, Any]) -> None:
    channel.write(json.dumps(message) + "\n")
    channel.flush()


def main() -> None:
    """Serve verification requests until stdin closes."""
    parent = os.getppid()
    # The protocol gets a private copy of stdout; fd 1 then points at stderr so stray prints cannot corrupt it.
    channel = os.fdopen(os.dup(1), "w", encoding="ascii")
    os.dup2(2, 1)
    _die_with_parent(parent)
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    try:
        # Imported here (not at module top) so that a missing extra is reported through the protocol.
        from rlinf_algos.rewards.math import verify_math_answer
    except BaseException as e:
        _reply(channel, {"ready": False, "error": f"{type(e).__name__}: {e}"})
        return
    _reply(channel, {"ready": True})
    for line in sys.stdin.buffer:
        if not line.strip():
            continue
        request = json.loads(line)
        try:
            ok = bool(verify_math_answer(request["response"], request["references"]))
        except Exception:
            ok = False
        _reply(channel, {"id": request["id"], "ok": ok})


if __name__ == "__main__":
    main()
