"""Reading fairseq checkpoints with torch's safe unpickler, and a clear error for a broken one.

torch >= 2.6 loads with `weights_only=True`, which builds tensors, plain containers and only the
types on its allowlist, so a pickle cannot run code. fairseq's checkpoints hold a few more
types: the model arguments of a legacy architecture as an `argparse.Namespace`; with
`--eval-bleu`, numpy arrays of BLEU statistics among the meters; and when rank 0 broadcasts a
loaded checkpoint to the other ranks (`distributed_utils.broadcast_object`), the omegaconf
config that `load_checkpoint_to_cpu` made of it, with fairseq's tensor placeholders.
`FAIRSEQ_CHECKPOINT_TYPES` allowlists those, found with
`torch.serialization.get_unsafe_globals_in_checkpoint` on checkpoints that fairseq-train saved
for every architecture here (and on the broadcast buffer), plus their siblings of the same kind
(the other omegaconf value nodes). numpy values are rebuilt by safe_numpy's stand-ins, which
check every dtype and array before numpy reads it, and new checkpoints store numpy scalars as
Python numbers. Everything else stays
refused by every `torch.load` of the process, a malicious pickle included, and nothing changes
the environment of child processes (tests/test_fairseq_checkpoints.py, and the resume,
generate, eval-lm and two-rank resume tests of the other fairseq test files).

`load_checkpoint_to_cpu` replaces fairseq's function of that name: an empty or truncated file
(an interrupted save) stops with an error naming it and the readable checkpoints beside it for
`--restore-file`, a checkpoint holding a type outside the allowlist says how to allow it, and one
whose config holds code where fairseq evaluates a literal is refused with its name (safe_config.py).
"""
import argparse
import collections
import functools
import pickle
import re
import typing
import zipfile
from pathlib import Path

import omegaconf
import torch
from fairseq import checkpoint_utils
from fairseq.distributed.utils import _TensorPlaceholder
from fairseq.file_io import PathManager
from omegaconf import base as omegaconf_base
from omegaconf import nodes as omegaconf_nodes

from . import safe_numpy
from .safe_config import MAX_DEPTH, UnsafeConfigError, unsafe_fields

FAIRSEQ_CHECKPOINT_TYPES = [
    argparse.Namespace,
    *safe_numpy.SAFE_GLOBALS,
    omegaconf.DictConfig, omegaconf.ListConfig, omegaconf_base.Metadata, omegaconf_base.ContainerMetadata,
    omegaconf_nodes.AnyNode, omegaconf_nodes.StringNode, omegaconf_nodes.IntegerNode,
    omegaconf_nodes.FloatNode, omegaconf_nodes.BooleanNode, omegaconf_nodes.EnumNode,
    typing.Any, dict, list, int, collections.defaultdict,
    _TensorPlaceholder,
]


class CheckpointReadError(RuntimeError):
    """A checkpoint file that exists but cannot be read, or holds a type torch refuses."""


def _is_intact(path: Path) -> bool:
    """A torch archive with its central directory, or a legacy (pre-zip) pickle, which
    cannot be checked without reading it."""
    try:
        with open(path, "rb") as f:
            head = f.read(2)
    except OSError:
        return False
    return head[:1] == b"\x80" or zipfile.is_zipfile(path)


def _alternatives(path: Path) -> typing.List[Path]:
    """The readable checkpoints beside `path`: fairseq's numbered ones (checkpoint_E_U.pt,
    checkpointE.pt), latest first, then the others (best, last), newest first."""
    numbered, others = [], []
    for p in path.parent.glob("checkpoint*.pt"):
        if p == path or not _is_intact(p):
            continue
        match = re.fullmatch(r"checkpoint_?(\d+)(?:_(\d+))?\.pt", p.name)
        if match:
            updates = float("inf") if match[2] is None else int(match[2])
            numbered.append(((int(match[1]), updates), p))
        else:
            others.append((p.stat().st_mtime, p))
    return [p for _, p in sorted(numbered, reverse=True)] + [p for _, p in sorted(others, reverse=True)]


def unreadable_message(path) -> str:
    path = Path(path)
    size = path.stat().st_size if path.exists() else 0
    what = "is empty" if size == 0 else f"is truncated or corrupt ({size} bytes)"
    others = _alternatives(path)
    if others:
        where = "readable checkpoints there, latest first: " + ", ".join(p.name for p in others)
        example = str(others[0])
    else:
        where = f"no other readable checkpoint in {path.parent}"
        example = str(path.parent / "checkpoint_N_M.pt")
    return (f"cannot load checkpoint {path}: the file {what}, probably from an interrupted save. "
            f"Resume from another one with --restore-file {example} ({where}), or move {path.name} "
            "away to start from scratch.")


