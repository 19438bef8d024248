"""Data-parallel training over torchrun's processes: `torchrun --nproc_per_node N train_grpo.py ...`
(and `rewrite.py train`) split each optimizer step's work over N ranks and step identically on every
one.

What a script does with it (one process, with no WORLD_SIZE in the environment, is the default:
every helper below then returns at once what one process has, and no process group exists):

* `init()` joins the process group torchrun describes in the environment (RANK, WORLD_SIZE,
  LOCAL_RANK, MASTER_ADDR, MASTER_PORT): NCCL for CUDA tensors and gloo for CPU ones
  ("cpu:gloo,cuda:nccl" on a GPU machine, gloo alone without CUDA), each rank on the GPU LOCAL_RANK,
  so `--device cuda` means its own. Ranks other than 0 print nothing (their stdout goes to
  /dev/null; stderr stays, errors show).
* `share(items)`: this rank's contiguous slice of a step's work (instances, records), with the
  places of its items in the whole list; ranks in order hold the list in order, so gathering
  restores it.
* `all_reduce_grads(model)`: after the backward passes, each trainable parameter's gradient becomes
  the sum over the ranks (a gradient no rank computed stays None, as in one process). The scripts
  weight each micro-batch by its share of the step's totals over ALL ranks (`sum_over_ranks`), so
  the summed gradient is the one-process gradient, up to the order of float additions; clipping and
  the optimizer then act on equal gradients and equal weights, so every rank's model stays the same
  without broadcasting it.
* `sum_over_ranks`, `max_over_ranks`, `gather` (every rank's object, in rank order), `barrier`: the
  step's global figures for metrics; `is_main()`: rank 0, the one that writes the run folder and
  prints.
* `main_first()`: rank 0 runs the block before the others (a --resume that finishes an interrupted
  save).
* `shared_client(open_client, url, ...)`: every rank's client of the one task model: --task-url's,
  or the embedded server that rank 0 alone starts (its URL, key and model name sent to the others).

Why an explicit all-reduce and not DistributedDataParallel: DDP reduces inside every backward pass
and needs the same number of them on every rank, called through the wrapped module's forward. Here a
rank runs as many micro-batches as its candidates need (none when all its advantages are 0), and the
shared-prefix update calls the model's layers directly. One all-reduce of the accumulated gradients
per optimizer step is exact whatever each rank ran; what it gives up is DDP's overlap of
communication with the backward pass, small beside a Skill-R1 step (minutes of sampling and
task-model calls).

This module imports nothing from minskill (the lowest layer), so any script or trainer can use it.
"""
from __future__ import annotations

import contextlib
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

# ranks wait for each other at every collective: for the slowest rank's evolutions, and for rank 0's
# checkpoint saves and held-out probes, which can take many minutes on a large editor; torch's
# default (10 min) is too short
TIMEOUT = timedelta(minutes=int(os.environ.get("MINSKILL_DIST_TIMEOUT_MINUTES", "120")))
BUCKET_ELEMENTS = 1 << 25   # gradients all-reduced in flat buckets of about this many elements (128
                            # MB in float32)


def init() -> None:
    """Join torchrun's process group when the environment names one of more than one process; else
    nothing."""
    world_size = requested()
    if world_size <= 1 or dist.is_initialized():
        return
    missing = [k for k in ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
               if k not in os.environ]
    if missing:
        raise DistributedSetupError(f"WORLD_SIZE={world_size} but {', '.join(missing)} not set: "
                 "start the script with torchrun (torchrun --nproc_per_node N SCRIPT ...), which "
                 "sets them")
    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        if local_rank >= torch.cuda.device_count():
            raise DistributedSetupError(f"local rank {local_rank} but only "
                     f"{torch.cuda.device_count()} GPUs are visible: start at most that many "
                     "processes per node (--nproc_per_node), or set CUDA_VISIBLE_DEVICES")
        torch.cuda.set_device(local_rank)
    dist.init_process_group("cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo",
                            timeout=TIMEOUT)
    if dist.get_rank() > 0:   # one progress line per step, not N
        sys.stdout = open(os.devnull, "w")


