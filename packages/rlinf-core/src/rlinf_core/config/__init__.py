"""Configuration: frozen attrs classes, YAML files and Hydra-style command-line overrides."""

from ._algorithm import AlgorithmConfig
from ._loader import CommandLine, apply_override, load_config, load_yaml, parse_command_line
from ._reference import ConfigField, config_fields, config_reference, field_docstrings
from ._structure import ConfigError, structure_config, unstructure_config

__all__ = [
    "AlgorithmConfig",
    "CommandLine",
    "ConfigError",
    "ConfigField",
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
