"""Train a causal LM with momentum attention on plain-text files or a `datasets` dataset, with accelerate.

The model is a native MomentumTransformerForCausalLM (default), a MomentumLSTMForCausalLM
(`--model_type momentum_lstm`), or any stock transformers causal
LM built from its config with `attn_implementation="momentum"` / `"linear_attention"`
(`--model_type llama`). Text is tokenized to UTF-8 bytes with ByT5's ids (`byte_tokenizer`, no
download) or with a local tokenizer (`--tokenizer PATH`), concatenated and cut
into blocks of `--block_size` tokens; with `--packing`, every paragraph is a document of at most
`--block_size` tokens and a batch is flattened into one row without padding by transformers'
`DataCollatorWithFlattening` (padding-free training: the model keeps the documents apart). The
tokenizer is saved beside the model, so `pipeline("text-generation", model=OUTPUT/final)` works.

Instead of `--train_file`, `--dataset_name NAME` loads a dataset with `datasets.load_dataset`
(a Hub name, or a local folder or file of json / csv / parquet / text; `--dataset_config_name`,
`--cache_dir`) and `--dataset_from_disk PATH` one written by `save_to_disk`; the text is in
`--text_column`. Each row is a document (its tokens and one end-of-sequence token): tokenized,
then grouped into blocks or, with `--packing`, cut into documents of at most `--block_size`
tokens, by `Dataset.map`, whose cache files (keyed by the data set's fingerprint) a later run
reuses. Validation: the dataset's "validation" split if it has one, else `train_test_split` of
the blocks (`--validation_split`, `--seed`).

Single process:   python recipes/hf/train_clm.py --train_file a.txt --output_dir out
Several processes (CPU ranks shown; on GPUs drop ACCELERATE_USE_CPU):
    ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes 2 --num_machines 1 \
        --mixed_precision no --dynamo_backend no recipes/hf/train_clm.py --train_file a.txt ...

Training runs through the recipes' shared loop (`recipes.common.training.fit`). Features:
gradient accumulation, `--mixed_precision {no,fp16,bf16}`, checkpoints every
`--checkpointing_steps` steps (`accelerator.save_state`) and `--resume_from_checkpoint
{PATH,latest}`, tqdm progress on the main process, evaluation perplexity (losses gathered
over ranks), training/evaluation curves through accelerate's trackers (`--report_to`, default a
CSV file, plotted to OUTPUT/curves.png), final `save_pretrained` of model and tokenizer, and
optional `--push_to_hub --hub_model_id user/name`. `--context_parallel N` (native momentum_transformer)
splits each training sequence over N consecutive ranks (docs/context_parallel.md); evaluation
runs whole sequences. `--bptt` (momentum_lstm) trains and evaluates on contiguous streams, carrying
the LSTM's state from one batch to the next (truncated backpropagation through time of
`--block_size` tokens, as AWD-LSTM and fairseq's `--task language_modeling_bptt`;
recipes/common/hf_bptt.py). `--record_dir` writes per-rank JSON (batch
fingerprints, final parameter digest, training and validation rows, a dataset's cache files) for tests.
"""
import argparse
import ast
import contextlib
import csv
import hashlib
import json
import logging
import math
import os
import re
import sys
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist
from accelerate import Accelerator
from accelerate.tracking import GeneralTracker, get_available_trackers, on_main_process
from accelerate.utils import LoggerType, ProjectConfiguration, set_seed
from tokenizers import Tokenizer as TokenizersModel
from tokenizers import decoders, models, pre_tokenizers
from torch.utils.data import DataLoader, DistributedSampler
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    DataCollatorWithFlattening,
    PreTrainedTokenizerFast,
    get_scheduler,
)
from transformers.convert_slow_tokenizer import bytes_to_unicode

import hf_momentum
from hf_momentum.context_parallel import enable_context_parallel, shard_batch, whole_sequence_loss

# run as a file (python recipes/hf/train_clm.py): the repository root holds the shared training loop
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from plugins.nt_asgd import NTASGD  # noqa: E402
from recipes.common import hf_bptt  # noqa: E402
from recipes.common.config_overrides import with_overrides  # noqa: E402
from recipes.common.process_group import end_process_group  # noqa: E402
from recipes.common.training import fit, passes_of  # noqa: E402

# accelerate trackers whose pip package is not named like the tracker
TRACKER_PACKAGES = {"comet_ml": "comet-ml"}


