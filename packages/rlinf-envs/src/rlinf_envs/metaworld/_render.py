"""Offscreen camera images of a MuJoCo model, with the OpenGL backend chosen when the renderer is built.

``mujoco.Renderer`` takes its OpenGL backend from ``MUJOCO_GL`` as it was when ``mujoco`` was first imported
(unset on Linux: GLFW, which needs a display). This renderer reads ``MUJOCO_GL`` when it is constructed
instead and uses headless EGL when the variable is unset, so a process that imported ``mujoco`` before
anyone set the variable still renders without a display. The environment is never modified here (mujoco's
own EGL module sets ``PYOPENGL_PLATFORM=egl`` when it is imported and that variable is unset).
"""

from __future__ import annotations

import atexit
import importlib
import os
import weakref
from typing import Any

import numpy as np

try:
    import mujoco
except ImportError as e:  # pragma: no cover - exercised by the extra-missing test
    raise ImportError(f'the Meta-World backend needs: pip install "rlinf-envs[metaworld]" ({e})') from e

__all__ = ["GL_BACKENDS", "CameraRenderer", "gl_backend"]

GL_BACKENDS = ("egl", "osmesa", "glfw")
"""``MUJOCO_GL`` values the renderer supports (unset: ``egl``)."""

_LIVE: weakref.WeakSet[CameraRenderer] = weakref.WeakSet()
_ATEXIT_REGISTERED = False


def gl_backend() -> str:
    """The OpenGL backend a renderer built now uses: ``MUJOCO_GL`` if set, else ``egl``.

    Raises:
        ValueError: for a ``MUJOCO_GL`` value other than :data:`GL_BACKENDS`.
    """
    name = os.environ.get("MUJOCO_GL", "").strip().lower() or "egl"
    if name not in GL_BACKENDS:
        raise ValueError(
            f"MUJOCO_GL={name!r} cannot render offscreen here; use one of {', '.join(GL_BACKENDS)}"
        )
    return name


def _gl_context(name: str, width: int, height: int) -> Any:
    if name == "egl":
        from mujoco.egl import GLContext
    elif name == "osmesa":
        from mujoco.osmesa import GLContext
    else:
        from mujoco.glfw import GLContext
    return GLContext(width, height)


def _current_context(backend: str) -> Any:
    """What is current in the calling thread (``None``: nothing), for :func:`_make_current_again`."""
    if backend == "egl":
        import mujoco.egl as mj_egl

        egl = mj_egl.EGL
        context = egl.eglGetCurrentContext()
        if not context:
            return None
        draw, read = egl.eglGetCurrentSurface(egl.EGL_DRAW), egl.eglGetCurrentSurface(egl.EGL_READ)
        return (egl.eglGetCurrentDisplay(), draw, read, context)
    if backend == "glfw":  # glfw (a mujoco dependency) is untyped: reached as Any
        glfw: Any = importlib.import_module("glfw")
        return glfw.get_current_context() or None
    return None  # OSMesa binds a context to its buffer, which only the context's owner knows


def _make_current_again(backend: str, previous: Any) -> None:
    """Make ``previous`` current again, or leave no context current in the calling thread.

    An EGL context can be current in one thread at a time: an env worker may render from different threads in
    turn (Ray runs actor calls on a thread pool), so a render never leaves its own context current. A context
    that was current before (gymnasium's MuJoCo renderer makes its context current once and relies on it)
    is current again afterwards.
    """
    if backend == "egl":
        import mujoco.egl as mj_egl

        egl = mj_egl.EGL
        if previous is None:
            egl.eglMakeCurrent(mj_egl.EGL_DISPLAY, egl.EGL_NO_SURFACE, egl.EGL_NO_SURFACE, egl.EGL_NO_CONTEXT)
        else:
            egl.eglMakeCurrent(*previous)
    elif backend == "osmesa":  # PyOpenGL (a mujoco dependency) is untyped: reached as Any
        gl: Any = importlib.import_module("OpenGL.GL")
        importlib.import_module("OpenGL.osmesa").OSMesaMakeCurrent(None, None, gl.GL_FLOAT, 0, 0)
    else:
        glfw: Any = importlib.import_module("glfw")
        glfw.make_context_current(previous)


