"""Started first on PYTHONPATH, every Python process of a launch reports at exit whether its
torch.distributed process group is still up: "process group up at exit: True|False". The hook is
registered before anything else, so it runs after every other atexit handler (last in, first out)."""
import atexit
import sys


def _report() -> None:
    dist = sys.modules.get("torch.distributed")
    up = dist is not None and dist.is_available() and dist.is_initialized()
    print(f"process group up at exit: {up}", flush=True)


atexit.register(_report)