def close() -> None:
    """Leave the process group (the end of a script; nothing in one process)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def share(items: list) -> tuple[list, range]:
    """(this rank's items, their places in `items`): rank r of W holds items[r·n/W : (r+1)·n/W], so
    the shares in rank order are `items` in order; with more ranks than items some shares are
    empty."""
    n, r, w = len(items), rank(), world()
    places = range(r * n // w, (r + 1) * n // w)
    return [items[j] for j in places], places


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def world() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def is_main() -> bool:
    """Rank 0 (or the one process): it alone writes the run folder and prints."""
    return rank() == 0


def sum_over_ranks(*values):
    """The sums over the ranks of these numbers (ints stay ints: float64 is exact up to 2**53); one
    value: that value, several: a tuple. In one process: the values."""
    out = _reduce_numbers(values, dist.ReduceOp.SUM if world() > 1 else None)
    return out[0] if len(values) == 1 else tuple(out)


def max_over_ranks(*values):
    out = _reduce_numbers(values, dist.ReduceOp.MAX if world() > 1 else None)
    return out[0] if len(values) == 1 else tuple(out)


def _reduce_numbers(values, op):
    if world() == 1:
        return values
    # a CPU tensor: gloo carries it
    summed = torch.tensor([float(v) for v in values], dtype=torch.float64)
    dist.all_reduce(summed, op=op)
    return [int(s) if isinstance(v, int) else float(s) for v, s in zip(values, summed.tolist())]


def gather(obj) -> list:
    """Every rank's `obj` (picklable), in rank order, on every rank; [obj] in one process."""
    if world() == 1:
        return [obj]
    out = [None] * world()
    dist.all_gather_object(out, obj)
    return out


def broadcast(obj):
    """Rank 0's `obj` on every rank."""
    if world() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def all_reduce_grads(model: torch.nn.Module) -> None:
    """Sum each trainable parameter's .grad over the ranks, in place. Every rank reduces the same
    parameters in the same order (a rank that computed no gradient for one adds zeros); a parameter
    that no rank has a gradient for keeps grad None, so clipping and AdamW skip it exactly as one
    process would."""
    if world() == 1:
        return
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        return
    had = torch.tensor([p.grad is not None for p in params], dtype=torch.float32,
                       device=params[0].device)
    dist.all_reduce(had)
    params = [p for p, h in zip(params, had.tolist()) if h > 0]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    bucket: list[torch.Tensor] = []
    size = 0   # one all-reduce per bucket of grads of one dtype and device, not one per tensor
    for i, p in enumerate(params):
        bucket.append(p.grad)
        size += p.grad.numel()
        following = params[i + 1].grad if i + 1 < len(params) else None
        if following is None or size >= BUCKET_ELEMENTS or (following.dtype, following.device) != \
                (p.grad.dtype, p.grad.device):
            flat = torch.cat([g.reshape(-1) for g in bucket])
            dist.all_reduce(flat)
            for g, piece in zip(bucket, flat.split([g.numel() for g in bucket])):
                g.copy_(piece.view_as(g))
            bucket, size = [], 0


@contextlib.contextmanager
def main_first():
    """Rank 0 runs the block, then the other ranks do (e.g. reading a checkpoint that rank 0 may
    first repair)."""
    if not is_main():
        barrier()
    yield
    if is_main():
        barrier()


def barrier() -> None:
    if world() > 1:
        dist.barrier()


@contextlib.contextmanager
def shared_client(open_client, url=None, **kwargs):
    """`open_client(url=url, **kwargs)` (serve.embedded.embedded_client: a client of `url`, or of a
    local server it starts) on every rank, for one task model: with a URL every rank opens its own
    client of it; without, rank 0 starts the embedded server and the others connect to it (one copy
    of the task model, serving every rank's requests), which stays up until every rank has left the
    block."""
    if world() == 1 or url is not None:
        with open_client(url=url, **kwargs) as client:
            yield client
        return
    if int(os.environ.get("LOCAL_WORLD_SIZE", world())) != world():
        raise DistributedSetupError("the embedded task-model server listens on rank 0's loopback "
                 "address, which ranks on other nodes cannot reach: serve the task model (e.g. "
                 "vLLM) and pass --task-url")
    if is_main():
        with open_client(url=None, **kwargs) as client:
            broadcast((client.base_url, client.api_key, client.model))
            yield client
            barrier()   # the others are done with the server: it may stop
    else:
        base_url, api_key, model = broadcast(None)
        with open_client(url=base_url, **{**kwargs, "api_key": api_key, "model": model}) as client:
            yield client
        barrier()


def requested() -> int:
    """The number of processes torchrun started (WORLD_SIZE; 1 without torchrun), before or without
    `init`."""
    return int(os.environ.get("WORLD_SIZE", "1"))


class DistributedSetupError(SystemExit):
    """torchrun's environment cannot run this script (a missing variable, more ranks than GPUs,
    several nodes without --task-url). A SystemExit like runs.RunFolderError: uncaught, it prints
    the message and exits 1."""