def _refused_message(path, error: Exception) -> str:
    return (f"torch refused to unpickle checkpoint {path} with weights_only=True: {error}\n"
            "fairseq_momentum allows the types fairseq itself saves. If you trust this file, allow "
            "the type named above with torch.serialization.add_safe_globals (e.g. in a --user-dir "
            "module), or load it once with TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1.")


def _is_weights_only_refusal(error: Exception) -> bool:
    return isinstance(error, pickle.UnpicklingError) and "Weights only load failed" in str(error)


def _too_deep(path) -> str:
    """Name the fields nested too deeply for fairseq's recursive config code: torch's unpickler and
    safe_config's walk do not recurse, so the raw state can be read and walked."""
    with open(path, "rb") as f:
        state = torch.load(f, map_location="cpu")
    fields = [where for key in ("args", "cfg") if isinstance(state, dict) and state.get(key) is not None
              for where, _, rule in unsafe_fields(state[key], key) if rule.startswith("nested")]
    where = ", ".join(fields) or "its config"
    return (f"refusing a config nested deeper than {MAX_DEPTH} levels, at {where}; "
            "fairseq's config code recurses and would stop with a RecursionError")


def checked_loader(load):
    """Wrap fairseq's `load_checkpoint_to_cpu(path, ...)` so a failure names the file."""

    @functools.wraps(load)
    def load_checkpoint_to_cpu(path, *args, **kwargs):
        try:
            return load(path, *args, **kwargs)
        except (FileNotFoundError, PermissionError):
            raise
        except RecursionError:
            raise UnsafeConfigError(f"checkpoint {path}: {_too_deep(path)}") from None
        except UnsafeConfigError as error:
            # The config check (safe_config) sees the state, not the file: name it here.
            raise UnsafeConfigError(f"checkpoint {path}: {error}") from None
        except Exception as error:
            local = Path(path)
            if local.is_file() and (not _is_intact(local) or isinstance(error, EOFError)):
                raise CheckpointReadError(unreadable_message(local)) from error
            if _is_weights_only_refusal(error):
                raise CheckpointReadError(_refused_message(path, error)) from error
            raise

    load_checkpoint_to_cpu.checks_checkpoints = True
    return load_checkpoint_to_cpu


def _plain_number_saver(save):
    @functools.wraps(save)
    def torch_persistent_save(obj, *args, **kwargs):
        return save(safe_numpy.plain_numbers(obj), *args, **kwargs)

    torch_persistent_save.plain_numbers = True
    return torch_persistent_save


class AtomicCopyPathManager(PathManager):
    """fairseq's PathManager, whose `copy` writes a temporary file beside the destination and renames
    it over it. fairseq saves a checkpoint atomically, then copies it onto checkpoint_best.pt,
    checkpoint_last.pt and the others: an interrupt during that copy (Ctrl-C, SIGTERM) left a
    truncated checkpoint_best.pt in place of the previous best."""

    @staticmethod
    def copy(src_path: str, dst_path: str, overwrite: bool = False) -> bool:
        if not PathManager.supports_rename(dst_path):
            return PathManager.copy(src_path, dst_path, overwrite=overwrite)
        temporary = f"{dst_path}.tmp"
        copied = PathManager.copy(src_path, temporary, overwrite=True)
        PathManager.rename(temporary, dst_path)
        return copied


def install() -> None:
    """Allowlist fairseq's checkpoint types and wrap its loader (once per process: the user-dir
    may be imported both as a package and through --user-dir)."""
    torch.serialization.add_safe_globals(FAIRSEQ_CHECKPOINT_TYPES)
    safe_numpy.install()
    if not getattr(checkpoint_utils.torch_persistent_save, "plain_numbers", False):
        checkpoint_utils.torch_persistent_save = _plain_number_saver(checkpoint_utils.torch_persistent_save)
    checkpoint_utils.PathManager = AtomicCopyPathManager
    if not getattr(checkpoint_utils.load_checkpoint_to_cpu, "checks_checkpoints", False):
        checkpoint_utils.load_checkpoint_to_cpu = checked_loader(checkpoint_utils.load_checkpoint_to_cpu)

