"""Child processes that do not outlive the recipe that started them.

A recipe killed with SIGKILL (an OOM kill, `kill -9`, a CI timeout) runs no cleanup, so a
`fairseq-preprocess` it started would go on writing into a cache folder that the next run
rebuilds. On Linux the child asks the kernel for SIGKILL when its parent dies
(`prctl(PR_SET_PDEATHSIG)`, set between fork and exec through `preexec_fn`); where prctl is
missing (macOS, Windows) children are started as before and only the normal-exit cleanup of
`run` applies.

The signal follows the thread that forked the child: `fairseq_runs.run` waits for the child in
that same thread, so the thread outlives it. Grandchildren (the `--workers` pool of
fairseq-preprocess) are not covered: the kernel offers no per-tree switch. A stray one cannot
corrupt the cache: it writes into the dead build's temporary folder, which the next build of that
artefact deletes and never renames into place (recipes/common/cache.py).
"""
import ctypes
import ctypes.util
import os
import signal
import sys
from typing import Callable, Dict, Optional

PR_SET_PDEATHSIG = 1


def _prctl() -> Optional[Callable]:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl
    except (OSError, AttributeError):
        return None


def die_with_parent_hook() -> Optional[Callable[[], None]]:
    """A `preexec_fn` that makes the child receive SIGKILL when this process dies, or None where
    the platform has no such switch."""
    prctl = _prctl()
    if prctl is None:
        return None
    parent = os.getpid()

    def die_with_parent() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        # The parent may have died between fork and prctl: then nothing would signal us.
        if os.getppid() != parent:
            os._exit(1)

    return die_with_parent


def popen_kwargs() -> Dict[str, object]:
    """Keyword arguments for subprocess.Popen / run that tie the child's life to this process."""
    hook = die_with_parent_hook()
    return {"preexec_fn": hook} if hook is not None else {}
