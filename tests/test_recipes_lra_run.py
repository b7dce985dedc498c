"""python -m recipes.lra.run end to end on two tiny tasks, two models, one seed; its caches; the
results table's paper column and substitute names."""
import csv
import json
from dataclasses import replace

import pytest

from recipes.lra import run, tasks
from recipes.lra.tasks import TaskInfo

ARGS = ["--tasks", "listops", "pathfinder", "--models", "softmax", "momentum", "--seeds", "1", "--steps", "4",
        "--eval-every", "2", "--threads", "1", "--no-progress"]


@pytest.fixture
def tiny_tasks(monkeypatch):
    small = tasks.SMALL
    monkeypatch.setitem(small, "listops", replace(small["listops"], length=24, n_train=16, n_val=8, n_test=8,
                                                  max_depth=3, min_length=3))
    monkeypatch.setitem(small, "pathfinder", replace(small["pathfinder"], n_train=8, n_val=4, n_test=4))


def test_run_writes_its_table_and_curves_and_reuses_its_caches(tmp_path, monkeypatch, tiny_tasks, capsys):
    run.main(ARGS + ["--out-dir", str(tmp_path)])
    results = (tmp_path / "results.md").read_text()
    assert "ListOps: ours / Table 4" in results and "Pathfinder: ours / Table 4" in results
    assert "/ 37.10 |" in results and "/ 73.12 |" in results      # softmax ListOps, momentum Pathfinder
    assert "| softmax | 1 |" in results and "| momentum | 1 |" in results
    assert "small (CPU minutes" in results and "4 steps of batch 32" in results
    assert "momentum vs softmax" in results
    with open(tmp_path / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["model"] for r in rows] == ["softmax", "momentum"]
    for row in rows:
        ours = float(row["ListOps: ours / Table 4"].split(" / ")[0])
        assert 0 <= ours <= 100
    with open(tmp_path / "curves.csv") as f:
        curves = list(csv.DictReader(f))
    assert [(c["task"], c["model"], c["step"]) for c in curves] == [
        (task, model, step) for task in ("listops", "pathfinder") for model in ("softmax", "momentum")
        for step in ("2", "4")]
    assert all(0 <= float(c["val_accuracy"]) <= 1 for c in curves)
    assert len(list((tmp_path / "data").glob("listops-*"))) == 1
    assert (tmp_path / "pathfinder_val_accuracy_vs_seconds.png").read_bytes()[:4] == b"\x89PNG"

    def no_training(*args, **kwargs):
        raise AssertionError("a cached run was trained again")

    def no_data(*args, **kwargs):
        raise AssertionError("a cached data set was built again")

    monkeypatch.setattr(run, "train_classifier", no_training)
    monkeypatch.setattr(tasks, "build_task", no_data)
    run.main(ARGS + ["--out-dir", str(tmp_path)])
    assert (tmp_path / "results.md").read_text() == results


def test_a_user_copy_of_the_data_replaces_the_generated_one(tmp_path, tiny_tasks):
    from recipes.lra import data
    data.main(["listops", "--out", str(tmp_path / "release"), "--n", "16", "--n-val", "4", "--n-test", "4",
               "--min-length", "3", "--max-length", "24", "--max-depth", "3", "--seed", "5"])
    run.main(["--tasks", "listops", "--models", "linear", "--seeds", "1", "--steps", "2", "--threads", "1",
              "--no-progress", "--listops-data", str(tmp_path / "release"),
              "--out-dir", str(tmp_path / "out")])
    results = (tmp_path / "out" / "results.md").read_text()
    assert "ListOps (LRA release files, cut at 24 tokens)" in results
    folder, = (tmp_path / "out" / "data").glob("listops-*")
    info, splits = tasks.load(folder)
    assert [len(splits[s][1]) for s in ("train", "val", "test")] == [16, 4, 4]


def test_substitutes_are_named_and_a_model_without_a_paper_number_shows_a_dash():
    info = TaskInfo(257, 6, 0, False, 512, "substitute for LRA Text (IMDB): …", True)
    result = {"test_accuracy": 0.5}
    runs = {"text": {"momentum_connection": [result, result], "adaptive": [result, result]}}
    headers, rows = run.results_table(runs, {"text": info}, ["momentum_connection", "adaptive"], [1, 2])
    assert headers[2] == "Text* (substitute): ours / Table 4"
    assert rows[0][2] == "50.0 ± 0.0 / —" and rows[1][2] == "50.0 ± 0.0 / 64.45"
    assert rows[1][3] == "50.0 ± 0.0 / 64.45"


@pytest.mark.parametrize("argv, flag", [(["--tasks", "cifar"], "--tasks"),
                                        (["--models", "performer"], "--models"),
                                        (["--seeds", "1", "1"], "--seeds"), (["--steps", "0"], "--steps")])
def test_bad_arguments_exit_with_the_flag_named(argv, flag, capsys):
    with pytest.raises(SystemExit):
        run.parse_args(argv)
    assert flag in capsys.readouterr().err


def test_layer_types_are_refused_at_parsing_and_key_their_own_runs(tmp_path, tiny_tasks, capsys):
    with pytest.raises(SystemExit):
        run.parse_args(["--layer-types", "full_attention"])
    assert "--layer-types has 1 entries but the model has 2 layers" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run.parse_args(["--layer-types", "full_attention,sliding_attention"])
    message = "must be one of linear_attention, full_attention, got 'sliding_attention'"
    assert message in capsys.readouterr().err
    tiny = ["--tasks", "listops", "--models", "momentum", "--seeds", "1", "--steps", "2", "--eval-every", "2",
            "--threads", "1", "--no-progress", "--out-dir", str(tmp_path)]
    run.main(tiny)
    run.main(tiny + ["--layer-types", "full_attention,linear_attention"])
    assert len(list((tmp_path / "runs").glob("listops-momentum-seed1-*"))) == 2
    recorded = json.loads((tmp_path / "config.json").read_text())
    assert recorded["models"]["listops"]["momentum"]["layer_types"] == ["full_attention", "linear_attention"]
    assert "layer types full_attention,linear_attention" in (tmp_path / "results.md").read_text()
