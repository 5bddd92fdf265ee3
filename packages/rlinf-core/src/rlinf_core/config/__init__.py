"""Configuration: frozen attrs classes, YAML files and Hydra-style command-line overrides."""

from ._loader import CommandLine, apply_override, load_config, load_yaml, parse_command_line
from ._structure import ConfigError, structure_config, unstructure_config

__all__ = [
    "CommandLine",
    "ConfigError",
    "apply_override",
    "load_config",
    "load_yaml",
    "parse_command_line",
    "structure_config",
    "unstructure_config",
]
