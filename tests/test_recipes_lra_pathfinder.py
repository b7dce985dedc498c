"""Pathfinder: labels against a flood fill written here, balance, seeds, the release's layout.

The flood fill links lit pixels at Chebyshev distance ≤ 2 (5×5 neighbourhoods): it bridges the
one-pixel gaps between dashes, and the generator keeps different paths ≥ 3 apart (see the
module's docstring), so the markers are in one component exactly when they are on one path.
"""
from collections import deque

import numpy as np
import pytest

from recipes.lra import pathfinder


def component(lit, start, reach):
    """Pixels reachable from `start` over lit pixels at Chebyshev distance ≤ reach."""
    size = lit.shape[0]
    seen = {tuple(start)}
    queue = deque([tuple(start)])
    while queue:
        r, c = queue.popleft()
        for dr in range(-reach, reach + 1):
            for dc in range(-reach, reach + 1):
                q = (r + dr, c + dc)
                if 0 <= q[0] < size and 0 <= q[1] < size and lit[q] and q not in seen:
                    seen.add(q)
                    queue.append(q)
    return seen


@pytest.fixture(scope="module")
def samples():
    return pathfinder.generate(40, seed=5, settings=pathfinder.Settings.for_difficulty("easy"))


def test_labels_match_a_flood_fill_that_bridges_the_dashes(samples):
    plain_connected = []
    for image, label, markers in zip(*samples):
        lit = image > 0
        for r, c in markers:
            assert lit[r - 1:r + 2, c - 1:c + 2].all()       # a full 3×3 marker
        reached = component(lit, markers[0], reach=2)
        assert (tuple(markers[1]) in reached) == bool(label)
        if label:
            plain_connected.append(tuple(markers[1]) in component(lit, markers[0], reach=1))
    assert not all(plain_connected)                  # the dashes do break 8-connectivity


def test_hard_samples_too():
    data = pathfinder.generate(6, seed=2, settings=pathfinder.Settings.for_difficulty("hard"))
    for image, label, markers in zip(*data):
        assert (tuple(markers[1]) in component(image > 0, markers[0], reach=2)) == bool(label)


def test_classes_are_balanced_and_samples_deterministic(samples):
    assert samples.labels.sum() == 20 and samples.images.shape == (40, 32, 32)
    assert samples.images.dtype == np.uint8 and set(np.unique(samples.images)) == {0, 255}
    again = pathfinder.generate(4, seed=5, settings=pathfinder.Settings.for_difficulty("easy"), start=10)
    assert np.array_equal(again.images, samples.images[10:14])
    assert np.array_equal(again.labels, samples.labels[10:14])
    other = pathfinder.generate(4, seed=6, settings=pathfinder.Settings.for_difficulty("easy"), start=10)
    assert not np.array_equal(other.images, again.images)
    positive, negative = samples.images[samples.labels == 1], samples.images[samples.labels == 0]
    ink = (positive > 0).mean(), (negative > 0).mean()
    assert abs(ink[0] - ink[1]) < 0.25 * max(ink)    # no class told apart by its amount of ink


def test_npz_round_trip(tmp_path, samples):
    loaded = pathfinder.load_npz(pathfinder.save_npz(tmp_path / "train.npz", samples))
    assert all(np.array_equal(a, b) for a, b in zip(loaded, samples))


def test_settings_are_checked():
    with pytest.raises(ValueError, match="gap must be in"):
        pathfinder.generate(1, 0, pathfinder.Settings(gap=3.0))
    with pytest.raises(ValueError, match="difficulty must be one of"):
        pathfinder.Settings.for_difficulty("medium")
    with pytest.raises(RuntimeError, match="could not fit"):
        pathfinder.draw_sample(np.random.default_rng(0), 1, pathfinder.Settings(contour_length=40), tries=2)


def test_release_layout_is_read(tmp_path):
    """lra_release/pathfinder32/curv_contour_length_14: text metadata named *.npy, PNGs, an empty file."""
    from PIL import Image

    root = tmp_path / "pathfinder32"
    folder = root / "curv_contour_length_14"
    rng = np.random.default_rng(0)
    pictures = rng.integers(0, 256, size=(3, 32, 32), dtype=np.uint8)
    (folder / "metadata").mkdir(parents=True)
    (folder / "imgs" / "0").mkdir(parents=True)
    lines = []
    for i, (picture, label) in enumerate(zip(pictures, (1, 0, 1))):
        Image.fromarray(np.stack([picture] * 3, axis=-1)).save(folder / "imgs" / "0" / f"sample_{i}.png")
        lines.append(f"imgs/0 sample_{i}.png {i} {label} 14 1.5 1 1.0 2 0.75")
    (folder / "imgs" / "0" / "sample_3.png").write_bytes(b"")
    lines.append("imgs/0 sample_3.png 3 0 14 1.5 1 1.0 2 0.75")
    (folder / "metadata" / "0.npy").write_text("\n".join(lines[:2]) + "\n")
    (folder / "metadata" / "10.npy").write_text("\n".join(lines[3:]) + "\n")
    (folder / "metadata" / "2.npy").write_text(lines[2] + "\n")
    data, skipped = pathfinder.load_release(root, "hard")
    assert skipped == 1
    assert data.labels.tolist() == [1, 0, 1]
    assert np.array_equal(data.images, pictures)     # grey RGB → its grey level
    with pytest.raises(FileNotFoundError, match="lra_release"):
        pathfinder.load_release(root, "easy")
