"""The recipe cache under concurrency, kills and corruption (recipes/common/cache.py): one build per
artefact however many processes ask for it, nothing half-built ever in place, a SIGKILL mid-build
leaves nothing the next run trips on and no orphaned child, and a changed output is rebuilt with
its name in the log. Builds here are tiny: every wait is on an event (a file appearing, a line
printed), never on a duration."""
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from recipes.common import cache

REPO = Path(__file__).resolve().parents[1]
PARAMS = {"artefact": "test", "size": 2}
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc and prctl (Linux)")

# A builder process: build_once of PARAMS whose build appends its pid to COUNTER when it starts,
# writes one output, then (when asked) waits for HOLD to exist, directly or inside a child started
# through fairseq_runs.run (the way builders start fairseq-preprocess) that writes its pid to CHILD.
BUILDER = """
import os, sys, time
from pathlib import Path
from recipes.common import cache
from recipes.common.fairseq_runs import run
parent, counter, hold, child = (Path(a) if a != "-" else None for a in sys.argv[1:5])
WAIT = "import os, sys, time, pathlib; pathlib.Path(sys.argv[1]).write_text(str(os.getpid()))\\n" \\
       "while not pathlib.Path(sys.argv[2]).exists(): time.sleep(0.02)"

def build(folder):
    with open(counter, "a") as f:
        f.write(f"{os.getpid()}\\n")
    (folder / "first.txt").write_text("first output\\n")
    if child is not None:
        run([sys.executable, "-c", WAIT, str(child), str(hold)])
    while hold is not None and not hold.exists():
        time.sleep(0.02)
    (folder / "nested").mkdir()
    (folder / "nested" / "second.txt").write_text("second output\\n")

folder = cache.build_once(parent, "artefact", PARAMS, build, log=lambda m: print(m, flush=True))
print("RESULT", folder, flush=True)
"""


@pytest.fixture
def spawn(tmp_path):
    """Start builder processes; any still running when the test ends (a failed test) is killed."""
    started = []

    def builder(hold=None, child=None):
        script = "PARAMS = " + repr(PARAMS) + "\n" + textwrap.dedent(BUILDER)
        args = [tmp_path / "cache", tmp_path / "builds", hold or "-", child or "-"]
        started.append(subprocess.Popen([sys.executable, "-c", script, *map(str, args)], cwd=REPO, text=True,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        env=dict(os.environ, PYTHONPATH=str(REPO))))
        return started[-1]

    yield builder
    for process in started:
        if process.poll() is None:
            process.kill()
            process.wait()


def wait_until(condition, what, process=None):
    """Poll an event. The bound on polls only keeps a broken run from hanging the suite."""
    for _ in range(6000):
        if condition():
            return
        if process is not None and process.poll() is not None:
            raise AssertionError(f"{what}: the process exited first:\n{process.stdout.read()}")
        time.sleep(0.02)
    raise AssertionError(f"gave up waiting: {what}")


def builds(tmp_path):
    path = tmp_path / "builds"
    return path.read_text().split() if path.exists() else []


def finished(process):
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output
    result = next(line for line in output.splitlines() if line.startswith("RESULT"))
    return Path(result.split(" ", 1)[1]), output


def assert_valid(folder):
    assert cache.is_complete(folder, PARAMS)
    assert (folder / "first.txt").read_text() == "first output\n"
    assert (folder / "nested" / "second.txt").read_text() == "second output\n"


def temporaries(tmp_path):
    return sorted(p.name for p in (tmp_path / "cache").glob(".artefact-*") if p.is_dir())


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper counts as dead: it runs no code)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_two_processes_build_once_and_share_the_result(tmp_path, spawn):
    hold = tmp_path / "hold"
    first = spawn(hold=hold)
    wait_until(lambda: len(builds(tmp_path)) == 1, "the first build to start", first)
    second = spawn()
    line = second.stdout.readline()
    assert line.startswith("waiting for another process building"), line
    assert not list((tmp_path / "cache").glob("artefact-*")), "a half-built artefact is in place"
    hold.touch()
    (folder_a, _), (folder_b, output_b) = finished(first), finished(second)
    assert len(builds(tmp_path)) == 1, builds(tmp_path)
    assert folder_a == folder_b and "reusing" in output_b
    assert_valid(folder_a)
    assert temporaries(tmp_path) == []


