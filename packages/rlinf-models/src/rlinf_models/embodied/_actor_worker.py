"""``EmbodiedActorWorker``: the embodied training group (FSDP2 data parallel over the actor ranks).

The runner drives it by method name (see the rlinf-models README, "EmbodiedActorWorker"):

```python
actor = EmbodiedActorWorker.create_group(cfg.actor, cfg.algorithm, spec, total_steps=...).launch(cluster, strategy, name="actor")
actor.sync_model_to_rollout("rollout")  # ‖ rollout.sync_model_from_actor("actor")
actor.recv_rollout_batch(channel, num_messages, timeout)  # ‖ env.interact(...) ‖ rollout.generate(...)
actor.compute_advantages_and_returns().wait()[0]  # rollout/* metrics (global)
actor.run_training().wait()[0]  # actor/* and critic/* metrics (global)
actor.save_checkpoint(staging_dir)  # writes <staging_dir>/actor/
```
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from rlinf_core.config import AlgorithmConfig
from rlinf_core.protocols import EnvSpec, obs_concat, obs_map, publish_weights, send_weights
from rlinf_scheduler import Channel, Empty, Worker, timed
from torch import nn

from .._config import EmbodiedActorConfig
from .._fsdp import (
    full_model_state_dict,
    full_optimizer_state_dict,
    init_distributed,
    load_full_model_state_dict,
    load_full_optimizer_state_dict,
    load_rank_rng,
    move_training_state,
    save_checkpoint_files,
    save_rank_rng,
    select_device,
    shard_module,
)
from ..actor import resumed_schedule_total
from ..policies import (
    PRETRAINED_SUBDIR,
    build_policy,
    checkpoint_weights_file,
    export_pretrained,
    load_policy_weights,
    rollout_state_dict,
    trainable_names,
)
from ._trainer import REQUIRED_BATCH_KEYS, EmbodiedPPOTrainer, staleness_counts

__all__ = ["CHECKPOINT_SUBDIR", "EmbodiedActorWorker", "gather_trajectories", "init_from_model_path"]

CHECKPOINT_SUBDIR = "actor"
"""Directory inside a checkpoint (``global_step_<N>/actor/``) holding the actor's files."""

_ENV_OFFSET = "env_offset"
_EPOCH = "rollout_epoch"
_ADV_WITHOUT_GROUPS = ("gae",)


def _order_key(message: Mapping[str, Any]) -> tuple[int, int, str]:
    """Sort key making every actor rank (and every run) concatenate the same messages in the same order."""
    offset = message.get(_ENV_OFFSET)
    if offset is not None:
        return (int(message.get(_EPOCH, 0)), int(offset), "")
    digest = hashlib.sha1()
    for key in ("rewards", "prev_values"):
        value = message[key]
        digest.update(value.detach().cpu().contiguous().numpy().tobytes())
    return (int(message.get(_EPOCH, 0)), 0, digest.hexdigest())


