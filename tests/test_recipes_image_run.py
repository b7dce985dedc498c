"""python -m recipes.image_generation.run end to end on a few images, and its cache."""
import csv
import json

import pytest
from PIL import Image

from recipes.image_generation import run

ARGS = ["--models", "momentum", "linear", "--seeds", "1", "--epochs", "2", "--train-images", "8",
        "--test-images", "4", "--samples", "2", "--threads", "1", "--no-progress"]


def test_run_writes_the_table_curves_and_grids_and_reuses_its_runs(tmp_path, monkeypatch):
    run.main(ARGS + ["--out-dir", str(tmp_path)])
    table = (tmp_path / "results.md").read_text()
    assert "| momentum | 1 |" in table and "| 0.84 |" in table and "| linear | 1 |" in table
    with open(tmp_path / "curves.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["model"], r["epoch"]) for r in rows] == [("momentum", "1"), ("momentum", "2"),
                                                        ("linear", "1"), ("linear", "2")]
    assert all(0 < float(r["test_bits_per_dim"]) < 9 for r in rows)
    assert float(rows[1]["train_seconds"]) > float(rows[0]["train_seconds"])
    grid = Image.open(tmp_path / "samples_momentum.png")
    assert grid.size == (2 + 2 * (14 * 4 + 2), 2 + 14 * 4 + 2)
    for plot in ("epochs", "seconds"):
        assert (tmp_path / f"test_bits_per_dim_vs_{plot}.png").exists()

    def no_training(*args, **kwargs):
        raise AssertionError("a cached run was trained again")

    monkeypatch.setattr(run, "train_image_model", no_training)
    run.main(ARGS + ["--out-dir", str(tmp_path)])
    assert (tmp_path / "results.md").read_text() == table


def test_a_hybrid_run_is_cached_apart_from_the_plain_one(tmp_path, monkeypatch):
    tiny = ["--models", "momentum", "--epochs", "1", "--train-images", "4", "--test-images", "2",
            "--samples", "1", "--threads", "1", "--no-progress", "--out-dir", str(tmp_path)]
    run.main(tiny)
    trained, train = [], run.train_image_model

    def recorded_training(name, model_config, *args, **kwargs):
        trained.append(model_config)
        return train(name, model_config, *args, **kwargs)

    monkeypatch.setattr(run, "train_image_model", recorded_training)
    run.main(tiny + ["--layer-types", "full_attention,linear_attention"])
    assert [config.layer_types for config in trained] == [("full_attention", "linear_attention")]
    assert len(list((tmp_path / "runs").glob("momentum-seed1-*"))) == 2
    recorded = json.loads((tmp_path / "config.json").read_text())
    assert recorded["model"]["layer_types"] == ["full_attention", "linear_attention"]
    assert recorded["models"]["momentum"]["layer_types"] == ["full_attention", "linear_attention"]


def test_layer_types_are_refused_at_parsing(capsys):
    refusals = (("full_attention", "--layer-types has 1 entries but the model has 2 layers"),
                ("full_attention,mamba",
                 "--layer-types: each entry must be one of linear_attention, full_attention, got 'mamba'"))
    for text, message in refusals:
        with pytest.raises(SystemExit):
            run.parse_args(["--layer-types", text])
        assert message in capsys.readouterr().err
    assert run.parse_args(["--full", "--layer-types", ",".join(["full_attention"] * 8)]).layer_types
