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
from typing import Callable, Dict, List, Optional, Sequence

from .cache import build_once, check_inside, fresh_dir, inputs_digest, keyed_dir
from .children import popen_kwargs

REPO = Path(__file__).resolve().parents[2]
USER_DIR = REPO / "fairseq_momentum"
SPLITS = ("train", "valid", "test")
LOG_LINE = re.compile(r"\| (train_inner|train|valid) \| (\{.*\})\s*$")


def tool(name: str) -> str:
    """A console script of the running interpreter's environment (.venv/bin/fairseq-train, …)."""
    path = Path(sys.executable).with_name(name)
    return str(path) if path.exists() else name


def run(cmd: Sequence[str], log: Optional[Path] = None, stdin: Optional[str] = None,
        echo: Optional[Callable[[str], None]] = None, append: bool = False) -> str:
    """Run a command from the repo root, streaming its output (stdout and stderr together) line by
    line into `log` as it comes and through `echo` (e.g. a progress printer); on failure raise with
    the end of its output. Returns the whole output. The command dies with this process, even
    when it is killed with SIGKILL (children.py), so no fairseq-preprocess outlives its build."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    lines = []
    log_file = None
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        log_file = open(log, "a" if append else "w", encoding="utf-8")
    try:
        with subprocess.Popen([str(c) for c in cmd], cwd=REPO, env=env, text=True, bufsize=1,
                              stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **popen_kwargs()) as proc:
            if stdin is not None:
                proc.stdin.write(stdin)
                proc.stdin.close()
            for line in proc.stdout:
                lines.append(line)
                if log_file is not None:
                    log_file.write(line)
                    log_file.flush()
                if echo is not None:
                    echo(line.rstrip("\n"))
            returncode = proc.wait()
    finally:
        if log_file is not None:
            log_file.close()
    output = "".join(lines)
    if returncode != 0:
        raise RuntimeError(f"command failed ({returncode}): {' '.join(map(str, cmd))}\n{output[-3000:]}")
    return output


def preprocess_lm(paths: Dict[str, Path], parent: Path, workers: int = 2, log=print) -> Path:
    """fairseq-preprocess the text splits into `parent/data-bin-<key>`, keyed by the content of
    the text files (reused only when they are unchanged)."""
    params = {"tool": "fairseq-preprocess --only-source", "inputs": inputs_digest(paths[s] for s in SPLITS)}

    def build(dest: Path) -> None:
        run([tool("fairseq-preprocess"), "--only-source", "--trainpref", paths["train"], "--validpref",
             paths["valid"], "--testpref", paths["test"], "--destdir", dest, "--workers", str(workers)],
            log=dest / "preprocess.log")

    return build_once(parent, "data-bin", params, build, log=log)


def checkpoint_dir(parent: Path, name: str, data_bin: Path, args: Sequence[str]) -> Path:
    """`parent/<name>-<key>`, keyed by the data-bin and the training arguments, so checkpoints of
    different data or settings never share a folder (fairseq would resume from them). The folder
    and `parent` must not be symlinks (the recipes' cache root is parent's parent): new
    checkpoints would be written wherever they point."""
    params = {"data": Path(data_bin).name, "args": [str(a) for a in args]}
    folder = keyed_dir(parent, name.replace(" ", "_"), params)
    check_inside(folder, Path(parent).parent)
    return folder


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
    """fairseq `--log-format json` records by kind (train_inner, train, valid). A log of a run that
    resumed holds the updates between its last checkpoint and the interruption twice: each
    record is kept in its last form (by kind and update count), in the order of the updates."""
    records: Dict[str, Dict[float, dict]] = {"train_inner": {}, "train": {}, "valid": {}}
    for line in text.splitlines():
        match = LOG_LINE.search(line)
        if match:
            kind, record = match.group(1), json.loads(match.group(2))
            update = float(record.get("num_updates", record.get(f"{kind}_num_updates", -1)))
            records[kind][update] = record
    return {kind: [by_update[u] for u in sorted(by_update)] for kind, by_update in records.items()}


def progress_printer(name: str, start: float) -> Callable[[str], None]:
    """Prints one short line per fairseq log record (loss every --log-interval updates, each
    validation) and any error lines, as fairseq writes them."""
    def echo(line: str) -> None:
        match = LOG_LINE.search(line)
        if match:
            kind, record = match.group(1), json.loads(match.group(2))
            elapsed = time.perf_counter() - start
            if kind == "train_inner":
                print(f"    {name}: epoch {record.get('epoch')} update {record.get('num_updates')} "
                      f"loss {record.get('loss')} ({elapsed:.0f} s)", flush=True)
            elif kind == "valid":
                print(f"    {name}: epoch {record.get('epoch')} valid loss {record.get('valid_loss')} "
                      f"ppl {record.get('valid_ppl')} ({elapsed:.0f} s)", flush=True)
        elif "Traceback" in line or "Error" in line:
            print(f"    {name}: {line}", flush=True)
    return echo


FINISHED = "finished.json"     # a completed run's folder: its training seconds
SPENT = "seconds_so_far"       # seconds an interrupted run spent training in the folder


def train(name: str, data_bin: Path, save_dir: Path, args: Sequence[str], echo: bool = True) -> TrainResult:
    """fairseq-train with the user-dir in `save_dir` (a folder named by a hash of the arguments
    and inputs: checkpoint_dir), its output teed to save_dir/train.log and its progress printed as
    it comes; returns the parsed log and the training seconds. A run that finished there is reused
    (its log read again); one that was interrupted after a checkpoint resumes from
    checkpoint_last.pt, as fairseq-train resumes, its log appended and its seconds added to those
    spent before; otherwise the folder is emptied first."""
    save_dir = Path(save_dir)
    cmd = [tool("fairseq-train"), data_bin, "--user-dir", USER_DIR, "--save-dir", save_dir,
           "--log-format", "json", "--no-progress-bar", *args]
    check_inside(save_dir, save_dir.parent.parent)
    if (save_dir / FINISHED).is_file():
        return _train_result(name, save_dir, json.loads((save_dir / FINISHED).read_text())["seconds"])
    resuming = (save_dir / "checkpoint_last.pt").is_file()
    before = float((save_dir / SPENT).read_text()) if resuming and (save_dir / SPENT).is_file() else 0.0
    if not resuming:
        fresh_dir(save_dir)
    start = time.perf_counter()
    printer = progress_printer(name, start) if echo else None

    def each_line(line: str) -> None:
        (save_dir / SPENT).write_text(f"{before + time.perf_counter() - start:.3f}")
        if printer is not None:
            printer(line)
    run(cmd, log=save_dir / "train.log", echo=each_line, append=resuming)
    seconds = before + time.perf_counter() - start
    result = _train_result(name, save_dir, seconds)
    (save_dir / FINISHED).write_text(json.dumps({"seconds": seconds}))
    return result


def _train_result(name: str, save_dir: Path, seconds: float) -> TrainResult:
    records = parse_log((save_dir / "train.log").read_text(encoding="utf-8"))
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


def validate_lm(data_bin: Path, checkpoint: Path, subset: str = "test", batch_size: int = 1) -> float:
    """Perplexity from fairseq-validate under --task language_modeling_bptt: the state carried over
    the whole split in `batch_size` streams (AWD-LSTM's test protocol at batch size 1)."""
    output = run([tool("fairseq-validate"), data_bin, "--user-dir", USER_DIR,
                  "--task", "language_modeling_bptt", "--path", checkpoint, "--valid-subset", subset,
                  "--batch-size", str(batch_size), "--cpu"])
    match = re.search(rf"valid on '{subset}' subset \| loss [0-9.]+ \| ppl ([0-9.]+)", output)
    if not match:
        raise RuntimeError(f"fairseq-validate reported no perplexity on {subset}:\n{output[-2000:]}")
    return float(match.group(1))


def sample_lm(data_bin: Path, checkpoint: Path, prompts: Sequence[str], max_tokens: int = 30,
              seed: int = 1, topk: int = 10, cpu: bool = True) -> List[str]:
    """Continue each prompt with top-k sampling through fairseq-interactive."""
    output = run([tool("fairseq-interactive"), data_bin, "--user-dir", USER_DIR,
                  "--task", "language_modeling", "--path", checkpoint, *(["--cpu"] if cpu else []),
                  "--sampling", "--sampling-topk", str(topk), "--beam", "1",
                  "--nbest", "1", "--max-len-b", str(max_tokens), "--seed", str(seed)],
                 stdin="\n".join(prompts) + "\n")
    return [line.split("\t")[2] for line in output.splitlines() if line.startswith("H-")]