def _concat_messages(messages: list[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
    """Order trajectory messages (see :func:`_order_key`) and concatenate their tensors along the env axis (dim 1)."""
    for m in messages:
        missing = [k for k in REQUIRED_BATCH_KEYS if not _is_tensors(m.get(k))]
        if missing:
            raise ValueError(f"trajectory message is missing tensors {missing}; it has {sorted(m)}")
    with_offset = [m.get(_ENV_OFFSET) is not None for m in messages]
    if any(with_offset) and not all(with_offset):
        raise ValueError(
            f"some trajectory messages carry {_ENV_OFFSET!r} and some do not; every env rank must send it "
            f"(global index of the message's first env)"
        )
    messages = sorted(messages, key=_order_key)  # stable: equal keys keep each producer's put order
    keys = [k for k, v in messages[0].items() if _is_tensors(v)]
    out: dict[str, Any] = {}
    for key in keys:
        parts = [m.get(key) for m in messages]
        if any(not _is_tensors(p) for p in parts):
            raise ValueError(f"trajectory key {key!r} is a tensor in some messages only")
        # torch.cat copies: the result never aliases the producers' shared memory.
        out[key] = obs_concat(parts, axis=1)
    return out


def _is_tensors(value: Any) -> bool:
    """A tensor, or a dict of tensors (a dict observation)."""
    if isinstance(value, Mapping):
        return bool(value) and all(_is_tensors(v) for v in value.values())
    return isinstance(value, torch.Tensor)


def gather_trajectories(
    channel: Channel, num_messages: int, *, key: Any, timeout: float, rank: int = 0
) -> dict[str, torch.Tensor]:
    """Take ``num_messages`` trajectory dicts from ``channel`` under ``key`` and concatenate them along the env axis.

    The messages are ordered the same way on every actor rank and in every run (by ``(rollout_epoch,
    env_offset)`` when they carry them, else by content; see :func:`_concat_messages`).

    Args:
        channel: the env → actor channel.
        num_messages: trajectory messages to wait for.
        key: the channel key to read.
        timeout: seconds to wait for all of them.
        rank: the reading actor rank (for the error message).

    Raises:
        ValueError: when ``num_messages < 1`` or the messages do not fit together.
        TimeoutError: when they did not all arrive within ``timeout`` (says how many came).
    """
    if num_messages < 1:
        raise ValueError(f"num_messages must be >= 1, got {num_messages}")
    deadline = time.monotonic() + timeout
    messages: list[Mapping[str, Any]] = []
    try:
        while len(messages) < num_messages:
            messages.append(channel.get(key=key, timeout=max(0.0, deadline - time.monotonic())))
    except Empty:
        raise TimeoutError(
            f"actor rank {rank} got {len(messages)} of {num_messages} trajectory messages from "
            f"channel {channel.name!r} key {key!r} within {timeout:g} s"
        ) from None
    return _concat_messages(messages)


def init_from_model_path(worker: Worker, policy: nn.Module, model_path: str | None) -> None:
    """Load ``actor.model.model_path`` into a freshly built, unsharded ``policy`` (nothing when ``None``).

    What the file lacks keeps its fresh initialisation and what the policy lacks is ignored; rank 0 logs both.

    Raises:
        FileNotFoundError, ValueError: naming ``actor.model.model_path`` (see :func:`load_policy_weights`).
    """
    if model_path is None:
        return
    loaded = load_policy_weights(
        policy, checkpoint_weights_file(model_path), field="actor.model.model_path", strict=False
    )
    if worker.rank == 0:
        worker.log_info("actor.model.model_path: initialised the policy with %s", loaded.summary())


class EmbodiedActorWorker(Worker):
    """Trains the embodied actor-critic with :class:`EmbodiedPPOTrainer`; FSDP2 over ranks when there are several.

    Every rank builds the policy from the same seed (``actor.seed``), so all start from identical weights;
    with more than one rank the policy is sharded with ``fully_shard`` (gloo on CPU, NCCL on CUDA), gradients
    are averaged across ranks, and rank ``r`` trains on envs ``[r * E / W, (r + 1) * E / W)`` of every rollout.
    The data split and the shuffle are designed so that W ranks make the same update as one rank on the same
    data (see :mod:`rlinf_models.embodied._trainer`).

    Args:
        actor: the ``actor:`` config (model, optimizer, batch sizes, seed, offload).
        algorithm: the ``algorithm:`` config.
        spec: observation/action description of the training env.
        total_steps: training steps of the run (for ``actor.optim.lr_schedule: linear``).
        comm_timeout: default seconds to wait for trajectories and for the weight-sync broadcast.
    """

    def __init__(
        self,
        actor: EmbodiedActorConfig,
        algorithm: AlgorithmConfig,
        spec: EnvSpec,
        *,
        total_steps: int | None = None,
        comm_timeout: float = 600.0,
    ) -> None:
        if actor.torch_num_threads is not None:
            torch.set_num_threads(actor.torch_num_threads)
        self.cfg = actor
        self.algorithm = algorithm
        self.spec = spec
        self.comm_timeout = comm_timeout
        self.device = select_device()
        self.distributed = self.world_size > 1
        torch.manual_seed(actor.seed)  # identical initial weights on every rank
        policy: nn.Module = build_policy(spec, actor.model).to(self.device)
        if not actor.model.is_vla:  # a VLA policy reads its model_path (a checkpoint directory) itself
            init_from_model_path(self, policy, actor.model.model_path)
        # lora_sync: adapters sends these entries only (the names survive fully_shard).
        self._sync_keys = (
            trainable_names(policy) if actor.model.is_lora and actor.model.lora_sync == "adapters" else None
        )
        if self.distributed:
            mesh = init_distributed(self.device)
            policy = shard_module(policy, mesh, cpu_offload=actor.enable_offload)
        self.policy = policy
        self.trainer = EmbodiedPPOTrainer(
            policy,
            algorithm,
            actor,
            world_size=self.world_size,
            rank=self.rank,
            total_steps=total_steps,
            reduce_sum=self._all_reduce_sum if self.distributed else None,
        )
        self._batch: dict[str, torch.Tensor] | None = None
        self._offloaded = False
        if actor.enable_offload:
            self._offload()

    # ------------------------------------------------------------------------------------------ helpers
    def _all_reduce_sum(self, x: torch.Tensor) -> torch.Tensor:
        out = x.detach().clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out

    def _offload(self) -> None:
        """One-rank CUDA runs: move weights and optimizer state to CPU between phases (FSDP2 uses CPUOffloadPolicy)."""
        if self.device.type != "cuda" or self.distributed or self._offloaded:
            return
        move_training_state([self.policy], self.trainer.optimizer, torch.device("cpu"))
        self._offloaded = True

    def _reload(self) -> None:
        if not self._offloaded:
            return
        move_training_state([self.policy], self.trainer.optimizer, self.device)
        self._offloaded = False

    def _rollout_state(self) -> dict[str, torch.Tensor]:
        """What weight sync sends (:func:`~rlinf_models.policies.rollout_state_dict`); ``{}`` on ranks > 0.

        ``lora_sync: adapters`` gathers and copies only the trainable entries.
        """
        state = full_model_state_dict(self.policy, keys=self._sync_keys)
        if not state:  # ranks > 0 under FSDP2
            return state
        return rollout_state_dict(self.cfg.model, state, trainable=self._sync_keys)

    # ---------------------------------------------------------------------------------------- the loop
    def get_model_version(self) -> int:
        """Number of completed :meth:`run_training` calls (0 = initial weights); what weight sync sends."""
        return self.trainer.train_steps

    @timed(name="actor/sync_model_to_rollout")
    def sync_model_to_rollout(
        self, rollout_group_name: str, rollout_world_size: int | None = None, *, timeout: float | None = None
    ) -> int:
        """Send the weights (the full CPU state dict; with LoRA, see ``actor.model.lora_sync``) to every rollout rank.

        The protocol of :func:`rlinf_core.protocols.send_weights`: all actor ranks call it (the FSDP2 full
        state dict is gathered collectively); actor rank 0 broadcasts a ``WeightMessage`` to
        ``[(actor, 0), (rollout, all ranks)]``; each rollout rank calls ``sync_model_from_actor(actor_group)``.

        Args:
            rollout_group_name: name of the rollout worker group.
            rollout_world_size: its number of ranks (found from the running group when ``None``).
            timeout: seconds to wait (default: ``comm_timeout``).

        Returns:
            The version sent.
        """
        self._reload()
        state = self._rollout_state()
        version = self.get_model_version()
        send_weights(
            self,
            rollout_group_name,
            state,
            version,
            rollout_world_size=rollout_world_size,
            timeout=self.comm_timeout if timeout is None else timeout,
        )
        self._offload()
        return version

    @timed(name="actor/publish_weights")
    def publish_weights(self, channel: Channel, rollout_world_size: int, timeout: float | None = None) -> int:
        """Put the weights on ``channel`` for every rollout rank (asynchronous runs); returns their version.

        All actor ranks call it (the full state dict is gathered collectively); rank 0 puts one
        ``WeightMessage`` per rollout rank (:func:`rlinf_core.protocols.publish_weights`). It does not wait for
        the rollout, which takes the newest message between two inference calls.
        """
        self._reload()
        state = self._rollout_state()
        version = self.get_model_version()
        if self.rank == 0:
            publish_weights(
                channel,
                state,
                version,
                rollout_world_size,
                timeout=self.comm_timeout if timeout is None else timeout,
            )
        self._offload()
        return version

    @timed(name="actor/compute_proximal_logprobs")
    def compute_proximal_logprobs(self) -> dict[str, float]:
        """Proximal log-probs of the received batch under the current weights (decoupled PPO, AReaL).

        Returns:
            This rank's staleness counts: ``staleness/samples``, ``staleness/sum``, ``staleness/max``,
            ``staleness/min`` and ``staleness/count_<d>`` (:func:`staleness_counts`).
        """
        batch = self._require_batch("compute_proximal_logprobs")
        self._reload()
        self.trainer.compute_proximal_logprobs(batch)
        self._offload()
        return staleness_counts(batch["versions"], self.get_model_version())

    @timed(name="actor/recv_rollout_batch")
    def recv_rollout_batch(
        self,
        channel: Channel,
        num_messages: int,
        timeout: float | None = None,
        *,
        key: Any = None,
        batch: int | None = None,
    ) -> int:
        """Take this rank's contiguous share of the envs of one rollout.

        Every actor rank gets ``num_messages`` trajectory dicts (all env ranks × rollout epochs; the env workers
        put each one under every actor rank's key) from ``channel`` under its key (default: its rank), orders
        them the same way on every rank (by ``(rollout_epoch, env_offset)`` when the messages carry them, else
        by content), concatenates them along the env axis and keeps envs ``[r * E / W, (r + 1) * E / W)``.

        Args:
            channel: the env → actor channel.
            num_messages: number of trajectory messages of this rollout for this rank.
            timeout: seconds to wait for all of them (``None``: ``comm_timeout``).
            key: channel key to read (default: this rank, an ``int``).
            batch: read ``(batch, rank)`` instead: the key the env ranks put rollout batch ``batch`` under in an
                asynchronous run (several batches may wait on the channel).

        Returns:
            Number of samples (``T * E_local``) this rank holds.

        Raises:
            ValueError: when the messages do not fit together or the envs do not split evenly.
            TimeoutError: when the messages did not all arrive within ``timeout`` (says how many came).
        """
        wait = self.comm_timeout if timeout is None else timeout
        read_key = (self.rank if batch is None else (batch, self.rank)) if key is None else key
        local = self._env_share(
            gather_trajectories(channel, num_messages, key=read_key, timeout=wait, rank=self.rank)
        )
        self._batch = obs_map(lambda v: v.to(self.device), local)
        t, e = self._batch["rewards"].shape[:2]
        return int(t * e)

    def _env_share(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        num_envs = int(batch["rewards"].shape[1])
        world = self.world_size
        if num_envs % world:
            raise ValueError(
                f"the rollout has {num_envs} envs, not divisible by the {world} actor ranks "
                f"(env.train.total_num_envs must be a multiple of the actor world size)"
            )
        share = num_envs // world
        group = self.algorithm.group_size
        if self.algorithm.adv_type not in _ADV_WITHOUT_GROUPS and share % group:
            raise ValueError(
                f"each actor rank gets {share} envs, not a multiple of algorithm.group_size={group}: "
                f"a group would be split across ranks"
            )
        if world == 1:
            return batch
        lo = self.rank * share
        # contiguous() copies the slice, so the rest of the rollout is freed.
        return obs_map(lambda v: v[:, lo : lo + share].contiguous(), batch)  # type: ignore[no-any-return]

    def _require_batch(self, method: str) -> dict[str, torch.Tensor]:
        if self._batch is None:
            raise RuntimeError(f"{method}: no rollout batch on this rank; call recv_rollout_batch first")
        return self._batch

    @timed(name="actor/compute_advantages")
    def compute_advantages_and_returns(self) -> dict[str, float]:
        """Add advantages (and returns) to the received batch; returns global ``rollout/*`` means."""
        batch = self.trainer.compute_advantages_and_returns(
            self._require_batch("compute_advantages_and_returns")
        )
        keys = {
            "rewards": "rollout/rewards",
            "advantages": "rollout/advantages",
            "returns": "rollout/returns",
        }
        present = [k for k in keys if k in batch]
        sums = torch.tensor([float(batch[k].double().sum()) for k in present], dtype=torch.float64)
        counts = torch.tensor([float(batch[k].numel()) for k in present], dtype=torch.float64)
        if self.distributed:
            sums, counts = self._all_reduce_sum(sums), self._all_reduce_sum(counts)
        return {keys[k]: float(s / c) for k, s, c in zip(present, sums, counts, strict=True)}

    @timed(name="actor/run_training")
    def run_training(self) -> dict[str, float]:
        """Run the PPO-family update on the batch (``algorithm.update_epoch`` epochs); returns global metrics."""
        batch = self._require_batch("run_training")
        if "advantages" not in batch:
            raise RuntimeError("run_training: call compute_advantages_and_returns first")
        self._reload()
        metrics = self.trainer.train(batch)
        self._batch = None
        self._offload()
        return metrics

    # ------------------------------------------------------------------------------------- checkpoints
    def save_checkpoint(self, path: str) -> None:
        """Write model, optimizer, trainer counters, shuffle generator and RNG states under ``<path>/actor/``.

        Call it on every rank (the full state dicts are gathered collectively). Rank 0 writes the full
        (unsharded) model and optimizer state, loadable at any actor world size; every rank writes its own RNG
        state. Each file is written atomically; make ``path`` a ``CheckpointManager`` staging directory for
        an atomic checkpoint as a whole. A VLA policy is also exported by rank 0 to ``<path>/pretrained/`` in its
        adapter's published layout (:func:`~rlinf_models.policies.export_pretrained`: LoRA adapters merged; from
        the gathered full state under FSDP2), so ``actor.model.model_path=<global_step_N>`` starts a new run
        from it, as from an SFT checkpoint.
        """
        self._reload()
        root = Path(path) / CHECKPOINT_SUBDIR
        model = full_model_state_dict(self.policy)
        optim = full_optimizer_state_dict(self.policy, self.trainer.optimizer)
        if self.rank == 0:
            trainer = {
                "optimizer_steps": self.trainer.optimizer_steps,
                "train_steps": self.trainer.train_steps,
                "total_steps": self.trainer.total_steps,
                "generator": self.trainer.generator.get_state(),
                "world_size": self.world_size,
            }
            save_checkpoint_files(
                root, (("model.pt", model), ("optimizer.pt", optim), ("trainer.pt", trainer))
            )
            if self.cfg.model.is_vla:
                export_pretrained(
                    self.policy, self.spec, self.cfg.model, Path(path) / PRETRAINED_SUBDIR, model
                )
        save_rank_rng(root, self.rank)
        if self.distributed:
            dist.barrier()  # every file exists when any rank returns
        self._offload()

    def _warn_once(self, msg: str) -> None:
        if self.rank == 0:
            self.log_warning("%s", msg)

    def load_checkpoint(self, path: str) -> None:
        """Restore exactly what :meth:`save_checkpoint` wrote (from ``<path>/actor/``); call it on every rank.

        Checkpoints load at any actor world size; the RNG state of a rank with no saved one is left as is.
        """
        root = Path(path) / CHECKPOINT_SUBDIR
        if not (root / "trainer.pt").is_file():
            raise FileNotFoundError(f"load_checkpoint: {root} holds no actor checkpoint (no trainer.pt)")
        self._reload()
        model = torch.load(root / "model.pt", map_location="cpu", weights_only=True)
        optim = torch.load(root / "optimizer.pt", map_location="cpu", weights_only=True)
        trainer = torch.load(root / "trainer.pt", map_location="cpu", weights_only=True)
        load_full_model_state_dict(self.policy, model)
        load_full_optimizer_state_dict(self.policy, self.trainer.optimizer, optim)
        self.trainer.optimizer_steps = int(trainer["optimizer_steps"])
        self.trainer.train_steps = int(trainer["train_steps"])
        self.trainer.total_steps = resumed_schedule_total(
            trainer.get("total_steps"),
            self.trainer.total_steps,
            reset=self.trainer.actor.optim.reset_lr_schedule_on_resume,
            warn=self._warn_once,
        )
        self.trainer.generator.set_state(trainer["generator"])
        if not load_rank_rng(root, self.rank):
            self.log_warning(
                "no RNG state for rank %d in %s (saved with a different world size)", self.rank, root
            )
        self._batch = None
        self._offload()
