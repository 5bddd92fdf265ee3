"""``OffPolicyActorWorker``: the off-policy actor group: replay buffer in, SAC-family updates out (FSDP2 over ranks).

The runner drives it through the ``OffPolicyActor`` role::

    actor.sync_model_to_rollout("rollout")           # ‖ rollout.sync_model_from_actor("actor")
    actor.recv_rollout_batch(channel, n, timeout)    # ‖ env.interact(...) ‖ rollout.generate(...): into the buffer
    actor.run_training()                             # the step's gradient steps (UTD) on replay batches
    actor.save_checkpoint(staging_dir)               # writes <staging_dir>/actor/

Asynchronous runs (``runner.mode: async``) read rollout batch ``b`` with ``recv_rollout_batch(..., batch=b)``,
ask ``received_staleness()`` for the versions it carried, and ``publish_weights(channel, ...)`` after the
update instead of the broadcast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from rlinf_core.config import AlgorithmConfig
from rlinf_core.protocols import EnvSpec, publish_weights, send_weights
from rlinf_scheduler import Channel, Worker, timed

from .._config import EmbodiedActorConfig
from .._fsdp import (
    full_model_state_dict,
    init_distributed,
    load_full_model_state_dict,
    load_rank_rng,
    save_checkpoint_files,
    save_rank_rng,
    select_device,
    shard_module,
)
from ..embodied import gather_trajectories, init_from_model_path, staleness_counts
from ..policies import SquashedGaussianPolicy, build_offpolicy_policy
from ._dagger import DAggerTrainer
from ._trainer import SACTrainer

__all__ = ["CHECKPOINT_SUBDIR", "OffPolicyActorWorker"]

CHECKPOINT_SUBDIR = "actor"
"""Directory inside a checkpoint (``global_step_<N>/actor/``) holding the actor's files."""


