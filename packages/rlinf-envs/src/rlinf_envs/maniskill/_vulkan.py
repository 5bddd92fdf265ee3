"""Checks that SAPIEN can create a Vulkan device before ManiSkill touches it.

Without a usable Vulkan driver SAPIEN fails deep inside ManiSkill's scene setup, and some broken drivers crash
the process instead of raising. The check therefore runs in a short-lived subprocess with a timeout, once per
process and driver configuration, and turns every failure into a :class:`VulkanUnavailableError` that says
what to install.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

__all__ = ["VulkanUnavailableError", "ensure_vulkan", "find_installed_icd"]

_PROBE = """
import warnings
warnings.simplefilter("ignore")
import sapien
sapien.render.RenderSystem(sapien.Device({device!r}))
"""

_checked: dict[tuple[str, str], str | None] = {}


class VulkanUnavailableError(RuntimeError):
    """SAPIEN (ManiSkill's simulator) cannot create a Vulkan device for rendering/scene building."""


def find_installed_icd() -> Path | None:
    """Return the lavapipe ICD file written by ``scripts/install_vulkan_cpu.sh``, if one is installed.

    Looks in ``$RLINF_VULKAN_DIR``, ``/opt/rlinf/vulkan-cpu`` and ``~/.cache/rlinf/vulkan-cpu`` (the
    script's defaults), in that order.
    """
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    dirs = [Path(d) for d in [os.environ.get("RLINF_VULKAN_DIR")] if d]
    dirs += [Path("/opt/rlinf/vulkan-cpu"), cache / "rlinf/vulkan-cpu"]
    return next((d / "lvp_icd.json" for d in dirs if (d / "lvp_icd.json").is_file()), None)


def _advice(device: str) -> str:
    icd = find_installed_icd()
    lines = []
    if device.startswith("cuda"):
        lines.append(
            "  - GPU rendering needs the NVIDIA driver's Vulkan ICD (nvidia_icd.json, libGLX_nvidia)."
        )
    lines.append(
        "  - CPU (no GPU): Mesa lavapipe >= 24 (Debian bookworm's Mesa 22 is too old). Run\n"
        '      eval "$(bash scripts/install_vulkan_cpu.sh)"\n'
        "    which unpacks mesa-vulkan-drivers from bookworm-backports (apt-get download, no system install)\n"
        "    and prints `export VK_ICD_FILENAMES=<dir>/lvp_icd.json`; or install mesa-vulkan-drivers >= 24\n"
        "    system-wide (apt-get install -t bookworm-backports mesa-vulkan-drivers)."
    )
    if icd is not None and os.environ.get("VK_ICD_FILENAMES") != str(icd):
        lines.append(f"  - A lavapipe driver is installed at {icd}: export VK_ICD_FILENAMES={icd}")
    return "\n".join(lines)


def ensure_vulkan(device: str = "cpu", *, timeout_s: float = 60.0) -> None:
    """Raise :class:`VulkanUnavailableError` unless SAPIEN can create a render system on ``device``.

    The probe runs once per (``VK_ICD_FILENAMES``, device) per process, in a subprocess so that a crashing or
    hanging driver cannot take the caller down (about 0.6 s).

    Args:
        device: SAPIEN device string, ``"cpu"`` (lavapipe) or ``"cuda"``/``"cuda:N"``.
        timeout_s: how long the probe may take before the driver is declared unusable.
    """
    key = (os.environ.get("VK_ICD_FILENAMES", ""), device)
    if key not in _checked:
        try:
            proc = subprocess.run(
                [sys.executable, "-c", _PROBE.format(device=device)],
                capture_output=True,
                text=True,
                timeout=timeout_s,
            )
            if proc.returncode == 0:
                _checked[key] = None
            else:
                tail = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
                if proc.returncode < 0:
                    tail = f"the probe process died with signal {-proc.returncode} ({tail})"
                _checked[key] = tail
        except subprocess.TimeoutExpired:
            _checked[key] = f"the probe did not finish within {timeout_s:.0f} s"
    reason = _checked[key]
    if reason is not None:
        icd = key[0] or "unset"
        raise VulkanUnavailableError(
            f"ManiSkill needs a working Vulkan driver, but SAPIEN cannot create a {device!r} render device "
            f"(VK_ICD_FILENAMES={icd}): {reason}\n{_advice(device)}"
        )
