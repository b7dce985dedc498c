"""What the fairseq tests share: tiny generated corpora, the real CLIs, in-process model
building."""
import os
import random
import re
import subprocess
import sys
from pathlib import Path

from helpers import fork_server
from plugins.rnn import VARIANTS
from plugins.rnn.variants import unread_hyperparameters

REPO = Path(__file__).resolve().parents[2]
USER_DIR = str(REPO / "fairseq_momentum")
BIN = Path(sys.executable).parent
WORDS = ("the a one cat dog bird fox sees likes chases eats finds small big red green old "
         "house tree river hill and").split()
CLI_TIMEOUT = 240


def sentence(rng, low=3, high=12):
    return [rng.choice(WORDS) for _ in range(rng.randint(low, high))]


def translate(words):
    """A deterministic toy 'translation': each word mapped, adjacent pairs swapped."""
    mapped = [w.upper()[::-1] for w in words]
    for i in range(0, len(mapped) - 1, 2):
        mapped[i], mapped[i + 1] = mapped[i + 1], mapped[i]
    return mapped


def write_lm_text(directory, sizes=(("train", 300), ("valid", 30), ("test", 30)), seed=0):
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    for split, n in sizes:
        (directory / f"{split}.txt").write_text(
            "".join(" ".join(sentence(rng)) + "\n" for _ in range(n)))
    return directory


def write_parallel_text(directory, sizes=(("train", 300), ("valid", 30), ("test", 20)), seed=1):
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    for split, n in sizes:
        src = [sentence(rng, 3, 10) for _ in range(n)]
        (directory / f"{split}.src").write_text("".join(" ".join(s) + "\n" for s in src))
        (directory / f"{split}.tgt").write_text("".join(" ".join(translate(s)) + "\n" for s in src))
    return directory


def cli_env(**extra):
    env = dict(os.environ)
    env.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)
    env.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    env.update(extra)
    return env


# fairseq's console scripts forked from a server (helpers/fork_server.py), by the order in which they
# import: these configure the root logger (stdout, LOGLEVEL) before they import fairseq, so the first
# one imported leaves the logging each of them has fresh; torch._dynamo is what torch.optim imports
# at a training run's first step.
LOGGING_FIRST = ["train", "eval-lm", "interactive", "validate", "preprocess"]
# these import fairseq first, whose wav2vec2_classification module sets up DEBUG logging to stderr
# (generate configures its own only when it runs): a server of their own keeps that order.
# fairseq-hydra-train starts through hydra and runs fresh.
FAIRSEQ_FIRST = ["generate", "score"]
# name: what its server imports (the console scripts' own imports, in that order)
PRELOAD = {**dict.fromkeys(LOGGING_FIRST, [*(str(BIN / f"fairseq-{n}") for n in LOGGING_FIRST),
                                           "torch._dynamo"]),
           **dict.fromkeys(FAIRSEQ_FIRST, [str(BIN / f"fairseq-{n}") for n in FAIRSEQ_FIRST])}


def server(name, env):
    """This worker's fork server of fairseq-<name> if it runs a call with `env`, else None (started on
    first use with cli_env(); a call whose environment differs at import time runs fresh)."""
    if name not in PRELOAD:
        return None
    return fork_server.server(PRELOAD[name], env, USER_DIR, start_env=cli_env())


def run_module(module, *args):
    """`python -m <module of fairseq_momentum> args` in its own process, forked from a server that has
    imported the user-dir package and the module's own imports (as `python -m` imports the package
    first): the CompletedProcess (text stdout and stderr)."""
    path = REPO / module.replace(".", os.sep)
    forked = fork_server.server([module.split(".")[0], f"{path}.py"], cli_env())
    return forked.run("-m", [module, *args], None, os.getcwd(), cli_env(), CLI_TIMEOUT)


def run_fresh(name, *args, stdin=None, cwd=None, env=None):
    """/venv/bin/fairseq-<name> in a fresh process: the CompletedProcess (text stdout and stderr)."""
    return subprocess.run([str(BIN / f"fairseq-{name}"), *map(str, args)], input=stdin, capture_output=True,
                          text=True, cwd=cwd or REPO, env=env or cli_env(), timeout=CLI_TIMEOUT)


def run_cli(name, *args, stdin=None, cwd=None, env=None, check=True):
    """fairseq-<name> in its own process: forked from this worker's fork server where it serves the
    script and the environment, else fresh (`run_fresh`); the CompletedProcess (text stdout and
    stderr)."""
    args = [str(a) for a in args]
    env = env or cli_env()
    forked = server(name, env)
    if forked is not None:
        proc = forked.run(BIN / f"fairseq-{name}", args, stdin, cwd or REPO, env, CLI_TIMEOUT)
    else:
        proc = run_fresh(name, *args, stdin=stdin, cwd=cwd, env=env)
    if check and proc.returncode != 0:
        cmd = [str(BIN / f"fairseq-{name}"), *args]
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n"
                             f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