def check_trackers(parser, names):
    """--report_to: every tracker is "csv" (CSVTracker), "all", or one of accelerate's trackers whose
    package is installed; accelerate itself would skip a missing one with a log line."""
    known = [kind.value for kind in LoggerType if kind.value != "all"]
    available = {LoggerType(kind).value for kind in get_available_trackers()}
    for name in names:
        if name in ("csv", "all"):
            continue
        if name not in known:
            parser.error(f"argument --report_to: unknown tracker {name!r}; choose from csv, all, "
                         f"{', '.join(known)}")
        if name not in available:
            package = TRACKER_PACKAGES.get(name, name)
            parser.error(f"argument --report_to: the {name} tracker needs the {package} package, which is "
                         f"not installed (pip install {package})")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--train_file", nargs="+", default=None,
                   help="plain-text files; the training source is exactly one of --train_file, "
                        "--dataset_name and --dataset_from_disk")
    p.add_argument("--dataset_name", default=None,
                   help="datasets.load_dataset's path: a Hub dataset, or a local folder or file of json, "
                        "csv, parquet or text")
    p.add_argument("--dataset_config_name", default=None, help="the --dataset_name configuration")
    p.add_argument("--dataset_from_disk", default=None, help="a dataset folder written by save_to_disk")
    p.add_argument("--text_column", default="text", help="the dataset column holding the text")
    p.add_argument("--cache_dir", default=None,
                   help="datasets' cache for --dataset_name (default: HF_DATASETS_CACHE, "
                        "~/.cache/huggingface/datasets)")
    p.add_argument("--validation_file", nargs="*", default=None,
                   help="with --train_file; default: the last --validation_split of the training tokens")
    p.add_argument("--validation_split", type=float, default=0.05,
                   help="share of the training blocks held out when there is no --validation_file or "
                        "\"validation\" split")
    p.add_argument("--tokenizer", default=None,
                   help='"bytes" (UTF-8 bytes with ByT5 ids, see byte_tokenizer) or a local tokenizer '
                        'path; default: the tokenizer saved with --model_name_or_path if there is one, '
                        'else "bytes"')
    p.add_argument("--model_name_or_path", default=None,
                   help="fine-tune this saved model (a save_pretrained folder, e.g. OUTPUT/final of an "
                        "earlier run, or a Hub id) instead of building a new one; the size arguments below "
                        "are then ignored")
    p.add_argument("--model_type", default="momentum_transformer",
                   help="momentum_transformer, momentum_lstm, or a stock causal-LM model_type (llama, gpt2, "
                        "...) with --attn_implementation")
    p.add_argument("--attn_implementation", default="momentum", choices=["momentum", "linear_attention"],
                   help="for stock model types")
    p.add_argument("--hidden_size", type=int, default=128)
    p.add_argument("--num_layers", type=int, default=4)
    p.add_argument("--num_heads", type=int, default=4)
    p.add_argument("--attention_momentum", type=float, default=0.6)
    p.add_argument("--attention_step_size", type=float, default=1.0)
    p.add_argument("--cell", default="momentum",
                   help="momentum_lstm: the cell (lstm or a momentum cell of docs/cells.md)")
    p.add_argument("--momentum", type=float, default=None,
                   help="momentum_lstm: the cell's momentum mu (default: the config's, 0.6); refused for a "
                        "cell that does not read it (docs/cells.md)")
    p.add_argument("--step_size", type=float, default=None,
                   help="momentum_lstm: the cell's step size s (default: the config's, 1.0); refused for a "
                        "cell that does not read it")
    p.add_argument("--connection", default="none", choices=["none", "momentum", "adaptive"])
    p.add_argument("--config_overrides", default=None,
                   help='config fields of a model trained from scratch beyond these arguments, as '
                        'transformers\' run_clm.py takes them: "name=value,name=value" (e.g. AWD-LSTM\'s '
                        'regularisers of momentum_lstm: '
                        '"locked_dropout=true,weight_drop=0.5,word_dropout=0.1")')
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--block_size", type=int, default=128,
                   help="training sequence length (with --packing: the longest document)")
    p.add_argument("--packing", action="store_true",
                   help="padding-free training: each paragraph (text between blank lines) is a document of "
                        "at most --block_size tokens (longer ones are cut), and the documents of a batch are "
                        "flattened into one row by transformers' DataCollatorWithFlattening, whose "
                        "position_ids and cu_seq_lens keep them apart")
    p.add_argument("--bptt", action="store_true",
                   help="momentum_lstm: train and evaluate on contiguous streams (--per_device_batch_size "
                        "per process), each batch the next --block_size tokens of each stream, the LSTM's "
                        "state carried from batch to batch (detached), as AWD-LSTM and fairseq's --task "
                        "language_modeling_bptt")
    p.add_argument("--variable_bptt", action="store_true",
                   help="with --bptt: AWD-LSTM's random BPTT length in training: each chunk is N(L, 5) "
                        "tokens long (L = --block_size, or L/2 with probability 0.05; at least 5), drawn per "
                        "epoch from --seed, and its update's learning rate is scaled by its length / L "
                        "(fairseq's --variable-bptt)")
    p.add_argument("--max_position_embeddings", type=int, default=2048,
                   help="longest sequence the model accepts (prompt + generated tokens); >= --block_size")
    p.add_argument("--per_device_batch_size", type=int, default=8)
    p.add_argument("--gradient_accumulation_steps", type=int, default=1)
    p.add_argument("--learning_rate", type=float, default=3e-4)
    p.add_argument("--weight_decay", type=float, default=0.01)
    p.add_argument("--warmup_steps", type=int, default=0)
    p.add_argument("--optimizer", default="adamw", choices=["adamw", "nt_asgd"],
                   help="adamw (linear decay after --warmup_steps) or nt_asgd: AWD-LSTM's NT-ASGD at a "
                        "constant --learning_rate (plugins/nt_asgd.py), averaging the iterates once an "
                        "evaluation's loss stops improving (--nonmono); evaluations, checkpoints and the "
                        "final model then hold the average")
    p.add_argument("--nonmono", type=int, default=5,
                   help="nt_asgd: switch when the loss is worse than the best of all evaluations but the "
                        "last NONMONO")
    p.add_argument("--num_epochs", type=int, default=1)
    p.add_argument("--max_train_steps", type=int, default=None,
                   help="optimizer steps; overrides --num_epochs")
    p.add_argument("--mixed_precision", default=None, choices=["no", "fp16", "bf16"],
                   help="default: what accelerate launch was given")
    p.add_argument("--checkpointing_steps", type=int, default=None)
    p.add_argument("--resume_from_checkpoint", default=None, help='a checkpoint folder or "latest"')
    p.add_argument("--logging_steps", type=int, default=10,
                   help="log the training loss every N optimizer steps")
    p.add_argument("--eval_steps", type=int, default=None,
                   help="evaluate every N optimizer steps (default: at the end of each epoch); "
                        "always at the end")
    p.add_argument("--report_to", nargs="+", default=["csv"],
                   help='accelerate trackers: "csv" (OUTPUT/logs/<run>/metrics.csv, no extra package), '
                        '"tensorboard", "wandb", ... (need their package), or "all"')
    p.add_argument("--run_name", default="train_clm", help="tracker run (project) name")
    p.add_argument("--output_dir", required=True)
    p.add_argument("--push_to_hub", action="store_true")
    p.add_argument("--hub_model_id", default=None, help="user/name on the Hub; required by --push_to_hub")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--record_dir", default=None)
    p.add_argument("--context_parallel", "--context-parallel", type=int, default=1,
                   help="split each sequence over this many consecutive ranks (native momentum_transformer "
                        "only); the data-parallel degree is the number of processes / this")
    args = p.parse_args(argv)
    check_trackers(p, args.report_to)
    sources = [f"--{name}" for name in ("train_file", "dataset_name", "dataset_from_disk")
               if getattr(args, name)]
    if len(sources) != 1:
        p.error("the training data: give exactly one of --train_file, --dataset_name, --dataset_from_disk"
                + (f" (got {' and '.join(sources)})" if sources else ""))
    if args.validation_file is not None and not args.train_file:
        p.error(f"argument --validation_file: goes with --train_file; with {sources[0]} the validation data "
                f"is the dataset's \"validation\" split, else --validation_split of it")
    if args.dataset_config_name and not args.dataset_name:
        p.error("argument --dataset_config_name: goes with --dataset_name")
    if args.nonmono < 1:
        p.error(f"argument --nonmono: expected an integer >= 1, got {args.nonmono}")
    if args.dataset_from_disk and not Path(args.dataset_from_disk).is_dir():
        p.error(f"argument --dataset_from_disk: {args.dataset_from_disk} is not a folder (expected one "
                f"written by save_to_disk)")
    if args.model_name_or_path and Path(args.model_name_or_path).exists() and not (
            Path(args.model_name_or_path) / "config.json").is_file():
        p.error(f"argument --model_name_or_path: {args.model_name_or_path} has no config.json (expected a "
                f"folder written by save_pretrained)")
    if args.tokenizer is None:
        saved = args.model_name_or_path and Path(args.model_name_or_path, "tokenizer_config.json").is_file()
        args.tokenizer = args.model_name_or_path if saved else "bytes"
    if args.config_overrides and args.model_name_or_path:
        p.error("argument --config_overrides: sets the config of a model trained from scratch, not of "
                "--model_name_or_path")
    if args.push_to_hub and not args.hub_model_id:
        p.error("argument --push_to_hub: needs --hub_model_id user/name")
    for name in ("block_size", "max_position_embeddings", "per_device_batch_size",
                 "gradient_accumulation_steps", "num_epochs", "logging_steps"):
        if getattr(args, name) < 1:
            p.error(f"argument --{name}: expected an integer >= 1, got {getattr(args, name)}")
    for name in ("max_train_steps", "checkpointing_steps", "eval_steps"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"argument --{name}: expected an integer >= 1, got {getattr(args, name)}")
    if args.max_position_embeddings < args.block_size:
        p.error(f"argument --max_position_embeddings: must be >= --block_size ({args.block_size}), "
                f"got {args.max_position_embeddings}")
    if args.context_parallel < 1:
        p.error(f"argument --context_parallel: expected an integer >= 1, got {args.context_parallel}")
    if args.context_parallel > 1 and args.model_type != "momentum_transformer":
        p.error(f"argument --context_parallel: supported for --model_type momentum_transformer only, "
                f"got {args.model_type}")
    if args.context_parallel > 1 and args.resume_from_checkpoint:
        p.error("argument --context_parallel: --resume_from_checkpoint is not supported with it")
    if args.context_parallel > 1 and args.packing:
        p.error("argument --context_parallel: --packing is not supported with it (the rows are split over "
                "ranks as whole blocks)")
    if args.bptt and not args.model_name_or_path and args.model_type != "momentum_lstm":
        p.error(f"argument --bptt: carries the state of --model_type momentum_lstm only (a transformer's "
                f"positions would grow with the stream), got {args.model_type}")
    if args.bptt and args.packing:
        p.error("argument --bptt: --packing is not supported with it (the streams run through documents)")
    if args.bptt and args.context_parallel > 1:
        p.error("argument --bptt: --context_parallel is not supported with it")
    if args.variable_bptt and not args.bptt:
        p.error("argument --variable_bptt: draws the chunk lengths of --bptt; give --bptt too")
    if not 0 < args.validation_split < 1:
        p.error(f"argument --validation_split: expected a number in (0, 1), got {args.validation_split}")
    return args


