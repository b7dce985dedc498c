"""Run fairseq's own command-line tools for the recipes and read back what they report.

Every step is the CLI a user would type (fairseq-preprocess, -train, -eval-lm, -interactive,
-generate) with `--user-dir fairseq_momentum`; training logs are read from fairseq's JSON log
lines, so the recipes add no training loop of their own."""
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

REPO = Path(__file__).resolve().parents[2]
USER_DIR = REPO / "fairseq_momentum"
LOG_LINE = re.compile(r"\| (train_inner|train|valid) \| (\{.*\})\s*$")


def tool(name: str) -> str:
    """A console script of the running interpreter's environment (.venv/bin/fairseq-train, …)."""
    path = Path(sys.executable).with_name(name)
    return str(path) if path.exists() else name


def run(cmd: Sequence[str], log: Optional[Path] = None, stdin: Optional[str] = None) -> str:
    """Run a command from the repo root; on failure show the end of its output."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    result = subprocess.run([str(c) for c in cmd], cwd=REPO, env=env, input=stdin, capture_output=True, text=True)
    output = result.stdout + result.stderr
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(output)
    if result.returncode != 0:
        raise RuntimeError(f"command failed ({result.returncode}): {' '.join(map(str, cmd))}\n{output[-3000:]}")
    return output


def preprocess_lm(paths: Dict[str, Path], dest: Path, workers: int = 2) -> Path:
    if (dest / "dict.txt").exists():
        return dest
    run([tool("fairseq-preprocess"), "--only-source", "--trainpref", paths["train"], "--validpref", paths["valid"],
         "--testpref", paths["test"], "--destdir", dest, "--workers", str(workers)], log=dest / "preprocess.log")
    return dest


@dataclass
class TrainResult:
    name: str
    seconds: float
    train: List[dict] = field(default_factory=list)       # train_inner records: num_updates, loss, wall
    valid: List[dict] = field(default_factory=list)       # one record per validation
    save_dir: Optional[Path] = None

    @property
    def best_valid_ppl(self) -> float:
        return min(float(v["valid_ppl"]) for v in self.valid)


def parse_log(text: str) -> Dict[str, List[dict]]:
    """fairseq `--log-format json` records by kind (train_inner, train, valid)."""
    records: Dict[str, List[dict]] = {"train_inner": [], "train": [], "valid": []}
    for line in text.splitlines():
        match = LOG_LINE.search(line)
        if match:
            records[match.group(1)].append(json.loads(match.group(2)))
    return records


def train(name: str, data_bin: Path, save_dir: Path, args: Sequence[str]) -> TrainResult:
    """fairseq-train with the user-dir; returns the parsed log and the wall time."""
    cmd = [tool("fairseq-train"), data_bin, "--user-dir", USER_DIR, "--save-dir", save_dir,
           "--log-format", "json", "--no-progress-bar", *args]
    start = time.perf_counter()
    output = run(cmd, log=save_dir / "train.log")
    seconds = time.perf_counter() - start
    records = parse_log(output)
    if not records["valid"]:
        raise RuntimeError(f"{name}: fairseq-train reported no validation; see {save_dir / 'train.log'}")
    return TrainResult(name, seconds, records["train_inner"], records["valid"], save_dir)


def eval_lm(data_bin: Path, checkpoint: Path, tokens_per_sample: int, subset: str = "test",
            extra: Sequence[str] = ()) -> float:
    """Perplexity from fairseq-eval-lm, in blocks of the training length (eval-lm's own default of
    1024 tokens exceeds small models' max_positions and would skip every sample)."""
    output = run([tool("fairseq-eval-lm"), data_bin, "--user-dir", USER_DIR, "--path", checkpoint,
                  "--gen-subset", subset, "--cpu", "--tokens-per-sample", str(tokens_per_sample),
                  "--sample-break-mode", "none", *extra])
    evaluated = re.search(r"Evaluated ([0-9,]+) tokens", output)
    match = re.search(r"Perplexity: ([0-9.]+)", output)
    if not match or not evaluated or int(evaluated.group(1).replace(",", "")) == 0:
        raise RuntimeError(f"fairseq-eval-lm evaluated no tokens:\n{output[-2000:]}")
    return float(match.group(1))


def sample_lm(data_bin: Path, checkpoint: Path, prompts: Sequence[str], max_tokens: int = 30,
              seed: int = 1, topk: int = 10) -> List[str]:
    """Continue each prompt with top-k sampling through fairseq-interactive."""
    output = run([tool("fairseq-interactive"), data_bin, "--user-dir", USER_DIR, "--task", "language_modeling",
                  "--path", checkpoint, "--cpu", "--sampling", "--sampling-topk", str(topk), "--beam", "1",
                  "--nbest", "1", "--max-len-b", str(max_tokens), "--seed", str(seed)],
                 stdin="\n".join(prompts) + "\n")
    return [line.split("\t")[2] for line in output.splitlines() if line.startswith("H-")]
