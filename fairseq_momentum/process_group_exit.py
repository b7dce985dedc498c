"""A rank that finished training ends its gloo process group before the interpreter tears down.

fairseq's training never calls torch.distributed.destroy_process_group. Without that call, the
gloo group's C++ threads outlive the interpreter, and a rank that has finished can die at exit:
"terminate called without an active exception", SIGABRT (pytorch/pytorch#190489). torchrun then
reports the whole launch as failed. recipes/launch_cpu_ddp.sh runs its ranks over gloo. Two ranks
that all-reduce and exit (torchrun, 2026-12-03) aborted 8 times in 12 launches on torch 2.13 and
4 in 12 on 2.11; with the group destroyed first, 0 in 12.

At exit, after a normal end, the group is destroyed. For gloo that is local to the rank: no peer
is waited for. After an uncaught exception nothing is done. A failed rank may still have work
queued on a peer that will never answer, and ending the group would wait for it. Other backends
(NCCL) are left to the launcher: their teardown can need every rank."""
import atexit
import sys

import torch.distributed as dist

_uncaught = []


def _noting_uncaught(hook):
    def excepthook(kind, value, traceback):
        _uncaught.append(kind)
        hook(kind, value, traceback)

    excepthook.notes_uncaught = True
    return excepthook


def end_gloo_group_after_a_normal_exit() -> None:
    if _uncaught or not dist.is_available() or not dist.is_initialized():
        return
    if dist.get_backend() == "gloo":
        dist.destroy_process_group()


def install() -> None:
    """Once per process (importing the user dir twice installs nothing more)."""
    if getattr(sys.excepthook, "notes_uncaught", False):
        return
    sys.excepthook = _noting_uncaught(sys.excepthook)
    atexit.register(end_gloo_group_after_a_normal_exit)
