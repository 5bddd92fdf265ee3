"""The LeRobot dataset format (v3.0): :class:`LeRobotWriter` and :class:`LeRobotReader` (``rlinf-core[lerobot]``)."""

from ._format import CODEBASE_VERSION, ActionChunks, LeRobotFeature, LeRobotReader, LeRobotWriter

__all__ = ["CODEBASE_VERSION", "ActionChunks", "LeRobotFeature", "LeRobotReader", "LeRobotWriter"]