class CSVTracker(GeneralTracker):
    """An accelerate tracker writing `step,metric,value` rows to `<logging_dir>/<run>/metrics.csv`
    (and the run's configuration to hparams.json), with no package beyond accelerate."""
    name = "csv"
    requires_logging_directory = True
    main_process_only = True

    def __init__(self, run_name: str, logging_dir):
        super().__init__()
        self.folder = Path(logging_dir) / run_name
        self.path = self.folder / "metrics.csv"

    @property
    def tracker(self):
        return self.path

    @on_main_process
    def store_init_configuration(self, values: dict):
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / "hparams.json").write_text(json.dumps(values, indent=2, default=str))

    @on_main_process
    def log(self, values: dict, step=None, **kwargs):
        self.folder.mkdir(parents=True, exist_ok=True)
        new = not self.path.exists()
        with open(self.path, "a", newline="") as f:
            writer = csv.writer(f)
            if new:
                writer.writerow(["step", "metric", "value"])
            writer.writerows([step, name, value] for name, value in values.items())


def plot_metrics(csv_path: Path, png_path: Path) -> Path:
    """Training and evaluation loss vs optimizer step from a CSVTracker file."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = {}
    with open(csv_path) as f:
        for row in csv.DictReader(f):
            if row["metric"].endswith("loss"):
                curves.setdefault(row["metric"], []).append((int(row["step"]), float(row["value"])))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, points in curves.items():
        xs, ys = zip(*sorted(points))
        ax.plot(xs, ys, marker="o" if len(xs) < 15 else None, label=name)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss (nats per token)")
    ax.set_title("train_clm.py: training and evaluation loss")
    ax.grid(alpha=0.3)
    if curves:
        ax.legend()
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)
    plt.close(fig)
    return png_path


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """UTF-8 bytes with ByT5's ids (<pad> 0, </s> 1, <unk> 2, byte b -> b + 3), built with the
    `tokenizers` library: a BPE model without merges over the byte-level alphabet. Unlike
    transformers' ByT5Tokenizer it appends no </s> to what it encodes, so a prompt given to
    `pipeline("text-generation")` or `tokenizer(prompt)` does not end with an end-of-text (the
    training text has one </s> per file, after its last byte). It is saved as tokenizer.json and
    loads with AutoTokenizer, no remote code."""
    specials = ["<pad>", "</s>", "<unk>"]
    vocab = {token: i for i, token in enumerate(specials)}
    vocab.update({char: byte + len(specials) for byte, char in bytes_to_unicode().items()})
    backend = TokenizersModel(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="</s>",
                                   unk_token="<unk>")


class Tokenizer:
    """A transformers tokenizer (`byte_tokenizer` for "bytes") and the ids the model needs;
    `encode` gives a document's ids followed by one end-of-sequence token."""

    def __init__(self, name: str):
        self.hf = byte_tokenizer() if name == "bytes" else AutoTokenizer.from_pretrained(name)
        self.vocab_size, self.pad = len(self.hf), self.hf.pad_token_id
        self.bos, self.eos = self.hf.bos_token_id, self.hf.eos_token_id
        if self.pad is None:
            self.pad = self.eos

    def encode(self, text: str):
        ids = self.hf(text, add_special_tokens=False)["input_ids"]
        return ids + ([self.eos] if self.eos is not None else [])