def _free_all() -> None:
    # Registered after mujoco's EGL module registers eglTerminate, so it runs first (atexit is LIFO): contexts
    # still open at exit are freed while the display is alive instead of failing noisily in __del__ later.
    for renderer in list(_LIVE):
        renderer.close()


class CameraRenderer:
    """``[H, W, 3]`` uint8 images of one named camera of ``model``, upright.

    Upright means the world's up is at the top of the image: MuJoCo cameras whose up axis points below the
    horizon when the renderer first draws (Meta-World's ``corner`` cameras are mounted upside down) are
    rotated by 180°, the others are returned as the camera sees them.

    Args:
        model: the MuJoCo model (its offscreen buffer is enlarged to the image size if needed).
        camera: a camera name of ``model``.
        height: image rows.
        width: image columns.
        fast: draw without shadows, reflections and multisampling. On a software OpenGL (Mesa llvmpipe) a
            128x128 Meta-World frame costs ~10 ms instead of ~100-150 ms, with nearly the same picture.

    Raises:
        ValueError: for an unknown camera name or an unsupported ``MUJOCO_GL``.
    """

    def __init__(self, model: Any, camera: str, height: int, width: int, *, fast: bool = True) -> None:
        global _ATEXIT_REGISTERED
        cam_id = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, camera)
        if cam_id < 0:
            names = [mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_CAMERA, i) for i in range(model.ncam)]
            raise ValueError(f"camera {camera!r} is not in the model; cameras: {', '.join(names)}")
        self._cam_id = cam_id
        model.vis.global_.offwidth = max(int(model.vis.global_.offwidth), width)
        model.vis.global_.offheight = max(int(model.vis.global_.offheight), height)
        if fast:
            model.vis.quality.offsamples = 0
        self._backend = gl_backend()
        previous = _current_context(self._backend)
        self._gl: Any = _gl_context(self._backend, width, height)
        self._gl.make_current()
        try:
            self._con: Any = mujoco.MjrContext(model, mujoco.mjtFontScale.mjFONTSCALE_150)
            mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN, self._con)
        finally:
            _make_current_again(self._backend, previous)
        self._scene = mujoco.MjvScene(model, maxgeom=10_000)
        if fast:
            self._scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = 0
            self._scene.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0
        self._cam = mujoco.MjvCamera()
        self._cam.type = mujoco.mjtCamera.mjCAMERA_FIXED
        self._cam.fixedcamid = cam_id
        self._opt = mujoco.MjvOption()
        self._rect = mujoco.MjrRect(0, 0, width, height)
        self._buf = np.empty((height, width, 3), dtype=np.uint8)
        self._upside_down: bool | None = None
        _LIVE.add(self)
        if not _ATEXIT_REGISTERED:
            atexit.register(_free_all)
            _ATEXIT_REGISTERED = True

    def render(self, model: Any, data: Any) -> np.ndarray:
        """The camera's current image of ``data`` (derived quantities as of the last ``mj_forward``/step)."""
        if self._gl is None:
            raise RuntimeError("this CameraRenderer is closed")
        mujoco.mjv_updateScene(
            model, data, self._opt, None, self._cam, mujoco.mjtCatBit.mjCAT_ALL.value, self._scene
        )
        previous = _current_context(self._backend)
        self._gl.make_current()
        try:
            mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN, self._con)
            mujoco.mjr_render(self._rect, self._scene, self._con)
            mujoco.mjr_readPixels(self._buf, None, self._rect, self._con)
        finally:
            _make_current_again(self._backend, previous)
        if self._upside_down is None:
            # z component of the camera's y (up) axis in the world frame, row-major 3x3 cam_xmat
            self._upside_down = bool(data.cam_xmat[self._cam_id][7] < 0.0)
        # OpenGL rows run bottom-up: flip them; an upside-down camera is also mirrored left-right (180°).
        out: np.ndarray = self._buf[:, ::-1] if self._upside_down else self._buf[::-1]
        return out.copy()

    def close(self) -> None:
        """Release the OpenGL context; idempotent."""
        if self._gl is not None:
            previous = _current_context(self._backend)
            self._gl.make_current()
            self._con.free()
            _make_current_again(self._backend, previous)
            self._gl.free()
            self._gl = None
        _LIVE.discard(self)
