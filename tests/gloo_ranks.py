"""Runs a test's per-rank work in `world` spawned processes joined by one gloo process group.

A rank that returns normally waits at a barrier, destroys the group and leaves with `os._exit(0)`:
at interpreter finalization gloo's C++ threads and objects can abort the process (SIGABRT,
"terminate called without an active exception"; see pytorch PR #179291) after the rank has
already written its results, which `mp.spawn` would report as a failed test.

The ranks start from multiprocessing's fork server, which imports torch, transformers and the
calling test's module once per pytest worker, instead of each rank starting a fresh interpreter that
imports them again (5-8 s per rank; the FSDP encoder-decoder file took 41 s that way and 17 s this
way). Each rank gets the environment of the call, not that of the server's start."""
import multiprocessing
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from ports import free_port

PRELOAD = ["torch", "torch.distributed", "torch.distributed.fsdp", "transformers"]


def _rank(rank, work, world, port, environ, args):
    os.environ.clear()
    os.environ.update(environ)
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
    # read when the server starts, on the first call in this process: later modules import in the rank
    multiprocessing.set_forkserver_preload([*PRELOAD, __name__, work.__module__])
    mp.start_processes(_rank, args=(work, world, free_port(), dict(os.environ), args), nprocs=world,
                       start_method="forkserver")
