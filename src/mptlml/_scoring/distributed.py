"""Data-parallel processes on accelerate's ``PartialState``: torchrun and accelerate launch alike.

Both launchers start one process per rank and set ``RANK``, ``LOCAL_RANK``
and ``WORLD_SIZE``; accelerate's :class:`~accelerate.PartialState` reads
them, opens the process group and gives each rank its device. The backend
follows the device: nccl and ``cuda:LOCAL_RANK`` when the rank scores on a
GPU, gloo when it scores on the CPU (no GPU, or ``--device cpu``). A single
process (no launcher) is world size 1 and opens no group.

The ragged runner (:mod:`mptlml._scoring.ragged`) uses :func:`shard` for
this process's share of the chunks (accelerate's ``split_between_processes``
over a round-robin order, so every rank gets short and long sequences alike)
and :func:`gather` to collect every rank's results on every rank.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from .._optional import require
from .._validation import check_device

__all__ = ["DistContext", "barrier", "default_device", "distributed_context", "gather",
           "launched", "resolve_device", "shard", "shutdown_distributed"]

T = TypeVar("T")


@dataclass(frozen=True)
class DistContext:
    """This process's rank, the world size, its local rank, device and backend."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    backend: str | None = None

    @property
    def main(self) -> bool:
        """Rank 0: the process that writes result files."""
        return self.rank == 0


def launched() -> bool:
    """Whether this process was started by torchrun / accelerate launch with more than one rank."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


_ONE_CPU_PROCESS = (
    "accelerate launch --cpu --num_processes N starts ONE process (accelerate's --cpu launcher "
    "runs several only through mpirun, --mpirun_hostfile), so this run would score alone "
    "(world_size 1). For N CPU processes use `accelerate launch --multi_gpu --num_processes N "
    "-m mptlml ...` (torchrun underneath; on a GPU machine add --device cpu) or `torchrun "
    "--nproc_per_node N -m mptlml ...`."
)


def _check_single_launch() -> None:
    """Refuse the launch that asks for several processes and starts one (see README)."""
    env = os.environ
    asked_several = "MASTER_ADDR" in env and env.get("ACCELERATE_USE_CPU", "").lower() == "true"
    mpi = any(k in env for k in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE"))
    if asked_several and not mpi and "WORLD_SIZE" not in env:
        raise ValueError(_ONE_CPU_PROCESS)


def distributed_context(*, cpu: bool | None = None) -> DistContext:
    """Rank, world size and device of this process (opens the process group once).

    Parameters
    ----------
    cpu : bool, optional
        Score on the CPU (gloo backend). Default: when no CUDA device exists.
        Only the first call of a process decides (``PartialState`` is shared).
    """
    if not launched():
        _check_single_launch()
        if cpu is None:
            cpu = not torch.cuda.is_available()
        return DistContext(device=torch.device("cpu" if cpu else "cuda"))
    require("accelerate", "a run on several processes (torchrun, accelerate launch)")
    from accelerate import PartialState

    if cpu is None:
        cpu = not torch.cuda.is_available()
    state = PartialState(cpu=cpu)
    return DistContext(int(state.process_index), int(state.num_processes),
                       int(state.local_process_index), torch.device(state.device), state.backend)


def default_device() -> torch.device:
    """The rank's CUDA device (``cuda:LOCAL_RANK``) when CUDA is available, else the CPU."""
    if not torch.cuda.is_available():
        return distributed_context(cpu=True).device
    if launched():
        return distributed_context(cpu=False).device
    return torch.device("cuda", torch.cuda.current_device())


def shard(items: list[T], ctx: DistContext) -> list[T]:
    """This rank's share of ``items``: round robin, through ``split_between_processes``.

    The items are interleaved (rank r's are r, r + W, r + 2W, ...) so that the
    contiguous shares of accelerate's ``split_between_processes`` (the first
    ``n mod W`` ranks get one more) are exactly the round-robin ones.
    """
    if ctx.world == 1:
        return list(items)
    require("accelerate", "a run on several processes (torchrun, accelerate launch)")
    from accelerate import PartialState

    order = [items[k] for r in range(ctx.world) for k in range(r, len(items), ctx.world)]
    with PartialState().split_between_processes(order) as part:
        return list(part)


def gather(obj: Any, ctx: DistContext) -> list[Any]:
    """``obj`` of every rank, in rank order, on every rank (accelerate's ``gather_object``)."""
    if ctx.world == 1:
        return [obj]
    require("accelerate", "a run on several processes (torchrun, accelerate launch)")
    from accelerate.utils import gather_object

    return list(gather_object([obj]))


def barrier(ctx: DistContext) -> None:
    """Wait for every rank (a no-op in a single process)."""
    if ctx.world > 1:
        require("accelerate", "a run on several processes (torchrun, accelerate launch)")
        from accelerate import PartialState

        PartialState().wait_for_everyone()


def shutdown_distributed(*, synchronise: bool = True) -> None:
    """Tear down the process group that :func:`distributed_context` opened.

    Every rank waits for the others (``synchronise``) and then destroys the
    group, so that no rank exits while gloo/nccl threads still run (which
    aborts the process with ``terminate called without an active exception``).
    A no-op outside ``torchrun``/``accelerate launch``.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    try:
        if synchronise:
            dist.barrier()
    finally:
        dist.destroy_process_group()


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    """The device a rank scores on, from the user's ``--device`` (None: :func:`default_device`).

    ``"cuda"`` means this rank's GPU (``cuda:LOCAL_RANK`` under a launcher); an
    explicit index is refused when there are several ranks (they would share
    one GPU). The first call decides the backend: nccl for CUDA, gloo for CPU.
    """
    if device is None:
        return default_device()
    d = check_device(device)  # "gpu", or CUDA without CUDA: a ValueError naming the choices
    if launched():
        if d.type == "cuda":
            if d.index is not None:
                raise ValueError(f"--device {device} names one GPU for every rank; pass "
                                 "--device cuda and each rank takes cuda:LOCAL_RANK.")
            return distributed_context(cpu=False).device
        distributed_context(cpu=True)
    return d
