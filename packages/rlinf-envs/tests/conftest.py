"""Fixtures of the rlinf-envs tests: the Vulkan driver that ManiSkill needs."""

from __future__ import annotations

import fcntl
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

INSTALL_SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "install_vulkan_cpu.sh"


def _install_vulkan_driver() -> Path | None:
    """Run scripts/install_vulkan_cpu.sh once per machine (xdist workers wait on a lock); the ICD file or None."""
    from rlinf_envs.maniskill import find_installed_icd

    lock = Path(tempfile.gettempdir()) / "rlinf-install-vulkan.lock"
    with lock.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        if find_installed_icd() is None:
            subprocess.run(["bash", str(INSTALL_SCRIPT)], capture_output=True, text=True, timeout=600)
        return find_installed_icd()


@pytest.fixture(scope="module")
def vulkan() -> Iterator[None]:
    """Use the driver of scripts/install_vulkan_cpu.sh (installing it on first use); skip (fail in CI) without one."""
    pytest.importorskip("mani_skill", reason='needs the ManiSkill extra: pip install "rlinf-envs[maniskill]"')
    import torch
    from rlinf_envs.maniskill import VulkanUnavailableError, ensure_vulkan, find_installed_icd

    saved = os.environ.get("VK_ICD_FILENAMES")
    icd = find_installed_icd() if saved is None else None
    if saved is None and icd is None and not torch.cuda.is_available():
        icd = _install_vulkan_driver()
    if saved is None and icd is not None:
        os.environ["VK_ICD_FILENAMES"] = str(icd)
    try:
        try:
            ensure_vulkan("cuda" if torch.cuda.is_available() else "cpu")
        except VulkanUnavailableError as e:
            msg = f"no Vulkan driver for ManiSkill (run scripts/install_vulkan_cpu.sh): {e}"
            if os.environ.get("CI"):
                pytest.fail(f".ci/run must provide the Vulkan driver. {msg}")
            pytest.skip(msg)
        yield
    finally:
        if saved is None:
            os.environ.pop("VK_ICD_FILENAMES", None)
        else:
            os.environ["VK_ICD_FILENAMES"] = saved
