"""numpy values in a fairseq checkpoint: a dtype or array whose pickled state hides object fields is
refused with the file's name, in a fresh process that must not crash (issue 28: SIGSEGV), while the
numeric scalars and arrays fairseq writes still load with their values."""
import re
import subprocess
import sys
import textwrap
import unittest.mock

import numpy as np
import torch
from helpers.fairseq_cli import REPO, cli_env

HASOBJECT = 1       # numpy's NPY_ITEM_HASOBJECT flag in a pickled dtype state


class Dtype:
    def __init__(self, spec, order="<", subarray=None, names=None, fields=None, flags=0):
        self.args = (spec, False, True)
        self.state = (3, order, subarray, names, fields, -1, -1, flags)

    def __reduce__(self):
        return np.dtype, self.args, self.state


class Array:
    def __init__(self, dtype, data, shape=(1,)):
        self.dtype, self.data, self.shape = dtype, data, shape

    def __reduce__(self):
        return (np.core.multiarray._reconstruct, (np.ndarray, (0,), b"b"),
                (1, self.shape, self.dtype, False, self.data))


class Scalar:
    def __init__(self, dtype, data):
        self.dtype, self.data = dtype, data

    def __reduce__(self):
        return np.core.multiarray.scalar, (self.dtype, self.data)


POINTER = b"\x41" * 8
GADGETS = {
    "array_int64_flagged_object": Array(Dtype("i8", flags=HASOBJECT), POINTER),
    "scalar_int64_flagged_object": Scalar(Dtype("i8", flags=HASOBJECT), POINTER),
    "array_object_dtype": Array(Dtype("O", order="|", flags=63), POINTER),
    "scalar_object_dtype": Scalar(Dtype("O", order="|", flags=63), POINTER),
    "array_structured_with_object_field": Array(
        Dtype("V8", order="|", names=("a",), fields={"a": (np.dtype("O"), 0)}, flags=HASOBJECT), POINTER),
    "array_subarray": Array(Dtype("V8", order="|", subarray=(np.dtype("i4"), (2,))), POINTER),
    "array_bytes_shorter_than_shape": Array(Dtype("f8"), b"\0" * 8, shape=(1000,)),
}

LOAD = """
import sys
from fairseq import checkpoint_utils
import fairseq_momentum
from fairseq_momentum.checkpoints import CheckpointReadError
for path in sys.argv[1:]:
    try:
        state = checkpoint_utils.load_checkpoint_to_cpu(path)
        print("loaded", state["extra_state"]["epoch"] + 1)
    except CheckpointReadError as error:
        print("refused:", error)
    print("done", path, flush=True)
"""


def test_each_numpy_gadget_is_refused_with_the_file_name_and_no_crash(tmp_path):
    """One fresh process loads every gadget in turn (a crash stops it: the output names the file
    it was loading), each refused with its file's name (one process: fairseq's import takes ~10 s)."""
    paths = [tmp_path / f"{name}.pt" for name in sorted(GADGETS)]
    for path in paths:
        checkpoint = {"model": {}, "args": None, "cfg": None, "extra_state": {"epoch": GADGETS[path.stem]}}
        torch.save(checkpoint, path)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(LOAD), *map(str, paths)], text=True,
                          capture_output=True, cwd=REPO, env=cli_env(PYTHONPATH=str(REPO)), timeout=300)
    assert proc.returncode == 0, f"rc={proc.returncode} after {proc.stdout[-300:]}: {proc.stderr[-2000:]}"
    reports = re.split(r"^done .*$", proc.stdout, flags=re.M)
    assert len(reports) == len(paths) + 1, proc.stdout[-2000:]
    for path, report in zip(paths, reports):
        assert "refused:" in report and str(path) in report, f"{path.stem}: {report[-1000:]}"
        assert "only plain numeric dtypes" in report, f"{path.stem}: {report[-1000:]}"


def test_numeric_scalars_and_arrays_fairseq_writes_still_load(tmp_path):
    import fairseq_momentum  # noqa: F401
    values = {"best_loss": np.float64(2.5), "epoch": np.int64(4), "flag": np.bool_(True),
              "bleu_counts": np.array([[3, 1], [2, 7]], dtype=np.int64),
              "swapped": np.array([1.5, -2.0], dtype=">f4"), "fortran": np.asfortranarray(np.ones((2, 3)))}
    path = tmp_path / "checkpoint1.pt"
    with open(path, "wb") as f:
        torch.save({"model": {}, "args": None, "cfg": None, "extra_state": values}, f)
    loaded = torch.load(path)["extra_state"]
    for key, value in values.items():
        assert np.asarray(loaded[key]).dtype == np.asarray(value).dtype.newbyteorder("="), key
        np.testing.assert_array_equal(np.asarray(loaded[key]), value)
    resaved = tmp_path / "again.pt"
    torch.save(loaded, resaved)
    np.testing.assert_array_equal(torch.load(resaved)["bleu_counts"], values["bleu_counts"])


def test_new_checkpoints_store_numpy_scalars_as_python_numbers(tmp_path):
    from fairseq import checkpoint_utils

    import fairseq_momentum  # noqa: F401
    path = tmp_path / "checkpoint_last.pt"
    checkpoint_utils.torch_persistent_save({"extra_state": {"best": np.float32(1.25), "n": [np.int64(3)]}},
                                           str(path))
    with torch.serialization.safe_globals([]):
        state = torch.load(path)
    assert type(state["extra_state"]["best"]) is float and state["extra_state"]["best"] == 1.25
    assert type(state["extra_state"]["n"][0]) is int



class MetLast(set):
    """An allowlist set that torch's unpickler iterates with the entries in `last` at the end: for
    a name listed twice, the entry torch meets last is the one it uses."""

    def __init__(self, entries, last):
        super().__init__(entries)
        self.order = [e for e in entries if e not in last] + [e for e in entries if e in last]

    def __iter__(self):
        return iter(self.order)


def test_the_trainers_rng_state_loads_whichever_entry_torch_meets_last(tmp_path):
    """After `import fairseq_momentum`, transformers' Trainer resumes: its rng_state.pth (numpy's
    MT19937 state, a uint32 array) loads under the Trainer's own safe_globals (numpy's
    `_reconstruct`, `ndarray` and `dtype`), whichever of those torch meets after our stand-ins for
    the same names. In the full suite a Trainer resume failed in a process that had imported
    fairseq_momentum: torch keeps the allowlist in a set, and met numpy's ndarray and _reconstruct
    after ours but our dtype after numpy's."""
    import itertools
    import random

    import torch._weights_only_unpickler as unpickler
    from transformers.trainer_pt_utils import safe_globals

    import fairseq_momentum  # noqa: F401
    path = tmp_path / "rng_state.pth"
    state = np.random.get_state()
    torch.save({"python": random.getstate(), "numpy": state, "cpu": torch.random.get_rng_state()}, path)
    numpy_own = [np.core.multiarray._reconstruct, np.ndarray, np.dtype]
    for count in range(len(numpy_own) + 1):
        for last in itertools.combinations(numpy_own, count):
            with safe_globals():
                entries = list(unpickler._marked_safe_globals_set)
                ordered = MetLast(entries, last)
                with unittest.mock.patch.object(unpickler, "_marked_safe_globals_set", ordered):
                    loaded = torch.load(path, weights_only=True)
            np.testing.assert_array_equal(loaded["numpy"][1], state[1])
            np.random.set_state(loaded["numpy"])
            assert np.random.get_state()[2] == state[2]
            assert type(loaded["numpy"][1]).__name__ == "CheckedArray", "the stand-ins read it"
