"""``prepare_process_env``: ManiSkill's Vulkan driver and LIBERO's GL backend are chosen before workers start, never overridden."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from rlinf_envs import EnvConfig, VecEnvConfig, prepare_process_env


def _maniskill() -> EnvConfig:
    split = VecEnvConfig(env_type="maniskill", env_id="PushCube-v1")
    return EnvConfig(train=split, eval=split)


def test_gymnasium_needs_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VK_ICD_FILENAMES", raising=False)
    before = dict(os.environ)
    assert prepare_process_env(EnvConfig()) == {}
    assert dict(os.environ) == before


def test_maniskill_selects_the_installed_driver(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pytest.importorskip("mani_skill", reason='needs the ManiSkill extra: pip install "rlinf-envs[maniskill]"')
    (tmp_path / "lvp_icd.json").write_text("{}")
    monkeypatch.setenv("RLINF_VULKAN_DIR", str(tmp_path))
    monkeypatch.delenv("VK_ICD_FILENAMES", raising=False)
    assert prepare_process_env(_maniskill()) == {"VK_ICD_FILENAMES": str(tmp_path / "lvp_icd.json")}
    assert os.environ["VK_ICD_FILENAMES"] == str(tmp_path / "lvp_icd.json")


def test_a_driver_the_user_set_is_kept(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("VK_ICD_FILENAMES", "/my/icd.json")
    monkeypatch.setenv("RLINF_VULKAN_DIR", str(tmp_path))
    assert prepare_process_env(_maniskill()) == {}
    assert os.environ["VK_ICD_FILENAMES"] == "/my/icd.json"


def _libero() -> EnvConfig:
    split = VecEnvConfig(env_type="libero", env_id="libero_spatial")
    return EnvConfig(train=split, eval=split)


def test_libero_renders_with_egl_unless_the_user_chose(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MUJOCO_GL", raising=False)
    monkeypatch.delenv("PYOPENGL_PLATFORM", raising=False)
    assert prepare_process_env(_libero()) == {"MUJOCO_GL": "egl", "PYOPENGL_PLATFORM": "egl"}
    assert os.environ["MUJOCO_GL"] == "egl" and os.environ["PYOPENGL_PLATFORM"] == "egl"
    monkeypatch.setenv("MUJOCO_GL", "osmesa")
    monkeypatch.delenv("PYOPENGL_PLATFORM")
    assert prepare_process_env(_libero()) == {"PYOPENGL_PLATFORM": "osmesa"}
    monkeypatch.setenv("PYOPENGL_PLATFORM", "egl")
    assert prepare_process_env(_libero()) == {}
    assert os.environ["MUJOCO_GL"] == "osmesa"
