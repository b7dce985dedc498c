"""The end of a distributed run that finished normally: every rank waits for the others, the process
group is destroyed, and its C++ object is released last, at exit, by Python.

`Accelerator.end_training` destroys the group (the Trainer never does, and a gloo group left to the
interpreter's teardown can abort a rank that has finished and saved: pytorch/pytorch#190489), but a
DistributedDataParallel wrapper's C++ Reducer still holds it. When the wrapper goes with the
recipe's `main`, the Reducer's release, made with the GIL held, can be the group's last: its
destructor then joins gloo's worker threads, while a worker that has just finished the final
barrier drops that barrier's earlier all-gather, whose tensors Python saw and whose release needs
the GIL. The rank hangs (two launches in forty of run_translation's two-rank test on 2 busy cores,
2026-12-06; docs/reliability.md). A Python reference to the group, held until every wrapper is gone,
makes the group's last release its Python object's, whose destructor lets go of the GIL first
(pytorch/pytorch#56297). A single process has no group, and only the accelerator's calls are made."""
import atexit
import gc

import torch.distributed as dist

_held = []


def end_process_group(accelerator) -> None:
    """`accelerator.wait_for_everyone()`, then `accelerator.end_training()`, keeping the group's
    Python object until `release_held_groups` runs at exit."""
    accelerator.wait_for_everyone()
    if dist.is_available() and dist.is_initialized():
        if not _held:
            atexit.register(release_held_groups)
        _held.append(dist.group.WORLD)
    accelerator.end_training()


def release_held_groups() -> None:
    """At exit, after `main` has returned: wrappers left in reference cycles are collected first, so
    that their Reducers let go of the group before its Python object does."""
    gc.collect()
    _held.clear()
