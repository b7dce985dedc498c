"""fairseq_momentum/process_group_exit.py: a process that imported the user dir and ends normally
has destroyed its gloo process group by the time the interpreter tears down. After an uncaught
exception the group is left alone. The atexit probe is registered before the import, so it runs
after the user dir's handler (atexit runs last-in, first-out)."""
import subprocess
import sys
import textwrap

import pytest
from helpers.fairseq_cli import REPO

SCRIPT = textwrap.dedent("""
    import atexit, sys
    import torch.distributed as dist

    atexit.register(lambda: print("group up at exit:", dist.is_initialized(), flush=True))
    import fairseq_momentum  # noqa: F401
    import fairseq_momentum  # noqa: F401  (a second import installs nothing more)

    dist.init_process_group("gloo", init_method=sys.argv[1], rank=0, world_size=1)
    if sys.argv[2] == "raise":
        raise RuntimeError("the training failed")
""")


@pytest.mark.parametrize("end,group_up,code", [("return", False, 0), ("raise", True, 1)])
def test_a_normal_exit_destroys_the_gloo_group_and_a_failed_one_leaves_it(tmp_path, end, group_up, code):
    proc = subprocess.run([sys.executable, "-c", SCRIPT, f"file://{tmp_path / 'store'}", end],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == code, proc.stderr[-2000:]
    assert f"group up at exit: {group_up}" in proc.stdout.splitlines(), proc.stdout + proc.stderr[-2000:]
    assert ("RuntimeError: the training failed" in proc.stderr) == (end == "raise")
