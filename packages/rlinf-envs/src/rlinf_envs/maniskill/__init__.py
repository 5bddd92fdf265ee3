"""ManiSkill3 backend (CPU ``physx_cpu`` sim with state or camera observations, GPU sim where CUDA exists).

Install with ``pip install "rlinf-envs[maniskill]"``. SAPIEN needs a Vulkan driver; without a GPU run
``scripts/install_vulkan_cpu.sh`` and export the ``VK_ICD_FILENAMES`` it prints.
"""

from ._experts import SCRIPTED_EXPERTS, ScriptedExpert, pickcube_expert, scripted_expert
from ._vec import (
    CPU_SIM_BACKENDS,
    GPU_SIM_BACKENDS,
    OBS_MODES,
    REWARD_MODES,
    VECTOR_MODES,
    ManiSkillVecEnv,
    supported_control_modes,
)
from ._vulkan import VulkanUnavailableError, ensure_vulkan, find_installed_icd

__all__ = [
    "CPU_SIM_BACKENDS",
    "GPU_SIM_BACKENDS",
    "OBS_MODES",
    "REWARD_MODES",
    "SCRIPTED_EXPERTS",
    "VECTOR_MODES",
    "ManiSkillVecEnv",
    "ScriptedExpert",
    "VulkanUnavailableError",
    "ensure_vulkan",
    "find_installed_icd",
    "pickcube_expert",
    "scripted_expert",
    "supported_control_modes",
]