@linux_only
def test_sigkill_mid_build_kills_the_child_and_the_next_build_succeeds(tmp_path, spawn):
    child_file = tmp_path / "child.pid"
    killed = spawn(hold=tmp_path / "never", child=child_file)
    wait_until(lambda: child_file.exists() and child_file.read_text(), "the build's child to start", killed)
    child = int(child_file.read_text())
    os.kill(killed.pid, signal.SIGKILL)
    killed.wait()
    try:
        wait_until(lambda: not alive(child), "the orphaned child to die")
    finally:
        if alive(child):
            os.kill(child, signal.SIGKILL)
    assert len(temporaries(tmp_path)) == 1 and not list((tmp_path / "cache").glob("artefact-*"))

    folder, _ = finished(spawn())
    assert len(builds(tmp_path)) == 2
    assert_valid(folder)
    assert temporaries(tmp_path) == []


@linux_only
def test_without_the_hook_a_killed_parents_child_lives_on(tmp_path):
    """The control of the test above: a plain Popen child outlives its SIGKILLed parent, so that
    test would see an orphan if run() did not tie its children to the recipe."""
    child_file = tmp_path / "child.pid"
    script = ("import subprocess, sys; subprocess.Popen([sys.executable, '-c', "
              "'import os, sys, time, pathlib; pathlib.Path(sys.argv[1]).write_text(str(os.getpid())); "
              "time.sleep(3600)', sys.argv[1]]).wait()")
    parent = subprocess.Popen([sys.executable, "-c", script, str(child_file)])
    wait_until(lambda: child_file.exists() and child_file.read_text(), "the child to start", parent)
    child = int(child_file.read_text())
    try:
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        assert alive(child)
    finally:
        os.kill(child, signal.SIGKILL)


def counting_build(calls):
    def build(folder):
        calls.append(folder)
        (folder / "data.bin").write_bytes(b"\x00\x01" * 64)
        (folder / "sub").mkdir()
        (folder / "sub" / "dict.txt").write_text("a 1\nb 1\n")
    return build


@pytest.mark.parametrize("damage, name, problem", [
    (lambda f: (f / "sub" / "dict.txt").write_text("a 1\nc 1\n"), "sub/dict.txt", "has sha256"),
    (lambda f: (f / "data.bin").write_bytes(b"\x00\x01" * 32), "data.bin", "has sha256"),
    (lambda f: (f / "data.bin").unlink(), "data.bin", "is missing"),
], ids=["edited", "truncated", "deleted"])
def test_a_changed_output_is_named_and_rebuilt(tmp_path, damage, name, problem):
    calls, messages = [], []
    build = counting_build(calls)
    folder = cache.build_once(tmp_path, "art", PARAMS, build, log=messages.append)
    assert cache.build_once(tmp_path, "art", PARAMS, build, log=messages.append) == folder
    assert len(calls) == 1 and "reusing" in messages[-1]
    damage(folder)
    assert not cache.is_complete(folder, PARAMS)
    assert cache.build_once(tmp_path, "art", PARAMS, build, log=messages.append) == folder
    assert len(calls) == 2
    assert any(f"rebuilding {folder}: {folder / name} {problem}" in m for m in messages), messages
    assert (folder / "sub" / "dict.txt").read_text() == "a 1\nb 1\n" and cache.is_complete(folder, PARAMS)


def test_a_failed_build_leaves_nothing_and_the_next_one_builds(tmp_path):
    def failing(folder):
        (folder / "data.bin").write_bytes(b"partial")
        raise RuntimeError("preprocessing failed")

    with pytest.raises(RuntimeError, match="preprocessing failed"):
        cache.build_once(tmp_path, "art", PARAMS, failing, log=lambda m: None)
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == []
    calls = []
    folder = cache.build_once(tmp_path, "art", PARAMS, counting_build(calls), log=lambda m: None)
    assert len(calls) == 1 and cache.is_complete(folder, PARAMS)


def test_the_built_folder_has_ordinary_permissions(tmp_path):
    folder = cache.build_once(tmp_path, "art", PARAMS, counting_build([]), log=lambda m: None)
    (tmp_path / "plain").mkdir()
    assert folder.stat().st_mode == (tmp_path / "plain").stat().st_mode
