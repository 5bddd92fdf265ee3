"""Configuration: frozen attrs classes, YAML files and Hydra-style command-line overrides."""

from ._algorithm import AlgorithmConfig
from ._loader import CommandLine, apply_override, load_config, load_yaml, parse_command_line
from ._offpolicy import (
    OFFPOLICY_LOSS_TYPES,
    DemoBufferConfig,
    EntropyOptimConfig,
    EntropyTuningConfig,
    ReplayBufferConfig,
)
from ._reference import ConfigField, config_fields, config_reference, field_docstrings
from ._structure import ConfigError, structure_config, unstructure_config

__all__ = [
    "OFFPOLICY_LOSS_TYPES",
    "AlgorithmConfig",
    "CommandLine",
    "ConfigError",
    "ConfigField",
    "DemoBufferConfig",
    "EntropyOptimConfig",
    "EntropyTuningConfig",
    "ReplayBufferConfig",
    "apply_override",
    "config_fields",
    "config_reference",
    "field_docstrings",
    "load_config",
    "load_yaml",
    "parse_command_line",
    "structure_config",
    "unstructure_config",
]
