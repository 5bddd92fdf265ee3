"""``prepare_process_env``: what the simulators of a run need in the environment of the processes it starts."""

from __future__ import annotations

import os
from collections.abc import Mapping

from ._config import EnvConfig

__all__ = ["libero_gl_env", "prepare_process_env"]


def libero_gl_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The OpenGL variables LIBERO's offscreen rendering needs that ``environ`` lacks.

    robosuite chooses its GL context from ``MUJOCO_GL`` when first imported (it forces ``egl`` unless the value is
    ``osmesa`` or ``glx``) and PyOpenGL its platform from ``PYOPENGL_PLATFORM`` when first imported: ``egl`` for
    both unless set (EGL renders without a display, on a GPU or with Mesa's software renderer); a user's
    ``MUJOCO_GL=osmesa`` gets the matching ``PYOPENGL_PLATFORM``.
    """
    out: dict[str, str] = {}
    if "MUJOCO_GL" not in environ:
        out["MUJOCO_GL"] = "egl"
    backend = environ.get("MUJOCO_GL", "egl").lower()
    if "PYOPENGL_PLATFORM" not in environ and backend in ("egl", "osmesa"):
        out["PYOPENGL_PLATFORM"] = backend
    return out


def prepare_process_env(cfg: EnvConfig) -> dict[str, str]:
    """Set the environment variables the simulators of ``cfg`` need, before the cluster starts its workers.

    Env workers inherit the driver's environment, so this must run in the driver before the cluster starts.
    ManiSkill (SAPIEN) needs a Vulkan driver; when ``VK_ICD_FILENAMES`` is unset, the lavapipe driver
    that ``scripts/install_vulkan_cpu.sh`` unpacked (if any, see ``rlinf_envs.maniskill.find_installed_icd``)
    is selected. LIBERO renders with EGL: ``MUJOCO_GL`` and ``PYOPENGL_PLATFORM`` default to ``egl``
    (:func:`libero_gl_env`). Meta-World camera observations (``obs_mode: rgb``) render offscreen: when
    ``MUJOCO_GL`` is unset it is set to ``egl`` (headless; Mesa's software EGL needs no GPU), so MuJoCo picks that
    backend when the workers import it. Variables the user set are never changed.

    Returns:
        The variables this call set (empty when nothing was needed or everything was already set).
    """
    changed: dict[str, str] = {}
    if "maniskill" in (cfg.train.env_type, cfg.eval.env_type) and "VK_ICD_FILENAMES" not in os.environ:
        # The maniskill extra is installed whenever a config selects it; import it only then.
        from .maniskill import find_installed_icd

        icd = find_installed_icd()
        if icd is not None:
            changed["VK_ICD_FILENAMES"] = str(icd)
    if "libero" in (cfg.train.env_type, cfg.eval.env_type):
        changed.update(libero_gl_env(os.environ))
    rgb = any(s.env_type == "metaworld" and s.obs_mode == "rgb" for s in (cfg.train, cfg.eval))
    if rgb and "MUJOCO_GL" not in os.environ:
        changed.setdefault("MUJOCO_GL", "egl")
    os.environ.update(changed)
    return changed
