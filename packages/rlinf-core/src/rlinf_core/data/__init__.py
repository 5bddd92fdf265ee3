"""Prompt datasets (JSONL / Parquet), prompt encoding and padded batches for reasoning RL and SFT."""

from ._config import DataConfig
from ._dataset import DatasetError, PromptDataset, PromptExample, PromptSampler, load_prompt_dataset
from ._encoding import ChatPromptEncoder, PromptEncoder, pack_sequences

__all__ = [
    "ChatPromptEncoder",
    "DataConfig",
    "DatasetError",
    "PromptDataset",
    "PromptEncoder",
    "PromptExample",
    "PromptSampler",
    "load_prompt_dataset",
    "pack_sequences",
]