def file_tokens(files, tokenizer):
    """The files' tokens, one after the other (each file's text followed by the end-of-sequence
    token)."""
    return [t for name in files for t in tokenizer.encode(Path(name).read_text(encoding="utf-8"))]


def blocks(files, tokenizer, block_size):
    ids = file_tokens(files, tokenizer)
    n = len(ids) // block_size
    if n == 0:
        raise ValueError(f"{files} hold {len(ids)} tokens, fewer than one block of {block_size}")
    return torch.tensor(ids[:n * block_size]).view(n, block_size)


def documents(files, tokenizer, block_size):
    """--packing: every paragraph of the files (split at blank lines) with its end-of-sequence
    token, cut into pieces of at most block_size tokens; one-token pieces predict nothing and are
    dropped."""
    pieces = []
    for name in files:
        for paragraph in re.split(r"\n\s*\n", Path(name).read_text(encoding="utf-8")):
            if paragraph.strip():
                ids = tokenizer.encode(" ".join(paragraph.split()))
                pieces.extend(ids[i:i + block_size] for i in range(0, len(ids), block_size))
    pieces = [{"input_ids": piece} for piece in pieces if len(piece) > 1]
    if not pieces:
        raise ValueError(f"{files} hold no paragraph of two or more tokens")
    return pieces


def training_splits(args):
    """The raw training and validation splits of --dataset_name / --dataset_from_disk (validation
    None when the dataset has no "validation" split), checked for --text_column."""
    import datasets

    if args.dataset_from_disk:
        loaded = datasets.load_from_disk(args.dataset_from_disk)
        source = f"--dataset_from_disk {args.dataset_from_disk}"
    else:
        loaded = datasets.load_dataset(args.dataset_name, args.dataset_config_name, cache_dir=args.cache_dir)
        source = f"--dataset_name {args.dataset_name}"
    if isinstance(loaded, datasets.Dataset):
        train, valid = loaded, None
    elif "train" in loaded:
        train, valid = loaded["train"], loaded.get("validation")
    else:
        raise ValueError(f"{source} has no \"train\" split (its splits: {', '.join(loaded)})")
    for split in (train, valid):
        if split is not None and args.text_column not in split.column_names:
            raise ValueError(f"--text_column {args.text_column}: {source} has no such column (its columns: "
                             f"{', '.join(split.column_names)})")
    return train, valid, source


