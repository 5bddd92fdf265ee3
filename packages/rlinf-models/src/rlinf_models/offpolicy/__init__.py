"""Off-policy embodied training: replay buffers."""

from ._buffer import ReplayBuffer, SymmetricSampler

__all__ = ["ReplayBuffer", "SymmetricSampler"]
