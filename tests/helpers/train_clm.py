"""Running recipes/hf/train_clm.py in the tests: as a script (CPU, offline) or imported, with
the per-rank records it writes under --record_dir."""
import importlib.util
import json
import os
import sys
from pathlib import Path

from helpers.launched import run_launched

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "recipes" / "hf" / "train_clm.py"
ACCELERATE = Path(sys.executable).with_name("accelerate")
TINY = ["--hidden_size", "32", "--num_layers", "2", "--num_heads", "4", "--block_size", "32",
        "--per_device_batch_size", "2", "--connection", "momentum"]


def run(cmd, cwd, extra_env=None):
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1",
               ACCELERATE_USE_CPU="1", PYTHONPATH=str(REPO), **(extra_env or {}))
    proc = run_launched(cmd, cwd=cwd, env=env, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc


def records(folder):
    return {int(p.stem[4:]): json.loads(p.read_text()) for p in Path(folder).glob("rank*.json")}


def load_script():
    spec = importlib.util.spec_from_file_location("train_clm", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