def row_encoder(tokenizer, column):
    """Dataset.map's batched function: each row's `column` as tokens, then the end-of-sequence token."""
    def encode(batch):
        ids = tokenizer.hf(batch[column], add_special_tokens=False)["input_ids"]
        return {"input_ids": [row + ([tokenizer.eos] if tokenizer.eos is not None else []) for row in ids]}
    return encode


def tokenized(split, args, tokenizer, source):
    """A split's rows as token blocks of --block_size (or, with --packing, documents of at most
    --block_size tokens), each row a document ending with the end-of-sequence token, through
    `Dataset.map` (batched, cached by fingerprint)."""
    size = args.block_size
    encode = row_encoder(tokenizer, args.text_column)

    def group(batch):
        ids = [token for row in batch["input_ids"] for token in row]
        return {"input_ids": [ids[i:i + size] for i in range(0, len(ids) - size + 1, size)]}

    def cut(batch):
        pieces = (row[i:i + size] for row in batch["input_ids"] for i in range(0, len(row), size))
        return {"input_ids": [piece for piece in pieces if len(piece) > 1]}

    split = split.map(encode, batched=True, remove_columns=split.column_names, desc="tokenize")
    split = split.map(cut if args.packing else group, batched=True,
                      desc="documents" if args.packing else "blocks")
    if len(split) == 0:
        raise ValueError(f"{source} holds no " + ("document of two or more tokens" if args.packing else
                                                  f"block of {size} tokens"))
    return split


def token_streams(args, tokenizer):
    """--bptt: the training and validation splits' tokens, each one stream (every file, or every
    dataset row, followed by the end-of-sequence token); without a validation source the last
    --validation_split of the training tokens."""
    if args.train_file:
        train = file_tokens(args.train_file, tokenizer)
        valid = file_tokens(args.validation_file, tokenizer) if args.validation_file else None
    else:
        train_split, valid_split, _ = training_splits(args)
        encode = row_encoder(tokenizer, args.text_column)
        train, valid = ([t for row in split.map(encode, batched=True, remove_columns=split.column_names,
                                                 desc="tokenize")["input_ids"] for t in row]
                        if split is not None else None for split in (train_split, valid_split))
    if valid is None:
        n_valid = max(2, int(len(train) * args.validation_split))
        train, valid = train[:-n_valid], train[-n_valid:]
    return torch.tensor(train, dtype=torch.long), torch.tensor(valid, dtype=torch.long)


def dataset_loaders_data(args, tokenizer):
    """Training and validation rows (datasets.Dataset with an input_ids column) of a dataset source."""
    train, valid, source = training_splits(args)
    train = tokenized(train, args, tokenizer, source)
    if valid is not None:
        return train, tokenized(valid, args, tokenizer, f"{source} (validation split)")
    if len(train) < 2:
        raise ValueError(f"{source} gives {len(train)} training row, too few to hold out a validation share")
    split = train.train_test_split(test_size=args.validation_split, seed=args.seed)
    return split["train"], split["test"]


def loaders(args, tokenizer):
    """Training and validation loaders. Their batches are model keyword arguments: input_ids and
    labels ((batch, block_size) blocks), or with --packing DataCollatorWithFlattening's one row
    (input_ids, labels with -100 at each document's first token, position_ids that restart,
    cu_seq_lens_q/k, max_length_q/k)."""
    if not args.train_file:
        data, valid = dataset_loaders_data(args, tokenizer)
        collate = DataCollatorWithFlattening(return_flash_attn_kwargs=True) if args.packing else stack_rows
    elif args.packing:
        data = documents(args.train_file, tokenizer, args.block_size)
        valid = documents(args.validation_file, tokenizer, args.block_size) if args.validation_file else None
        collate = DataCollatorWithFlattening(return_flash_attn_kwargs=True)
    else:
        data = blocks(args.train_file, tokenizer, args.block_size)
        valid = blocks(args.validation_file, tokenizer, args.block_size) if args.validation_file else None

        def collate(rows):
            ids = torch.stack(rows)
            return {"input_ids": ids, "labels": ids}
    if valid is None:
        n_valid = max(1, int(len(data) * args.validation_split))
        data, valid = data[:-n_valid], data[-n_valid:]
    train_loader = DataLoader(data, batch_size=args.per_device_batch_size, shuffle=True, collate_fn=collate,
                              generator=torch.Generator().manual_seed(args.seed))
    return train_loader, DataLoader(valid, batch_size=args.per_device_batch_size, collate_fn=collate)


def stack_rows(rows):
    """Blocks of a dataset (rows {"input_ids": [...]}) as model arguments."""
    ids = torch.tensor([row["input_ids"] for row in rows])
    return {"input_ids": ids, "labels": ids}


def samples(batch) -> int:
    """Sequences in a batch: rows, or the documents of a packed row."""
    if "cu_seq_lens_q" in batch:
        return batch["cu_seq_lens_q"].numel() - 1
    return batch["input_ids"].shape[0]


