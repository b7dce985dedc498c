"""python -m recipes.image_generation.run end to end on a few images, and its cache."""
import csv

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
