"""A fresh Python process where our packages cannot be imported, as on a machine that has
only a saved model (its remote code) and transformers."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

BLOCK_OUR_PACKAGES = """
import importlib.abc, sys
class _Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"plugins", "hf_momentum", "fairseq_momentum", "recipes"}:
            raise ModuleNotFoundError(f"No module named {name!r}")
sys.meta_path.insert(0, _Blocked())
try:
    import plugins
    raise SystemExit("plugins is importable")
except ModuleNotFoundError:
    pass
"""


def run_clean(script: str, cwd: Path, env_extra: dict) -> subprocess.CompletedProcess:
    """python -I in `cwd` with our packages blocked; fails the test with its output on error."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "PYTHON"))}
    env.update(HF_HOME=str(cwd / "hf_home"), **env_extra)
    proc = subprocess.run([sys.executable, "-I", "-c", BLOCK_OUR_PACKAGES + textwrap.dedent(script)],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc
