"""Python scripts in the tests (fairseq's console scripts, the recipes), each run in a process forked
from a server that has imported what it imports.

A fresh `fairseq-train` spends about 4 s importing torch, fairseq (scikit-learn through its
criterions) and the user-dir before it reads its arguments, and a recipe of recipes/hf 6-8 s
importing torch, transformers, datasets and accelerate; the tests start over a hundred of them. A
server imports what its scripts import, in their order, then forks once per call: every call is
still its own process, with its own working directory, environment, stdin, stdout, stderr and exit
status, and the server itself never runs a tensor op (no thread pool to inherit). What a fork
shares that fresh processes do not: the server's hash seed and its Python `random` state (fairseq
and the recipes seed torch, numpy and random themselves). A server serves only calls whose
environment equals its own in every variable read at import time (all outside CALL_TIME); the
others run as fresh processes.
"""
import ast
import json
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# read when a call runs, not at import (pytest names each test in its own): a difference in
# these keeps the call on the server
CALL_TIME = {"OMP_NUM_THREADS", "MKL_NUM_THREADS", "PYTHONUNBUFFERED", "PYTEST_CURRENT_TEST"}
# servers kept per process (pytest worker), the least recently used closed first: each holds
# torch and a toolkit in memory (0.5-0.7 GB)
MAX_SERVERS = 3
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
            raise EOFError("the fork server exited")
        data += chunk
    return data


def _receive(fd, deadline=None):
    """One message from fd; TimeoutError once `deadline` (time.monotonic()) passes without it."""
    (size,) = _HEADER.unpack(_read(fd, _HEADER.size, deadline))
    return pickle.loads(_read(fd, size, deadline))


def _kill(pid):
    os.kill(pid, signal.SIGKILL)


class Server:
    """A server process and the calls it runs, one at a time."""

    def __init__(self, env, preload, user_dir=None, isolated=False, call_time=()):
        """preload: what the server imports, in order: module names, or paths of Python scripts (their
        top-level import statements); user_dir: a fairseq --user-dir, imported last; isolated: the
        server and its calls run as `python -I`; call_time: variables besides CALL_TIME that what it
        imports does not read (a call may set them otherwise)."""
        self.env = dict(env)
        self.isolated = isolated
        self.call_time = CALL_TIME | set(call_time)
        flags = ["-I"] if isolated else []
        command = [sys.executable, *flags, __file__, json.dumps([list(preload), user_dir])]
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.DEVNULL, env=self.env, cwd=REPO)
        _receive(self.process.stdout.fileno())                       # ready: everything imported

    def serves(self, env):
        keys = (set(env) | set(self.env)) - self.call_time
        return self.process.poll() is None and all(env.get(k) == self.env.get(k) for k in keys)

    def close(self):
        self.process.stdin.close()
        self.process.wait()
        self.process.stdout.close()

    def run(self, script, args, stdin, cwd, env, timeout, on_timeout=_kill):
        """subprocess.CompletedProcess (text outputs) of `python script args` (a console script too:
        its file is a Python script); script "-c" or "-m" takes the code or module as the first of
        `args`, as python does. Past `timeout` s, `on_timeout(pid)` ends the call's process (SIGKILL
        by default) and TimeoutExpired carries what it wrote."""
        argv = [str(script), *map(str, args)]
        with tempfile.TemporaryDirectory() as folder:        # the call's stdin, stdout and stderr files
            paths = {part: os.path.join(folder, f"{part}.txt") for part in ("stdin", "stdout", "stderr")}
            Path(paths["stdin"]).write_text(stdin or "")
            _send(self.process.stdin.fileno(), (argv, self.isolated, str(cwd), dict(env), paths))
            replies = self.process.stdout.fileno()
            pid = _receive(replies)
            try:
                code = _receive(replies, time.monotonic() + timeout)
            except TimeoutError:
                on_timeout(pid)
                _receive(replies)
                code = None
            out, err = (Path(paths[part]).read_text(errors="replace") for part in ("stdout", "stderr"))
        if code is None:
            raise subprocess.TimeoutExpired(argv, timeout, output=out, stderr=err)
        return subprocess.CompletedProcess(argv, code, out, err)


_servers = {}