class OffPolicyActorWorker(Worker):
    """Hosts a :class:`SACTrainer` (or, for DAgger, a :class:`DAggerTrainer`): trajectories from the env channel go into its replay buffer; updates sample it.

    With more than one rank the policy and critics are sharded with FSDP2 (``fully_shard``, gloo on the CPU,
    NCCL on GPUs) and the ranks split each gradient step's batch (see :class:`SACTrainer`): every rank receives
    every transition (the env puts each trajectory under every actor rank's key), so the replay buffers stay
    identical. Off-policy updates are many small sequential steps, so this pays off for large (e.g. image)
    networks; the small MLPs of the state-based configs train fastest on one rank.

    Args:
        actor: the ``actor:`` config (``model`` with ``add_q_head``, optimizer, batch size, seed).
        algorithm: the ``algorithm:`` config (``loss_type: embodied_sac`` and its off-policy fields).
        spec: observation/action description of the training env.
        comm_timeout: default seconds to wait for trajectories and for the weight-sync broadcast.

    Raises:
        ValueError: with several ranks, when ``actor.global_batch_size`` does not split over them or the
            critics are CrossQ's.
    """

    def __init__(
        self,
        actor: EmbodiedActorConfig,
        algorithm: AlgorithmConfig,
        spec: EnvSpec,
        *,
        comm_timeout: float = 600.0,
    ) -> None:
        if actor.torch_num_threads is not None:
            torch.set_num_threads(actor.torch_num_threads)
        self.cfg = actor
        self.comm_timeout = comm_timeout
        self.device = select_device()
        torch.manual_seed(actor.seed)  # identical weights and noise on every rank
        self.policy = build_offpolicy_policy(spec, actor.model).to(self.device)
        # Before the trainer is built: its target networks and optimizers start from these weights.
        init_from_model_path(self, self.policy, actor.model.model_path)
        shard = None
        if self.world_size > 1:
            mesh = init_distributed(self.device)

            def shard(module: torch.nn.Module) -> torch.nn.Module:
                return shard_module(module, mesh)

            shard(self.policy)
        self.trainer: SACTrainer | DAggerTrainer
        if algorithm.loss_type == "embodied_dagger":
            if self.world_size > 1:
                raise ValueError(
                    "algorithm.loss_type embodied_dagger runs on one actor rank; place the actor on one slot"
                )
            if not isinstance(self.policy, SquashedGaussianPolicy):
                raise ValueError(
                    "algorithm.loss_type embodied_dagger trains the tanh-Gaussian policy: set actor.model.model_type "
                    "'mlp' or 'cnn', not 'flow'"
                )
            self.trainer = DAggerTrainer(self.policy, spec, actor, algorithm, device=self.device)
        else:
            self.trainer = SACTrainer(
                self.policy,
                spec,
                actor,
                algorithm,
                device=self.device,
                rank=self.rank,
                world_size=self.world_size,
                shard=shard,
            )
        self._received = 0
        self._versions: torch.Tensor | None = None

    def get_model_version(self) -> int:
        """Completed :meth:`run_training` calls (0 = initial weights); what weight sync sends."""
        return self.trainer.train_steps

    def _rollout_state(self) -> dict[str, torch.Tensor]:
        """The policy's full CPU state (collective under FSDP2: every rank calls it; rank 0's is complete)."""
        return full_model_state_dict(self.policy)

    @timed(name="actor/sync_model_to_rollout")
    def sync_model_to_rollout(
        self, rollout_group_name: str, rollout_world_size: int | None = None, *, timeout: float | None = None
    ) -> int:
        """Send the policy's weights to every rollout rank (:func:`rlinf_core.protocols.send_weights`).

        Returns:
            The version sent.
        """
        version = self.get_model_version()
        send_weights(
            self,
            rollout_group_name,
            self._rollout_state(),
            version,
            rollout_world_size=rollout_world_size,
            timeout=self.comm_timeout if timeout is None else timeout,
        )
        return version

    @timed(name="actor/publish_weights")
    def publish_weights(self, channel: Channel, rollout_world_size: int, timeout: float | None = None) -> int:
        """Put the policy's weights on ``channel`` for every rollout rank (asynchronous runs); returns their version.

        One ``WeightMessage`` per rollout rank (:func:`rlinf_core.protocols.publish_weights`); it does not wait for
        the rollout, which takes the newest message between two inference calls.
        """
        version = self.get_model_version()
        state = self._rollout_state()
        if self.rank == 0:
            publish_weights(
                channel,
                state,
                version,
                rollout_world_size,
                timeout=self.comm_timeout if timeout is None else timeout,
            )
        return version

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
        """Take one rollout's ``num_messages`` trajectories from ``channel`` into the replay buffer.

        Args:
            channel: the env → actor channel.
            num_messages: trajectory messages of this rollout (env ranks x rollout epochs).
            timeout: seconds to wait for all of them (``None``: ``comm_timeout``).
            key: channel key to read (default: this rank).
            batch: read ``(batch, rank)`` instead: the key of rollout batch ``batch`` in an asynchronous run.

        Returns:
            The transitions added (``T x E`` chunked steps).

        Raises:
            TimeoutError: when the messages did not all arrive within ``timeout`` (default ``comm_timeout``).
        """
        wait = self.comm_timeout if timeout is None else timeout
        read_key = (self.rank if batch is None else (batch, self.rank)) if key is None else key
        traj = gather_trajectories(channel, num_messages, key=read_key, timeout=wait, rank=self.rank)
        self._received = self.trainer.add_trajectory(traj)
        self._versions = traj.get("versions")
        return self._received

    def received_staleness(self) -> dict[str, float]:
        """Staleness counts of the last received rollout: its versions against the current one.

        Returns:
            ``staleness/samples``, ``staleness/sum``, ``staleness/max``, ``staleness/min`` and
            ``staleness/count_<d>`` (``rlinf_models.embodied.staleness_counts``); ``staleness/samples`` 0 when
            nothing was received since the last checkpoint load.
        """
        if self._versions is None:
            return {"staleness/samples": 0.0}
        return staleness_counts(self._versions, self.get_model_version())

    @timed(name="actor/run_training")
    def run_training(self) -> dict[str, float]:
        """The training step's gradient steps (``utd_ratio`` x transitions received, or ``update_epoch``)."""
        return self.trainer.update(self.trainer.updates_for(self._received))

    # ------------------------------------------------------------------------------------- checkpoints
    def save_checkpoint(self, path: str) -> None:
        """Write policy, critics and targets, optimizers, temperature, buffers and RNGs under ``<path>/actor/``.

        Files: ``model.pt`` (the policy, as the rollout loads it), ``critic.pt`` (critics, target critics, the
        temperature parameter), ``optimizer.pt``, ``trainer.pt`` (step counters, the replay buffer's contents
        and generator, the demo buffer's generator), ``rng_rank0.pkl``; each written atomically.
        """
        root = Path(path) / CHECKPOINT_SUBDIR
        # collective under FSDP2: every rank gathers, rank 0 writes (the buffers are the same on every rank)
        files = [("model.pt", full_model_state_dict(self.policy)), *self.trainer.checkpoint_files()]
        if self.rank == 0:
            save_checkpoint_files(root, files)
        save_rank_rng(root, self.rank)
        if self.world_size > 1:
            dist.barrier()  # every rank returns once the files are complete

    def load_checkpoint(self, path: str) -> None:
        """Restore exactly what :meth:`save_checkpoint` wrote (from ``<path>/actor/``).

        Raises:
            FileNotFoundError: when ``path`` holds no off-policy actor checkpoint.
        """
        root = Path(path) / CHECKPOINT_SUBDIR
        if not (root / "trainer.pt").is_file():
            raise FileNotFoundError(
                f"load_checkpoint: {root} holds no off-policy actor checkpoint (no trainer.pt)"
            )

        def load(name: str) -> Any:
            # The buffers (trainer.pt) stay on the CPU; the networks' states go to the device.
            where = "cpu" if name == "trainer.pt" else self.device
            return torch.load(root / name, map_location=where, weights_only=True)

        load_full_model_state_dict(self.policy, load("model.pt"))
        self.trainer.load_checkpoint_files(load)
        if not load_rank_rng(root, self.rank):
            self.log_warning("no RNG state for rank %d in %s", self.rank, root)
        self._received = 0
        self._versions = None