def load_model(args, tokenizer):
    """--model_name_or_path: the saved model (native families through hf_momentum's Auto
    registration; stock ones with --attn_implementation), checked against the tokenizer and
    --block_size."""
    config = AutoConfig.from_pretrained(args.model_name_or_path)
    native = config.model_type in ("momentum_transformer", "momentum_lstm")
    model = AutoModelForCausalLM.from_pretrained(
        args.model_name_or_path, **({} if native else {"attn_implementation": args.attn_implementation}))
    if not native:
        hf_momentum.check_model(model)
    rows = model.get_input_embeddings().num_embeddings
    if tokenizer.vocab_size > rows:
        raise ValueError(f"--model_name_or_path {args.model_name_or_path}: its embedding has {rows} rows, "
                         f"fewer than the {tokenizer.vocab_size} tokens of --tokenizer {args.tokenizer}")
    longest = getattr(model.config, "max_position_embeddings", None)
    if longest is not None and longest < args.block_size:
        raise ValueError(f"--block_size {args.block_size} is longer than --model_name_or_path "
                         f"{args.model_name_or_path}'s max_position_embeddings ({longest})")
    return model


def build_model(args, tokenizer):
    if args.model_name_or_path:
        return load_model(args, tokenizer)
    common = dict(vocab_size=tokenizer.vocab_size, pad_token_id=tokenizer.pad, bos_token_id=tokenizer.bos,
                  eos_token_id=tokenizer.eos)
    make = partial(AutoConfig.for_model, args.model_type)
    if args.model_type == "momentum_transformer":
        fields = dict(hidden_size=args.hidden_size, num_hidden_layers=args.num_layers,
                      num_attention_heads=args.num_heads,
                      max_position_embeddings=args.max_position_embeddings,
                      attention_momentum=args.attention_momentum,
                      attention_step_size=args.attention_step_size, connection=args.connection,
                      hidden_dropout=args.dropout, **common)
        return AutoModelForCausalLM.from_config(make(**with_overrides(make, fields, args.config_overrides)))
    if args.model_type == "momentum_lstm":
        given = {name: getattr(args, name) for name in ("momentum", "step_size")
                 if getattr(args, name) is not None}      # the config refuses one its cell never reads
        fields = dict(hidden_size=args.hidden_size, num_hidden_layers=args.num_layers, cell=args.cell,
                      dropout=args.dropout, embedding_dropout=args.dropout, **given, **common)
        return AutoModelForCausalLM.from_config(make(**with_overrides(make, fields, args.config_overrides)))
    sizes = {"hidden_size": args.hidden_size, "num_hidden_layers": args.num_layers,
             "num_attention_heads": args.num_heads, "num_key_value_heads": args.num_heads,
             "head_dim": args.hidden_size // args.num_heads, "intermediate_size": 4 * args.hidden_size,
             "max_position_embeddings": args.max_position_embeddings}
    defaults = AutoConfig.for_model(args.model_type)
    fields = {**common, **{k: v for k, v in sizes.items() if hasattr(defaults, k)}}
    config = make(**with_overrides(make, fields, args.config_overrides))
    hf_momentum.set_momentum_attention(config, momentum=args.attention_momentum,
                                       step_size=args.attention_step_size)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=args.attn_implementation)
    hf_momentum.check_model(model)
    return model


def fingerprint(t: torch.Tensor) -> str:
    return hashlib.sha1(t.cpu().numpy().tobytes()).hexdigest()[:16]


def evaluate(model, loader, accelerator):
    model.eval()
    losses = []
    for batch in loader:
        with torch.no_grad():
            loss = model(**batch).loss
        losses.append(accelerator.gather_for_metrics(loss.detach().float().repeat(samples(batch))))
    model.train()
    loss = torch.cat(losses).mean().item()
    return loss, math.exp(min(loss, 50.0))


class ContextParallelLoader:
    """The training batches of one data-parallel rank, the same on every rank of its context
    group (accelerate would give each process its own batches, so it does not prepare this one)."""

    def __init__(self, data, collate, args, dp_size: int, dp_rank: int):
        self.sampler = DistributedSampler(data, num_replicas=dp_size, rank=dp_rank, shuffle=True,
                                          seed=args.seed)
        self.loader = DataLoader(data, batch_size=args.per_device_batch_size, sampler=self.sampler,
                                 collate_fn=collate)

    def set_epoch(self, epoch: int):
        self.sampler.set_epoch(epoch)

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        return iter(self.loader)


