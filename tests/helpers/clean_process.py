"""A Python process where our packages cannot be imported, as on a machine that has only a saved
model (its remote code) and transformers: `python -I -c`, forked from a server that has imported
torch alone (the code blocks our packages before it imports anything else)."""
import os
import subprocess
import textwrap
from pathlib import Path

from helpers import fork_server

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


# forked from a server that has imported torch only (helpers/fork_server.py), which reads none of the
# Hub's variables that the tests set per call
HUB_VARIABLES = {"HF_HOME", "HF_ENDPOINT", "HF_HUB_OFFLINE", "HF_TOKEN", "HF_HUB_DISABLE_XET", "NO_PROXY",
                 "no_proxy"}


def run_clean(script: str, cwd: Path, env_extra: dict) -> subprocess.CompletedProcess:
    """python -I in `cwd` with our packages blocked; fails the test with its output on error."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "PYTHON"))}
    env.update(HF_HOME=str(cwd / "hf_home"), **env_extra)
    server = fork_server.server(["torch"], env, isolated=True, call_time=HUB_VARIABLES)
    proc = server.run("-c", [BLOCK_OUR_PACKAGES + textwrap.dedent(script)], None, cwd, env, 300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc
