"""Running a launcher (torchrun, accelerate launch, a script that starts ranks) in a test. On a hang the
test fails with every process's Python stack, not only "timed out": each process the launcher started,
and the launcher, dumps its threads (faulthandler, on SIGABRT) before the tree is killed."""
import resource
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

GRACE = 30


def _tree(pid):
    """The launcher's descendants, leaves first, then the launcher."""
    try:
        root = psutil.Process(pid)
        return root.children(recursive=True)[::-1] + [root]
    except psutil.NoSuchProcess:
        return []


def _signal(processes, sig):
    for process in processes:
        try:
            process.send_signal(sig)
        except psutil.NoSuchProcess:
            pass


def _log_tails(log_dir):
    if log_dir is None:
        return ""
    return "".join(f"\n--- {path} ---\n{path.read_text(errors='replace')[-6000:]}"
                   for path in sorted(Path(log_dir).rglob("*.log")))


def _no_core_files():
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))     # SIGABRT dumps stacks, not cores into cwd


def _dump_stacks(pid):
    """Each process of `pid`'s tree dumps its Python stacks (SIGABRT to faulthandler); the processes."""
    processes = _tree(pid)
    # stopped first, so that no process sees another die (a launcher whose rank has gone would go
    # on to exit) before its own SIGABRT is delivered
    for sig in (signal.SIGSTOP, signal.SIGABRT, signal.SIGCONT):
        _signal(processes, sig)
    return processes


def abort(pid):
    """Ends the tree of a call still running past its time (helpers/fork_server.py's on_timeout):
    its processes' stacks first, then SIGKILL to any left after GRACE s."""
    processes = _dump_stacks(pid)
    _, alive = psutil.wait_procs(processes, timeout=GRACE)
    _signal(alive, signal.SIGKILL)


def fail_timed_out(cmd, timeout, out, err, log_dir=None, pids=None):
    """Fails the test with a timed-out call's stderr (its processes' stacks), logs and stdout."""
    which = f" (pids {pids})" if pids else ""
    pytest.fail(f"{Path(cmd[0]).name} still ran after {timeout} s; the stacks of its processes{which} at "
                f"that moment:\n{err[-20000:]}{_log_tails(log_dir)}\n--- stdout ---\n{out[-3000:]}",
                pytrace=False)


def run_launched(cmd, *, cwd, env, timeout, log_dir=None):
    """subprocess.run(cmd, capture_output=True, text=True) with `timeout` seconds; a launch still running
    then fails the test with the processes' stacks (their stderr, and the *.log files under `log_dir`
    where the launcher redirects its ranks)."""
    env = dict(env, PYTHONFAULTHANDLER="1")
    with subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, preexec_fn=_no_core_files) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            processes = _dump_stacks(proc.pid)
            try:
                out, err = proc.communicate(timeout=GRACE)
            except subprocess.TimeoutExpired:
                _signal(_tree(proc.pid), signal.SIGKILL)
                out, err = proc.communicate()
            time.sleep(0.5)
            _signal([p for p in processes if p.is_running()], signal.SIGKILL)
            fail_timed_out(cmd, timeout, out, err, log_dir, [p.pid for p in processes])
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def pid_alive(pid):
    """Whether `pid` still runs (a zombie does not)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
