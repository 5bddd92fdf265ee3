"""``actor.megatron``: parallel layout and kernels of the Megatron-core training backend."""

from __future__ import annotations

from typing import Literal

import attrs
from attrs import validators as v

__all__ = ["MegatronConfig"]


@attrs.frozen(kw_only=True)
class MegatronConfig:
    """How the Megatron-core backend splits and runs the model (config ``actor.megatron``).

    The data-parallel size is what is left: ``world_size / (tensor_parallel_size × pipeline_parallel_size)``.
    """

    tensor_parallel_size: int = attrs.field(default=1, validator=v.ge(1))
    """Ranks that split each layer's matrices (must divide the key/value heads and the FFN width)."""
    pipeline_parallel_size: int = attrs.field(default=1, validator=v.ge(1))
    """Pipeline stages (must divide the number of layers; 1F1B schedule)."""
    sequence_parallel: bool = False
    """Split norms/dropouts along the sequence over the tensor-parallel ranks (only when TP > 1)."""
    use_distributed_optimizer: bool = True
    """Shard the optimizer state over data-parallel ranks (Megatron ``DistributedOptimizer``)."""
    transformer_impl: Literal["local", "transformer_engine"] = attrs.field(
        default="local", validator=v.in_(("local", "transformer_engine"))
    )
    """``local``: megatron-core's PyTorch layer spec; ``transformer_engine``: the TE spec (needs
    ``transformer-engine`` installed separately)."""
    make_vocab_size_divisible_by: int = attrs.field(default=128, validator=v.ge(1))
    """The vocabulary is zero-padded to a multiple of this × ``tensor_parallel_size``."""
    recompute_activations: bool = False
    """Full activation recomputation of every layer (less memory, ~1/3 more compute)."""
    grad_reduce_in_fp32: bool = True
    """Accumulate and all-reduce gradients in float32 when parameters are bfloat16."""
    lr_warmup_steps: int = attrs.field(default=0, validator=v.ge(0))
    """Linear learning-rate warm-up (optimizer steps) before ``optim.lr_schedule`` applies."""
    distributed_timeout_minutes: int = attrs.field(default=30, validator=v.ge(1))
    """Timeout of the NCCL process groups Megatron creates."""
    nccl_backend: Literal["nccl", "gloo"] = attrs.field(default="nccl", validator=v.in_(("nccl", "gloo")))
    """Backend of ``torch.distributed`` when the backend initialises it (``nccl`` on GPUs)."""
    optimizer_checkpoint_format: Literal["dp_reshardable", "fully_reshardable"] = attrs.field(
        default="dp_reshardable", validator=v.in_(("dp_reshardable", "fully_reshardable"))
    )
    """Layout of the distributed optimizer's state in checkpoints (megatron-core's
    ``distrib_optim_sharding_type``). ``dp_reshardable``: each rank writes its own buffers, fast, and a checkpoint
    loads at the same TP / PP with any DP size. ``fully_reshardable``: the state is gathered into one canonical
    tensor per parameter, so a checkpoint loads at any TP / PP / DP; megatron-core 0.16.1 cannot load it back
    when the optimizer is torch's Adam (no apex / Transformer Engine installed; ``KeyError: 'step'``)."""

    def __attrs_post_init__(self) -> None:
        if self.sequence_parallel and self.tensor_parallel_size == 1:
            raise ValueError("actor.megatron.sequence_parallel needs tensor_parallel_size > 1")

    @property
    def model_parallel_size(self) -> int:
        """Ranks holding one copy of the model (``TP × PP``)."""
        return self.tensor_parallel_size * self.pipeline_parallel_size
