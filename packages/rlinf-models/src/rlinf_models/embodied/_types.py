"""The names the embodied trainer accepts, in a torch-free module so that config checks can read them."""

__all__ = ["EMBODIED_ADV_TYPES", "MASKED_ADV_TYPES", "REQUIRED_BATCH_KEYS"]

REQUIRED_BATCH_KEYS = ("obs", "actions", "rewards", "dones", "prev_logprobs", "prev_values")

EMBODIED_ADV_TYPES = ("gae", "grpo", "raw")
"""``algorithm.adv_type`` values the trainer computes from a rollout batch (the others of the registry need
inputs an embodied rollout does not have: teacher log-probs, trajectory indices, video frames)."""

MASKED_ADV_TYPES = ("grpo", "raw")
"""Estimators over whole episodes: they need the episode masks of ``env.train.auto_reset: false``."""