def server(preload, env, user_dir=None, start_env=None, isolated=False, call_time=()):
    """This process's server of `preload` (and `user_dir`, `isolated`, `call_time`: Server) if it
    serves a call with `env`, else None. It is started on first use with `start_env` (a fixed
    environment whose calls it serves; other calls return None), or else with `env` (one server per
    environment, in the variables read at import)."""
    start_env = start_env or env
    read = CALL_TIME | set(call_time)
    key = (tuple(preload), user_dir, isolated, frozenset(call_time),
           frozenset((k, v) for k, v in start_env.items() if k not in read))
    found = _servers.pop(key, None)
    if found is not None and found.process.poll() is not None:
        found.close()                                       # exited: its pipes closed, a new one started
        found = None
    if found is None:
        while len(_servers) >= MAX_SERVERS:
            _servers.pop(next(iter(_servers))).close()
        found = Server(start_env, preload, user_dir, isolated, call_time)
    _servers[key] = found                                   # the most recently used last
    return found if found.serves(env) else None


def _exit_code(error: SystemExit) -> int:
    """The status Python exits with for an uncaught SystemExit (a message goes to stderr, status 1)."""
    if error.code is None or isinstance(error.code, int):
        return error.code or 0
    print(error.code, file=sys.stderr)
    return 1


def _run(argv, isolated):
    """`python [-I] *argv` in this process, from where the interpreter starts the script (or -c code,
    or -m module): sys.argv, sys.path[0] and __main__ as python sets them."""
    import builtins
    import runpy
    import types
    if argv[0] == "-c":
        sys.argv = ["-c", *argv[2:]]
        if not isolated:
            sys.path.insert(0, "")
        main = types.ModuleType("__main__")
        main.__builtins__ = builtins
        sys.modules["__main__"] = main
        exec(compile(argv[1], "<string>", "exec"), main.__dict__)
    elif argv[0] == "-m":
        sys.argv = ["-m", *argv[2:]]
        if not isolated:
            sys.path.insert(0, os.getcwd())
        runpy._run_module_as_main(argv[1])
    else:
        sys.argv = list(argv)
        if not isolated:
            sys.path.insert(0, os.path.dirname(argv[0]))
        runpy.run_path(argv[0], run_name="__main__")


def _call(argv, isolated, cwd, env, paths, requests, replies, imported):
    """In the forked child: what the server's imports wrote to stderr (`imported`, as a fresh process
    writes it first: warnings and log lines of import time), `python *argv`, then what the interpreter
    does at exit (wait for non-daemon threads, atexit handlers), then exit without the server's own
    cleanup."""
    import atexit
    import threading
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
        os.write(2, imported)
        _run(argv, isolated)
        code = 0
    except SystemExit as error:
        code = _exit_code(error)
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            threading._shutdown()
            atexit._run_exitfuncs()
        finally:
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
            os._exit(code)


def _import_like(path):
    """The top-level import statements of the script at `path`, in its order, from its folder. One
    that fails (or is relative: no package here) is left to the script's own run."""
    tree = ast.parse(Path(path).read_text(), path)
    folder = os.path.dirname(path)
    sys.path.insert(0, folder)
    try:
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                try:
                    exec(compile(ast.Module([node], []), path, "exec"), {})
                except Exception:
                    pass
    finally:
        sys.path.remove(folder)


def serve(preload, user_dir):
    """The server: import, say ready, then fork one child per request and report its pid and exit
    status. Requests come on stdin and replies go to stdout, which are moved off fds 0 and 1 first
    so that nothing the imports print reaches them; what the imports write to stderr is kept for
    every child to write first."""
    import argparse
    import importlib
    import resource
    requests, replies = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))     # a call aborted for its stacks leaves no core file
    stderr, kept = os.dup(2), tempfile.TemporaryFile()
    os.dup2(kept.fileno(), 2)
    for item in preload:
        if os.sep in item:
            _import_like(item)
        else:
            importlib.import_module(item)
    if user_dir is not None:
        from fairseq.utils import import_user_module
        import_user_module(argparse.Namespace(user_dir=user_dir))
    sys.stderr.flush()
    os.dup2(stderr, 2)
    os.close(stderr)
    kept.seek(0)
    imported = kept.read()
    _send(replies, "ready")
    while True:
        try:
            argv, isolated, cwd, env, paths = _receive(requests)
        except EOFError:
            return
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        pid = os.fork()
        if pid == 0:
            _call(argv, isolated, cwd, env, paths, requests, replies, imported)
        _send(replies, pid)
        _, status = os.waitpid(pid, 0)
        _send(replies, os.waitstatus_to_exitcode(status))


if __name__ == "__main__":
    if sys.path[0] == os.path.dirname(os.path.abspath(__file__)):   # not under -I
        sys.path.pop(0)        # this folder: its fairseq_cli.py would shadow fairseq's package
    serve(*json.loads(sys.argv[1]))
