"""recipes/hf/train_clm.py on `datasets` input: --dataset_from_disk (save_to_disk) and
--dataset_name (a local folder of json files, offline). The blocks and documents it trains on are
those cut from the raw texts here (UTF-8 bytes + 3, one end-of-sequence id 1 per row); the
dataset's "validation" split is used when it has one; a second run reads the Dataset.map cache
files the first one wrote; the sources and the text column are checked."""
import json
import math
import random
import sys

import pytest
from helpers.train_clm import SCRIPT, TINY, load_script, records, run

datasets = pytest.importorskip("datasets")
BLOCK = 32
WORDS = ["momentum", "attention", "linear", "state", "token", "heavy", "ball", "step", "gradient", "é✓"]


def texts(seed, n):
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 15))) for _ in range(n)]


def ids_of(text):
    return [b + 3 for b in text.encode("utf-8")] + [1]


def expected_blocks(rows):
    ids = [token for text in rows for token in ids_of(text)]
    return [ids[i:i + BLOCK] for i in range(0, len(ids) // BLOCK * BLOCK, BLOCK)]


def expected_documents(rows):
    pieces = [ids_of(text)[i:i + BLOCK] for text in rows for i in range(0, len(ids_of(text)), BLOCK)]
    return [piece for piece in pieces if len(piece) > 1]


def saved_dataset(folder, rows, **extra):
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": rows, **extra})}).save_to_disk(folder)
    return folder


def json_folder(folder, splits):
    folder.mkdir()
    for split, rows in splits.items():
        (folder / f"{split}.json").write_text("".join(json.dumps({"id": i, "body": text}) + "\n"
                                                      for i, text in enumerate(rows)))
    return folder


def rows_of(loader):
    return [list(row["input_ids"]) for row in loader.dataset]


def test_from_disk_blocks_are_the_texts_blocks_and_validation_is_held_out(tmp_path):
    script = load_script()
    rows = texts(0, 150)
    folder = saved_dataset(tmp_path / "data", rows, label=list(range(150)))
    args = script.parse_args(["--dataset_from_disk", str(folder), "--output_dir", "o", *TINY])
    train, valid = script.loaders(args, script.Tokenizer("bytes"))
    blocks = expected_blocks(rows)
    assert len(blocks) > 20
    assert sorted(rows_of(train) + rows_of(valid)) == sorted(blocks)
    assert len(rows_of(valid)) == math.ceil(0.05 * len(blocks))
    batch = next(iter(train))
    assert batch["input_ids"].shape == (2, BLOCK) and batch["labels"].equal(batch["input_ids"])


def test_packing_documents_are_the_rows(tmp_path):
    script = load_script()
    rows = texts(1, 80) + ["x", "momentum " * 10]     # a one-token piece is dropped, a long row is cut
    folder = saved_dataset(tmp_path / "data", rows)
    args = script.parse_args(["--dataset_from_disk", str(folder), "--packing", "--output_dir", "o", *TINY])
    train, valid = script.loaders(args, script.Tokenizer("bytes"))
    assert sorted(rows_of(train) + rows_of(valid)) == sorted(expected_documents(rows))
    batch = next(iter(train))
    assert batch["input_ids"].shape[0] == 1 and script.samples(batch) == 2


def test_dataset_name_local_json_folder_uses_its_validation_split(tmp_path):
    script = load_script()
    train_rows, valid_rows = texts(2, 120), texts(3, 40)
    folder = json_folder(tmp_path / "json", {"train": train_rows, "validation": valid_rows})
    args = script.parse_args(["--dataset_name", str(folder), "--text_column", "body", "--cache_dir",
                              str(tmp_path / "cache"), "--output_dir", "o", *TINY])
    train, valid = script.loaders(args, script.Tokenizer("bytes"))
    assert rows_of(valid) == expected_blocks(valid_rows)
    assert sorted(rows_of(train)) == sorted(expected_blocks(train_rows))
    assert all(name.startswith(str(tmp_path / "cache")) for name in
               (f["filename"] for f in train.dataset.cache_files))


def test_training_from_disk_then_a_second_run_reads_the_map_cache(tmp_path):
    """The first run writes the tokenized and grouped dataset as cache files beside the saved one;
    the second run (another process) trains on the same batches and writes no cache file."""
    rows = texts(4, 150)
    folder = saved_dataset(tmp_path / "data", rows)
    assert not list(folder.rglob("cache-*.arrow"))
    command = [sys.executable, str(SCRIPT), "--dataset_from_disk", str(folder), "--max_train_steps", "2",
               *TINY]
    env = {"HF_DATASETS_OFFLINE": "1"}
    run([*command, "--output_dir", str(tmp_path / "a"), "--record_dir", str(tmp_path / "ra")], tmp_path, env)
    written = {path: path.stat().st_mtime_ns for path in folder.rglob("cache-*.arrow")}
    first = records(tmp_path / "ra")[0]
    assert first["train_rows"] + first["valid_rows"] == len(expected_blocks(rows))
    assert first["cache_files"] and {str(p) for p in written} >= set(first["cache_files"])
    run([*command, "--output_dir", str(tmp_path / "b"), "--record_dir", str(tmp_path / "rb")], tmp_path, env)
    second = records(tmp_path / "rb")[0]
    assert {path: path.stat().st_mtime_ns for path in folder.rglob("cache-*.arrow")} == written
    assert second["cache_files"] == first["cache_files"] and second["batches"] == first["batches"]
    assert (tmp_path / "b" / "final" / "model.safetensors").exists()


def test_training_on_a_local_json_dataset_offline(tmp_path):
    folder = json_folder(tmp_path / "json", {"train": texts(5, 150)})
    proc = run([sys.executable, str(SCRIPT), "--dataset_name", str(folder), "--text_column", "body",
                "--cache_dir", str(tmp_path / "cache"), "--max_train_steps", "2", "--output_dir",
                str(tmp_path / "out"), "--record_dir", str(tmp_path / "rec"), *TINY], tmp_path,
               {"HF_DATASETS_OFFLINE": "1"})
    assert json.loads(proc.stdout.strip().splitlines()[-1])["step"] == 2
    record = records(tmp_path / "rec")[0]
    assert record["train_rows"] + record["valid_rows"] == len(expected_blocks(texts(5, 150)))
    assert all(name.startswith(str(tmp_path / "cache")) for name in record["cache_files"])


@pytest.mark.parametrize("sources,message", [
    ([], "give exactly one of --train_file, --dataset_name, --dataset_from_disk"),
    (["--train_file", "a.txt", "--dataset_name", "d"], "(got --train_file and --dataset_name)"),
    (["--dataset_name", "d", "--validation_file", "v.txt"],
     "argument --validation_file: goes with --train_file"),
    (["--train_file", "a.txt", "--dataset_config_name", "c"], "argument --dataset_config_name: goes with"),
    (["--dataset_from_disk", "no/such/folder"],
     "argument --dataset_from_disk: no/such/folder is not a folder"),
])
def test_the_training_source_is_checked_at_parsing(sources, message, capsys):
    with pytest.raises(SystemExit):
        load_script().parse_args([*sources, "--output_dir", "o"])
    assert message in capsys.readouterr().err


def test_a_missing_text_column_is_named_with_the_columns(tmp_path):
    script = load_script()
    folder = saved_dataset(tmp_path / "data", texts(6, 10), label=list(range(10)))
    args = script.parse_args(["--dataset_from_disk", str(folder), "--text_column", "content",
                              "--output_dir", "o"])
    with pytest.raises(ValueError, match=r"--text_column content: .* has no such column "
                                         r"\(its columns: text, label\)"):
        script.loaders(args, script.Tokenizer("bytes"))


def test_help_shows_the_dataset_arguments_with_defaults(capsys):
    with pytest.raises(SystemExit):
        load_script().parse_args(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--text_column TEXT_COLUMN the dataset column holding the text (default: text)" in help_text
    assert "--dataset_from_disk DATASET_FROM_DISK a dataset folder written by save_to_disk (default: None)" \
        in help_text
