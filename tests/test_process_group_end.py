"""recipes/common/process_group.py: a distributed run's end waits for every rank, destroys the process
group, and keeps the group's Python object until exit, where its release (after a collection) is what
joins gloo's worker threads: a DDP wrapper's Reducer released with `main` can then no longer be the
group's last holder, whose destructor joined those threads with the GIL held while one of them
needed it to drop a finished all-gather's tensors (two hangs in forty two-rank launches,
docs/reliability.md). A single process only makes the accelerator's two calls."""
import subprocess
import sys
from pathlib import Path

from ports import free_port

REPO = Path(__file__).resolve().parents[1]

SCRIPT = """
import atexit, os, sys
import torch, torch.distributed as dist
from recipes.common import process_group

def worker_threads():
    names = (open(f"/proc/self/task/{task}/comm").read().strip() for task in os.listdir("/proc/self/task"))
    return sum(name == "pt_gloo_runloop" for name in names)

calls = []
class Accelerator:
    def wait_for_everyone(self):
        calls.append(("wait", dist.is_initialized()))
        if dist.is_initialized():
            dist.barrier()
    def end_training(self):
        calls.append(("end", len(process_group._held)))
        if dist.is_initialized():
            dist.destroy_process_group()

process_group.end_process_group(Accelerator())
print("alone:", calls, len(process_group._held))
atexit.register(lambda: print("after the release:", len(process_group._held), worker_threads(), flush=True))
dist.init_process_group("gloo", rank=0, world_size=1, init_method="tcp://127.0.0.1:%d")
gathered = [torch.zeros(3)]
dist.all_gather(gathered, torch.ones(3))
world, calls = dist.group.WORLD, []
process_group.end_process_group(Accelerator())
print("grouped:", calls, process_group._held == [world], dist.is_initialized())
del world
atexit.register(lambda: print("before the release:", len(process_group._held), worker_threads(), flush=True))
"""


def test_the_group_is_destroyed_then_released_at_exit(tmp_path):
    proc = subprocess.run([sys.executable, "-c", SCRIPT % free_port()], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = dict(line.split(": ", 1) for line in proc.stdout.splitlines() if ": " in line)
    assert lines["alone"] == "[('wait', False), ('end', 0)] 0"          # no group: nothing held
    # the barrier before the end, the group held before it is destroyed, no group left up after
    assert lines["grouped"] == "[('wait', True), ('end', 1)] True False"
    held, threads = map(int, lines["before the release"].split())
    assert held == 1 and threads > 0, lines               # destroyed, yet its worker threads run
    assert lines["after the release"] == "0 0", lines      # released at exit: the threads are joined
