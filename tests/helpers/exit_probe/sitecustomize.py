"""Started first on PYTHONPATH, every Python process of a launch reports at exit whether its
torch.distributed process group is still up: "process group up at exit: True|False". The hook is
registered before anything else, so it runs after every other atexit handler (last in, first out)."""
import atexit
import os
import sys


def _report() -> None:
    dist = sys.modules.get("torch.distributed")
    up = dist is not None and dist.is_available() and dist.is_initialized()
    # one write of the whole line: the ranks share the launcher's stdout, and print's separate write
    # of the newline let two ranks' lines run together
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), f"process group up at exit: {up}\n".encode())


atexit.register(_report)