def context_parallel_setup(args, accelerator, model, train_loader):
    """--context_parallel N: consecutive groups of N ranks, each splitting its sequences over its
    ranks (hf_momentum.context_parallel), the groups data-parallel. Returns this rank's group and
    its training loader."""
    world, n = accelerator.num_processes, args.context_parallel
    if world % n:
        raise ValueError(f"--context_parallel {n} must divide the number of processes ({world})")
    groups = [dist.new_group(list(range(start, start + n))) for start in range(0, world, n)]
    rank = accelerator.process_index
    enable_context_parallel(model, groups[rank // n])
    return groups[rank // n], ContextParallelLoader(train_loader.dataset, train_loader.collate_fn, args,
                                                    world // n, rank // n)


def training_loss(model, batch, group, device):
    """The loss to back-propagate and the loss to report. Under context parallelism each rank
    back-propagates its share of the whole-sequence loss, times the group size because DDP
    averages the gradients over every rank (context-parallel ranks must add theirs)."""
    if group is None:
        loss = model(**batch).loss
        return loss, loss.detach()
    inputs = shard_batch({key: batch[key].to(device) for key in ("input_ids", "labels")}, group)
    loss = model(**inputs).loss
    return loss * dist.get_world_size(group), whole_sequence_loss(loss, group)


class TiedWeightsRecordFilter(logging.Filter):
    """Drops accelerate's "Removed shared tensor {...} while saving" record when every name it
    lists is a tied weight of the model (transformers' `all_tied_weights_keys`, e.g. lm_head.weight
    tied to the input embedding): the tied parameter is one tensor, which load_state fills in
    place, so the tie is intact after loading. A record naming any other tensor is kept."""

    PATTERN = re.compile(r"Removed shared tensor (\{.*?\}) while saving")

    def __init__(self, tied):
        super().__init__()
        self.tied = set(tied)

    def filter(self, record):
        match = self.PATTERN.search(record.getMessage())
        return not (match and ast.literal_eval(match.group(1)) <= self.tied)


def save_checkpoint(accelerator, model, path):
    """accelerator.save_state without the shared-tensor warning for the model's tied weights."""
    tied = getattr(accelerator.unwrap_model(model), "all_tied_weights_keys", None) or {}
    record_filter = TiedWeightsRecordFilter(tied)
    logger = logging.getLogger("accelerate.utils.other")
    logger.addFilter(record_filter)
    try:
        accelerator.save_state(str(path))
    finally:
        logger.removeFilter(record_filter)


@contextlib.contextmanager
def whole_sequences(model, group):
    """Evaluation runs each sequence whole on one rank (no gradients are kept)."""
    if group is not None:
        enable_context_parallel(model, None)
    try:
        yield
    finally:
        if group is not None:
            enable_context_parallel(model, group)


def main(argv=None):
    args = parse_args(argv)
    kwargs = {} if args.mixed_precision is None else {"mixed_precision": args.mixed_precision}
    output = Path(args.output_dir)
    csv_tracker = CSVTracker(args.run_name, output / "logs")
    log_with = [csv_tracker if name == "csv" else name for name in args.report_to]
    accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps, log_with=log_with,
                              project_config=ProjectConfiguration(project_dir=str(output),
                                                                  logging_dir=str(output / "logs")), **kwargs)
    # trackers accept bool/int/float/str/None values only
    accelerator.init_trackers(args.run_name, config={
        k: v if v is None or isinstance(v, (bool, int, float, str)) else str(v)
        for k, v in vars(args).items()})
    set_seed(args.seed)
    tokenizer = Tokenizer(args.tokenizer)
    with accelerator.main_process_first():     # one process tokenizes a dataset, the others read its cache
        if args.bptt:
            streams = token_streams(args, tokenizer)
        else:
            train_loader, valid_loader = loaders(args, tokenizer)
    carried = None
    if args.bptt:
        place = dict(rows=args.per_device_batch_size, rank=accelerator.process_index,
                     ranks=accelerator.num_processes)
        train_loader = hf_bptt.stream_loader(streams[0], args.block_size, split="training",
                                             seed=args.seed if args.variable_bptt else None, **place)
        valid_loader = hf_bptt.stream_loader(streams[1], args.block_size, split="validation", **place)
    data_record = {"train_rows": len(train_loader.dataset), "valid_rows": len(valid_loader.dataset),
                   "cache_files": sorted({f["filename"] for loader in (train_loader, valid_loader)
                                          for f in getattr(loader.dataset, "cache_files", [])})}
    model = build_model(args, tokenizer)
    if args.bptt:
        if model.config.model_type != "momentum_lstm":
            raise ValueError(f"--bptt carries the state of a momentum_lstm model; --model_name_or_path "
                             f"{args.model_name_or_path} is a {model.config.model_type}")
        carried = hf_bptt.CarriedState(type(model).cache_class, model.config)
    cp_group = None
    if args.context_parallel > 1:
        cp_group, train_loader = context_parallel_setup(args, accelerator, model, train_loader)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if args.optimizer == "nt_asgd":
        optimizer = averaging = NTASGD(groups, lr=args.learning_rate, nonmono=args.nonmono)
    else:
        optimizer, averaging = torch.optim.AdamW(groups, lr=args.learning_rate), None
    rate_by_length = hf_bptt.RateByLength(optimizer, args.block_size) if args.variable_bptt else None
    if args.bptt:               # its passes may differ in length (--variable_bptt)
        max_steps = args.max_train_steps or passes_of(train_loader, accelerator).steps(args.num_epochs)
    else:
        batches_per_process = len(train_loader) if cp_group is not None else math.ceil(
            len(train_loader) / accelerator.num_processes)
        updates_per_epoch = math.ceil(batches_per_process / args.gradient_accumulation_steps)
        max_steps = args.max_train_steps or args.num_epochs * updates_per_epoch
    scheduler = get_scheduler("linear" if averaging is None else "constant_with_warmup", optimizer,
                              num_warmup_steps=args.warmup_steps * accelerator.num_processes,
                              num_training_steps=max_steps * accelerator.num_processes)
    if args.bptt:               # each rank's streams are its own: accelerate must not shard them again
        model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    else:
        model, optimizer, train_loader, valid_loader, scheduler = accelerator.prepare(
            model, optimizer, train_loader, valid_loader, scheduler)

    step = 0
    if args.resume_from_checkpoint:
        path = Path(args.resume_from_checkpoint)
        if args.resume_from_checkpoint == "latest":
            found = sorted(output.glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
            if not found:
                raise FileNotFoundError(f"no step_* checkpoint in {output}")
            path = found[-1]
        accelerator.load_state(str(path))
        if carried is not None:
            carried.load(path, accelerator.process_index, args.per_device_batch_size,
                        accelerator.num_processes, accelerator.device)
        step = int(path.name.split("_")[1])
        accelerator.print(f"resumed from {path} at step {step}")

    record = {"rank": accelerator.process_index, "batches": [], **data_record}
    interval_losses, at = [], {"step": step}

    def on_step(done, _, metrics):
        at["step"] = done
        if rate_by_length is not None:
            rate_by_length.updated()
        interval_losses.append(metrics["shown"].item())
        if done % args.logging_steps == 0:
            accelerator.log({"train/loss": sum(interval_losses) / len(interval_losses),
                             "train/learning_rate": scheduler.get_last_lr()[0]}, step=done)
            interval_losses.clear()
        if args.checkpointing_steps and done % args.checkpointing_steps == 0:
            if averaging is not None:           # the checkpoint's model is the average, its iterate
                averaging.use_average(True)     # rides in the optimizer's state
            save_checkpoint(accelerator, model, output / f"step_{done}")
            if carried is not None:
                carried.save(output / f"step_{done}", accelerator)

    def log_evaluation(prepared_model):
        if averaging is not None:
            averaging.use_average(True)
        # the evaluation draws no number from the training's generators (its loader's iterator draws
        # a seed): a run resumed from a checkpoint saved at an evaluation step then trains on alike
        devices = [accelerator.device] if accelerator.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), whole_sequences(accelerator.unwrap_model(prepared_model),
                                                                     cp_group):
            if carried is not None:
                valid_loss, perplexity = hf_bptt.evaluate_streams(
                    prepared_model, valid_loader, hf_bptt.CarriedState(carried.cache_class, carried.config),
                    accelerator)
            else:
                valid_loss, perplexity = evaluate(prepared_model, valid_loader, accelerator)
        if averaging is not None and averaging.observe(valid_loss):
            accelerator.print(f"NT-ASGD: the validation loss {valid_loss:.4f} at step {at['step']} is worse "
                              f"than the best before the last {args.nonmono} evaluations: averaging the "
                              "iterates from here on")
        accelerator.log({"eval/loss": valid_loss, "eval/perplexity": perplexity}, step=at["step"])
        return {"loss": valid_loss, "perplexity": perplexity}

    def on_batch(batch):
        record["batches"].append(fingerprint(batch["input_ids"]))
        if averaging is not None:               # train on the iterate
            averaging.use_average(False)

    def loss_fn(prepared_model, batch):
        if carried is not None:
            if rate_by_length is not None:
                rate_by_length.add(batch["input_ids"].shape[1])
            loss = hf_bptt.chunk_loss(prepared_model, batch, carried, accelerator.device)
            return loss, {"shown": loss.detach()}
        loss, shown = training_loss(prepared_model, batch, cp_group, accelerator.device)
        return loss, {"shown": shown}

    unwrapped, history = fit(
        model, optimizer, train_loader, loss_fn, accelerator=accelerator, steps=max_steps,
        eval_every=args.eval_steps or None, evaluate=log_evaluation, schedule=scheduler, desc="train",
        prepared=True, start_step=step, on_step=on_step,
        on_batch=on_batch)
    step = at["step"]
    if history.steps:
        valid_loss, perplexity = history.eval["loss"][-1], history.eval["perplexity"][-1]
    else:       # resumed at the last step: nothing left to train
        final = log_evaluation(model)
        valid_loss, perplexity = final["loss"], final["perplexity"]
    if accelerator.is_main_process and csv_tracker.path.exists():
        accelerator.print(f"curves: {plot_metrics(csv_tracker.path, output / 'curves.png')}")
    accelerator.print(json.dumps({"step": step, "valid_loss": round(valid_loss, 4),
                                  "valid_perplexity": round(perplexity, 3)}))
    accelerator.wait_for_everyone()
    if averaging is not None:
        averaging.use_average(True)
    if args.record_dir:
        flat = torch.cat([p.detach().float().flatten().cpu() for p in unwrapped.parameters()])
        record.update(step=step, params=fingerprint(flat), valid_loss=valid_loss)
        Path(args.record_dir).mkdir(parents=True, exist_ok=True)
        Path(args.record_dir, f"rank{accelerator.process_index}.json").write_text(json.dumps(record))
    unwrapped.save_pretrained(output / "final", is_main_process=accelerator.is_main_process,
                              save_function=accelerator.save)
    if accelerator.is_main_process:
        tokenizer.hf.save_pretrained(output / "final")
    # every rank gets there together, after rank 0 has written, as torch.distributed asks of
    # destroy_process_group (a rank tearing its group down while another still works can hang the
    # launch); the group is released at exit, after the DDP wrapper (recipes/common/process_group.py)
    end_process_group(accelerator)
    if accelerator.is_main_process and args.push_to_hub:
        unwrapped.push_to_hub(args.hub_model_id)
        tokenizer.hf.push_to_hub(args.hub_model_id)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
