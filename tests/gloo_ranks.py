"""Runs a test's per-rank work in `world` spawned processes joined by one gloo process group.

A rank that returns normally waits at a barrier, destroys the group and leaves with `os._exit(0)`:
at interpreter finalization gloo's C++ threads and objects can abort the process (SIGABRT,
"terminate called without an active exception"; see pytorch PR #179291) after the rank has
already written its results, which `mp.spawn` would report as a failed test."""
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from ports import free_port


def _rank(rank, work, world, port, args):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    torch.set_num_threads(1)
    try:
        work(rank, world, *args)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def spawn_gloo(work, world, *args):
    """Calls `work(rank, world, *args)` on each of `world` gloo ranks (`work` must be a module-level
    function, so that it pickles); an exception on a rank fails the call with its traceback."""
    mp.spawn(_rank, args=(work, world, free_port(), args), nprocs=world)
