"""tests/helpers/launched.py: a launch that hangs fails its test with the stack of every process it
started, and leaves none running."""
import sys
import textwrap

import pytest
from helpers.launched import pid_alive, run_launched

RANK = """
import sys, time
def a_rank_waiting_forever():
    open(sys.argv[1], "w").write("ready")
    while True:
        time.sleep(0.05)
a_rank_waiting_forever()
"""

LAUNCHER = """
import subprocess, sys, time
rank = subprocess.Popen([sys.executable, sys.argv[1], sys.argv[2]])
open(sys.argv[3], "w").write(str(rank.pid))
def the_launcher_waiting_for_its_rank():
    rank.wait()
the_launcher_waiting_for_its_rank()
"""


def test_a_hung_launch_fails_with_every_process_stack_and_leaves_none(tmp_path):
    (tmp_path / "rank.py").write_text(textwrap.dedent(RANK))
    (tmp_path / "launcher.py").write_text(textwrap.dedent(LAUNCHER))
    cmd = [sys.executable, str(tmp_path / "launcher.py"), str(tmp_path / "rank.py"), str(tmp_path / "ready"),
           str(tmp_path / "pid")]
    with pytest.raises(pytest.fail.Exception) as failed:
        run_launched(cmd, cwd=tmp_path, env={"PATH": "/usr/bin:/bin"}, timeout=8)
    message = str(failed.value)
    assert (tmp_path / "ready").read_text() == "ready"
    assert "still ran after 8 s" in message
    assert "a_rank_waiting_forever" in message
    assert "the_launcher_waiting_for_its_rank" in message
    assert not pid_alive(int((tmp_path / "pid").read_text()))
    assert not list(tmp_path.glob("core*"))


def test_a_launch_that_ends_returns_its_output(tmp_path):
    done = run_launched([sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); "
                         "sys.exit(3)"], cwd=tmp_path, env={"PATH": "/usr/bin:/bin"}, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")