def preprocess(*args):
    """fairseq-preprocess in this process (the tests' data, not the console script under test:
    test_readme and the demo run that): the same files, without a Python start that imports torch
    and fairseq again (3-4 s each). The log handler fairseq adds per call is closed after it."""
    import logging

    from fairseq import options
    from fairseq_cli import preprocess as cli

    logger = logging.getLogger(cli.logger.name)
    before = list(logger.handlers)
    try:
        cli.main(options.get_preprocessing_parser().parse_args([str(a) for a in args]))
    finally:
        for handler in logger.handlers[len(before):]:
            logger.removeHandler(handler)
            handler.close()


def preprocess_lm(text_dir, dest):
    preprocess("--only-source", "--trainpref", text_dir / "train.txt", "--validpref", text_dir / "valid.txt",
               "--testpref", text_dir / "test.txt", "--destdir", dest, "--workers", "1")
    return dest


def preprocess_translation(text_dir, dest):
    preprocess("--source-lang", "src", "--target-lang", "tgt", "--trainpref", text_dir / "train",
               "--validpref", text_dir / "valid", "--testpref", text_dir / "test", "--destdir", dest,
               "--workers", "1")
    return dest


COMMON_TRAIN = ["--cpu", "--num-workers", "0", "--required-batch-size-multiple", "1",
                "--log-format", "simple", "--log-interval", "1", "--seed", "1", "--no-epoch-checkpoints"]


def train(data, save_dir, *args, **kwargs):
    return run_cli("train", data, "--user-dir", USER_DIR, "--save-dir", save_dir,
                   *COMMON_TRAIN, *args, **kwargs)


def train_losses(log):
    """{num_updates: loss} from train_inner lines of a --log-format simple log."""
    losses = {}
    for m in re.finditer(r"train_inner \| .*?loss=([0-9.]+).*?num_updates=(\d+)", log):
        losses[int(m.group(2))] = float(m.group(1))
    return losses


def write_dict(path, words):
    path.write_text("".join(f"{w} 1\n" for w in words))


def build_model(tmp_path, task_args, arch_args, joined=False):
    """Parse a fairseq-train command line in-process and build its task and model (eval
    mode). Only dictionaries are needed on disk: they are written to tmp_path (a translation
    task's target dictionary equal to its source's with `joined`)."""
    from fairseq import options, tasks
    data = tmp_path / "dicts"
    data.mkdir(exist_ok=True)
    write_dict(data / "dict.txt", WORDS)
    write_dict(data / "dict.src.txt", WORDS)
    write_dict(data / "dict.tgt.txt", WORDS if joined else [w.upper()[::-1] for w in WORDS])
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(
        parser, [str(data), "--user-dir", USER_DIR, "--cpu", *task_args, *arch_args])
    task = tasks.setup_task(args)
    return task.build_model(args).eval(), task, args


def lm_args(arch, *extra):
    return ["--task", "language_modeling", "--tokens-per-sample", "64"], ["--arch", arch, *extra]


def random_tokens(task, batch, length, generator):
    import torch
    d = task.target_dictionary
    return torch.randint(d.nspecial, len(d), (batch, length), generator=generator)


def parse_namespace(arch, *extra, task="language_modeling"):
    """Only parse a command line (argument validation), returning the Namespace."""
    from fairseq import options
    parser = options.get_training_parser()
    return options.parse_args_and_arch(parser, ["DATA", "--user-dir", USER_DIR, "--task", task,
                                                "--arch", arch, *extra])


def cell_flags(cell, values=None, restart=3):
    """Command-line flags of a registry cell: the hyperparameters it reads (another is refused),
    from `values` by name (default momentum 0.6, step_size 0.7, beta 0.8), and a restart every
    `restart` steps wherever the cell takes one (None: no restart, which only nag allows)."""
    values = values or {"momentum": 0.6, "step_size": 0.7, "beta": 0.8}
    flags = ["--lstm-cell", cell]
    for name in set(values) - set(unread_hyperparameters(cell)):
        flags += [f"--lstm-{name.replace('_', '-')}", str(values[name])]
    takes_restart = restart is not None and VARIANTS[cell].restart != "refused"
    return flags + (["--lstm-restart", str(restart)] if takes_restart else [])
