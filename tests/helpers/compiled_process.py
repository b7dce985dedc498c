"""A script in a fresh Python on Triton's real launch path (its scripts activate tests/triton_standin.py:
compiled for sm_90, launches that do nothing), in the repository root and without TRITON_INTERPRET."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_compiled(script: str, timeout: int, **env) -> str:
    """The last line `script` prints; `env` is added to the environment, where a None value removes
    the variable. Fails the test with the end of its stderr on error."""
    environ = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    for name, value in env.items():
        environ.pop(name, None)
        if value is not None:
            environ[name] = str(value)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=environ, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]
