"""fairseq's console scripts, each run in a process forked from one that has imported them.

A fresh `fairseq-train` spends about 4 s importing torch, fairseq (scikit-learn through its
criterions) and the user-dir before it reads its arguments; the fairseq tests start over a hundred
of them. Here each pytest worker starts one server process that imports what the scripts import,
then forks it once per call: every call is still its own process, with its own working directory,
environment, stdin, stdout, stderr and exit code, and the server itself never runs a tensor op (no
thread pool to inherit). What a fork shares that fresh processes do not: the server's hash seed and
its Python `random` state (fairseq seeds torch and numpy from --seed itself). A call whose
environment differs from the server's in a variable read at import time (any outside CALL_TIME)
runs as a fresh process instead.
"""
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

# The console scripts served (fairseq's setup.py entry points): those whose module configures the
# root logger (stdout, LOGLEVEL) before it imports fairseq, so that the first one imported leaves
# the logging a fresh process of any of them has. fairseq-generate and fairseq-score import fairseq
# first, whose wav2vec2_classification module sets up DEBUG logging to stderr, and
# fairseq-hydra-train starts through hydra: those run as fresh processes.
SCRIPTS = {"train": "fairseq_cli.train", "eval-lm": "fairseq_cli.eval_lm",
           "interactive": "fairseq_cli.interactive", "validate": "fairseq_cli.validate",
           "preprocess": "fairseq_cli.preprocess"}
# read when a call runs, not at import (pytest names each test in its own): a difference in
# these keeps the call on the server
CALL_TIME = {"OMP_NUM_THREADS", "MKL_NUM_THREADS", "PYTHONUNBUFFERED", "PYTEST_CURRENT_TEST"}
_HEADER = struct.Struct("!I")


def _send(fd, message):
    data = pickle.dumps(message)
    os.write(fd, _HEADER.pack(len(data)) + data)


def _read(fd, n, deadline):
    data = b""
    while len(data) < n:
        if deadline is not None and not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
            raise TimeoutError
        chunk = os.read(fd, n - len(data))
        if not chunk:
            raise EOFError("the fairseq CLI server exited")
        data += chunk
    return data


def _receive(fd, deadline=None):
    """One message from fd; TimeoutError once `deadline` (time.monotonic()) passes without it."""
    (size,) = _HEADER.unpack(_read(fd, _HEADER.size, deadline))
    return pickle.loads(_read(fd, size, deadline))


class Server:
    """One per process that uses it (a pytest worker), started on first use."""

    def __init__(self, env, user_dir):
        self.env = dict(env)
        self.process = subprocess.Popen([sys.executable, __file__, user_dir], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=self.env,
                                        cwd=Path(user_dir).parent)
        _receive(self.process.stdout.fileno())                       # ready: everything imported

    def serves(self, env):
        keys = (set(env) | set(self.env)) - CALL_TIME
        return self.process.poll() is None and all(env.get(k) == self.env.get(k) for k in keys)

    def run(self, name, args, stdin, cwd, env, timeout, folder):
        """subprocess.CompletedProcess of `fairseq-<name> args`, text outputs; TimeoutExpired after
        `timeout` s (the call's process killed)."""
        paths = {part: str(folder / f"{part}.txt") for part in ("stdin", "stdout", "stderr")}
        Path(paths["stdin"]).write_text(stdin or "")
        _send(self.process.stdin.fileno(), (name, list(args), str(cwd), dict(env), paths))
        replies = self.process.stdout.fileno()
        pid = _receive(replies)
        try:
            code = _receive(replies, time.monotonic() + timeout)
        except TimeoutError:
            os.kill(pid, signal.SIGKILL)
            _receive(replies)
            raise subprocess.TimeoutExpired([name, *args], timeout) from None
        out, err = (Path(paths[part]).read_text() for part in ("stdout", "stderr"))
        return subprocess.CompletedProcess([f"fairseq-{name}", *args], code, out, err)


def _exit_code(error: SystemExit) -> int:
    """The status Python exits with for an uncaught SystemExit (a message goes to stderr, status 1)."""
    if error.code is None or isinstance(error.code, int):
        return error.code or 0
    print(error.code, file=sys.stderr)
    return 1


def _call(name, args, cwd, env, paths, requests, replies):
    """In the forked child: the console script's `sys.exit(cli_main())`, then exit without
    running the server's cleanup."""
    import importlib
    import traceback
    code = 1
    try:
        os.close(requests)
        os.close(replies)
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        for fd, (part, flags) in enumerate((("stdin", os.O_RDONLY),
                                            ("stdout", os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                                            ("stderr", os.O_WRONLY | os.O_CREAT | os.O_TRUNC))):
            opened = os.open(paths[part], flags)
            os.dup2(opened, fd)
            os.close(opened)
        sys.stdin = open(0, encoding="utf-8", closefd=False)     # not the server's buffer
        sys.argv = [f"fairseq-{name}", *args]
        code = _exit_code(SystemExit(importlib.import_module(SCRIPTS[name]).cli_main()))
    except SystemExit as error:
        code = _exit_code(error)
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(code)


def serve(user_dir):
    """The server: import, say ready, then fork one child per request and report its pid and exit
    status. Requests come on stdin and replies go to stdout, which are moved off fds 0 and 1 first
    so that nothing the imports print reaches them."""
    import argparse
    import importlib
    requests, replies = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    for module in SCRIPTS.values():
        importlib.import_module(module)
    import torch._dynamo  # noqa: F401  (what torch.optim imports at a training run's first step)
    from fairseq.utils import import_user_module
    import_user_module(argparse.Namespace(user_dir=user_dir))
    _send(replies, "ready")
    while True:
        try:
            name, args, cwd, env, paths = _receive(requests)
        except EOFError:
            return
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        pid = os.fork()
        if pid == 0:
            _call(name, args, cwd, env, paths, requests, replies)
        _send(replies, pid)
        _, status = os.waitpid(pid, 0)
        _send(replies, os.waitstatus_to_exitcode(status))


if __name__ == "__main__":
    sys.path.pop(0)            # this folder: its fairseq_cli.py would shadow fairseq's package
    serve(sys.argv[1])
