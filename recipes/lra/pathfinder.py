"""Pathfinder (Linsley et al. 2018; LRA's 32×32 task): are the two marked dots on one path?

The generator (numpy only) draws curved dashed paths on a `size`×`size` uint8 image: two main
paths of `contour_length` dashes and `n_distractors` paths of `distractor_length` dashes. A path
has a random heading; each dash is `dash_length` pixels long and turns by a uniform angle of at
most `max_turn_degrees` from the previous one; consecutive dashes are `gap` pixels apart along
the heading. The shape is then placed by a random integer shift among those that keep it inside
the image and away from the paths already drawn (a new shape is drawn when none does). Two 3×3
markers sit on path ends: both ends of the first main path (label 1), or one end of each main
path (label 0), so both classes hold the same number and kinds of paths. Labels alternate with
the sample index (exact balance); sample `i` of seed `s` is drawn from its own
`np.random.default_rng([s, i])`, so it does not depend on how many samples are drawn.

Why a label is what the pixels show: a path's pixels are the rounded points of its polyline
sampled every 1/4 pixel, so a dash is 8-connected and, as the gap is at most 2 pixels, the last
pixel of a dash and the first of the next are at Chebyshev distance ≤ 2 (rounding is monotone
and commutes with integer shifts). Every pixel of a path (its gaps and, for the main paths, the
3×3 blocks of both ends included) is at Chebyshev distance ≥ SEPARATION = 3 from every pixel of
every other path. So linking the lit pixels that are at most 2 apart (a flood fill over 5×5
neighbourhoods) joins the dashes of a path and never two paths — which is how the tests check
the labels, while a plain 8-connected flood fill on the dashed image splits most paths.

The release's 32×32 sets (`curv_baseline`, `curv_contour_length_9`, `curv_contour_length_14`)
were drawn with drewlinsley/pathfinder: anti-aliased paddles of length 2 at twice the resolution,
contours of 6 / 9 / 14 paddles. Visible one-pixel gaps and the separation above need more room
per dash, so our difficulties are 6 / 8 / 10 dashes with 45° turns, distractors of a third of
that (at least 2 dashes), DISTRACTOR_DASHES // that many of them: the same task, not the same
image distribution. `load_release` reads the release's
`lra_release/pathfinder32/<difficulty>/{metadata/*.npy, imgs/*/sample_*.png}`.
"""
import math
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Tuple

import numpy as np

DIFFICULTIES = {"easy": "curv_baseline", "intermediate": "curv_contour_length_9",
                "hard": "curv_contour_length_14"}
CONTOUR_LENGTHS = {"easy": 6, "intermediate": 8, "hard": 10}   # dashes of a main path
DISTRACTOR_DASHES = 12
MARKER_RADIUS = 1                  # 3×3 markers
SEPARATION = 3                     # Chebyshev distance between pixels of different paths
STEP = 0.25                        # polyline sampling step, pixels


class Pathfinder(NamedTuple):
    images: np.ndarray   # (N, size, size) uint8, paths and markers 255, background 0
    labels: np.ndarray   # (N,) int64: 1 when the markers are on the same path
    markers: np.ndarray  # (N, 2, 2) int64 (row, column) of the two markers' centres


class Settings(NamedTuple):
    size: int = 32
    contour_length: int = 10
    distractor_length: int = 3
    n_distractors: int = 4
    dash_length: float = 2.0
    gap: float = 2.0
    max_turn_degrees: float = 45.0

    @classmethod
    def for_difficulty(cls, difficulty: str = "hard", **overrides) -> "Settings":
        """The main paths' dashes by difficulty, distractors of a third of that (at least 2)
        and DISTRACTOR_DASHES // that many of them."""
        if difficulty not in CONTOUR_LENGTHS:
            raise ValueError(f"difficulty must be one of {tuple(CONTOUR_LENGTHS)}, got {difficulty!r}")
        length = CONTOUR_LENGTHS[difficulty]
        distractor = max(2, length // 3)
        return cls(contour_length=length, distractor_length=distractor,
                   n_distractors=DISTRACTOR_DASHES // distractor)._replace(**overrides)

    def check(self) -> "Settings":
        for name in ("size", "contour_length", "distractor_length"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        if self.size < 8:
            raise ValueError(f"size must be at least 8, got {self.size}")
        if not isinstance(self.n_distractors, int) or self.n_distractors < 0:
            raise ValueError(f"n_distractors must be a non-negative integer, got {self.n_distractors!r}")
        if not 0 < self.dash_length:
            raise ValueError(f"dash_length must be positive, got {self.dash_length}")
        if not 0 < self.gap <= 2:
            raise ValueError(f"gap must be in (0, 2] pixels (larger gaps could not be told from the "
                             f"space between paths), got {self.gap}")
        if not 0 <= self.max_turn_degrees <= 90:
            raise ValueError(f"max_turn_degrees must be in [0, 90], got {self.max_turn_degrees}")
        return self


def round_points(points: np.ndarray) -> np.ndarray:
    """Pixels (row, column) of continuous points: round half up (monotone, commutes with integer
    shifts)."""
    return np.floor(points + 0.5).astype(np.int64)


def block(centre: np.ndarray, radius: int) -> np.ndarray:
    """(k, 2) pixels of the square of half-side `radius` around `centre`."""
    offsets = np.arange(-radius, radius + 1)
    rows, cols = np.meshgrid(offsets, offsets, indexing="ij")
    return centre + np.stack([rows.ravel(), cols.ravel()], axis=1)


def dilate(mask: np.ndarray, radius: int) -> np.ndarray:
    """Pixels within Chebyshev distance `radius` of the mask."""
    padded = np.pad(mask, radius)
    out = np.zeros_like(mask)
    size = mask.shape[0]
    for dr in range(2 * radius + 1):
        for dc in range(2 * radius + 1):
            out |= padded[dr:dr + size, dc:dc + size]
    return out


class DashedPath(NamedTuple):
    dashes: np.ndarray     # (k, 2) lit pixels
    footprint: np.ndarray  # (m, 2) pixels kept apart from other paths (gaps and end blocks too)
    ends: np.ndarray       # (2, 2) first and last pixel


def path_shape(rng: np.random.Generator, n_dashes: int, settings: Settings,
               with_ends: bool) -> Optional[DashedPath]:
    """A dashed path's pixels near the origin: random heading, turns uniform in ±max_turn. Each
    dash and gap is sampled every STEP pixels (or finer), so a dash's pixels are 8-connected.
    None when the shape is too large for the image."""
    max_turn = math.radians(settings.max_turn_degrees)
    phase = rng.uniform(0.0, 1.0, size=2)             # the sub-pixel phase of the rasterisation
    turns = rng.uniform(-max_turn, max_turn, size=n_dashes)
    turns[0] = rng.uniform(0.0, 2 * math.pi)
    headings = np.cumsum(turns)
    directions = np.stack([np.sin(headings), np.cos(headings)], axis=1)
    period = settings.dash_length + settings.gap
    starts = phase + np.concatenate([np.zeros((1, 2)), np.cumsum(period * directions[:-1], axis=0)])
    steps = int(math.ceil(max(settings.dash_length, settings.gap) / STEP))
    t = np.linspace(0.0, 1.0, steps + 1)[None, :, None]
    dash_points = starts[:, None] + t * (settings.dash_length * directions[:, None])
    gap_points = dash_points[:-1, -1:] + t * (settings.gap * directions[:-1, None])
    dashes = round_points(dash_points.reshape(-1, 2))
    footprint = [dashes, round_points(gap_points.reshape(-1, 2))]
    room = settings.size - 2 * MARKER_RADIUS - (2 * MARKER_RADIUS if with_ends else 0)
    if np.ptp(np.concatenate(footprint), axis=0).max() >= room:
        return None
    ends = np.stack([dashes[0], dashes[-1]])
    if with_ends:
        footprint.extend(block(e, MARKER_RADIUS) for e in ends)
    return DashedPath(dashes, np.unique(np.concatenate(footprint), axis=0), ends)


def place(rng: np.random.Generator, shape: DashedPath, forbidden: np.ndarray) -> Optional[DashedPath]:
    """The shape moved by a random integer shift that keeps its footprint inside the image (one
    pixel from the border, room for the markers) and off `forbidden`; None if no shift does.
    Rounding commutes with integer shifts, so the moved pixels are those of the moved polyline."""
    size = forbidden.shape[0]
    low = MARKER_RADIUS - shape.footprint.min(axis=0)
    high = size - 1 - MARKER_RADIUS - shape.footprint.max(axis=0)
    if np.any(high < low):
        return None
    rows, cols = np.meshgrid(np.arange(low[0], high[0] + 1), np.arange(low[1], high[1] + 1), indexing="ij")
    shifts = np.stack([rows.ravel(), cols.ravel()], axis=1)
    moved = shape.footprint[None] + shifts[:, None]
    free = ~forbidden[moved[..., 0], moved[..., 1]].any(axis=1)
    if not free.any():
        return None
    shift = shifts[rng.choice(np.flatnonzero(free))]
    return DashedPath(shape.dashes + shift, shape.footprint + shift, shape.ends + shift)


def draw_path(rng: np.random.Generator, n_dashes: int, forbidden: np.ndarray, settings: Settings,
              with_ends: bool, tries: int = 20) -> Optional[DashedPath]:
    """A dashed path placed off `forbidden`, or None after `tries` shapes."""
    for _ in range(tries):
        shape = path_shape(rng, n_dashes, settings, with_ends)
        placed = None if shape is None else place(rng, shape, forbidden)
        if placed is not None:
            return placed
    return None


def draw_sample(rng: np.random.Generator, label: int, settings: Settings,
                tries: int = 200) -> Tuple[np.ndarray, np.ndarray]:
    """(image, markers) of one sample with the given label."""
    size = settings.size
    for _ in range(tries):
        forbidden = np.zeros((size, size), dtype=bool)
        paths: List[DashedPath] = []
        lengths = [settings.contour_length] * 2 + [settings.distractor_length] * settings.n_distractors
        for i, n_dashes in enumerate(lengths):
            path = draw_path(rng, n_dashes, forbidden, settings, with_ends=i < 2)
            if path is None:
                break
            paths.append(path)
            occupied = np.zeros_like(forbidden)
            occupied[path.footprint[:, 0], path.footprint[:, 1]] = True
            forbidden |= dilate(occupied, SEPARATION - 1)
        if len(paths) < len(lengths):
            continue
        image = np.zeros((size, size), dtype=np.uint8)
        for path in paths:
            image[path.dashes[:, 0], path.dashes[:, 1]] = 255
        first_end = rng.integers(2)
        other = paths[0].ends[1 - first_end] if label else paths[1].ends[rng.integers(2)]
        markers = np.stack([paths[0].ends[first_end], other])
        for centre in markers:
            pixels = block(centre, MARKER_RADIUS)
            image[pixels[:, 0], pixels[:, 1]] = 255
        return image, markers
    raise RuntimeError(f"could not fit the paths of {settings} in {tries} tries: fewer or shorter paths, "
                       "or a larger size")


def generate(n: int, seed: int, settings: Settings = Settings(), start: int = 0) -> Pathfinder:
    """Samples start .. start + n - 1 of `seed`; sample i has label i % 2."""
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative integer, got {n!r}")
    if not isinstance(start, int) or start < 0:
        raise ValueError(f"start must be a non-negative integer, got {start!r}")
    settings = settings.check()
    images = np.zeros((n, settings.size, settings.size), dtype=np.uint8)
    labels = np.arange(start, start + n, dtype=np.int64) % 2
    markers = np.zeros((n, 2, 2), dtype=np.int64)
    for i in range(n):
        rng = np.random.default_rng([seed, start + i])
        images[i], markers[i] = draw_sample(rng, int(labels[i]), settings)
    return Pathfinder(images, labels, markers)


def save_npz(path: Path, data: Pathfinder) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, images=data.images, labels=data.labels, markers=data.markers)
    return path


def load_npz(path: Path) -> Pathfinder:
    with np.load(Path(path)) as f:
        missing = [k for k in Pathfinder._fields if k not in f]
        if missing:
            raise ValueError(f"{path}: not a Pathfinder file of ours, missing arrays {missing}")
        return Pathfinder(*(f[k] for k in Pathfinder._fields))


def release_dir(root: Path, difficulty: str = "hard") -> Path:
    """`root` is the release's `pathfinder32` folder or one of its difficulty folders."""
    if difficulty not in DIFFICULTIES:
        raise ValueError(f"difficulty must be one of {tuple(DIFFICULTIES)}, got {difficulty!r}")
    root = Path(root)
    for candidate in (root / DIFFICULTIES[difficulty], root):
        if (candidate / "metadata").is_dir():
            return candidate
    raise FileNotFoundError(
        f"no metadata/ folder in {root} or {root / DIFFICULTIES[difficulty]}: expected the release's "
        "lra_release/pathfinder32 (https://storage.googleapis.com/long-range-arena/lra_release.gz)")


def read_release_metadata(folder: Path) -> List[Tuple[Path, int]]:
    """(image path, label) per metadata line, files in numeric order. Each `metadata/<k>.npy` is a
    text file (despite its name) of lines `<image folder> <file name> <index> <label> …`."""
    files = sorted((folder / "metadata").glob("*.npy"),
                   key=lambda p: (0, int(p.stem)) if p.stem.isdigit() else (1, p.stem))
    if not files:
        raise FileNotFoundError(f"no metadata/*.npy in {folder}")
    entries = []
    for file in files:
        for number, line in enumerate(file.read_text().splitlines(), start=1):
            fields = line.split()
            if not fields:
                continue
            if len(fields) < 4 or fields[3] not in ("0", "1"):
                raise ValueError(f"{file}:{number}: expected '<folder> <file> <index> <label 0/1> …', "
                                 f"got {line!r}")
            entries.append((folder / fields[0] / fields[1], int(fields[3])))
    return entries


def load_release(root: Path, difficulty: str = "hard", size: int = 32) -> Tuple[Pathfinder, int]:
    """The release's images (grayscale uint8) and labels, in metadata order, and the number of
    empty image files skipped (the release's input pipeline drops them too). Markers are unknown
    in the release: their entries are -1."""
    from PIL import Image

    entries = read_release_metadata(release_dir(root, difficulty))
    images, labels, skipped = [], [], 0
    for path, label in entries:
        if not path.exists():
            raise FileNotFoundError(f"{path} is listed in the metadata but missing")
        if path.stat().st_size == 0:
            skipped += 1
            continue
        with Image.open(path) as image:
            pixels = np.asarray(image.convert("L"), dtype=np.uint8)
        if pixels.shape != (size, size):
            raise ValueError(f"{path}: expected a {size}×{size} image, got {pixels.shape}")
        images.append(pixels)
        labels.append(label)
    markers = np.full((len(labels), 2, 2), -1, dtype=np.int64)
    return Pathfinder(np.stack(images) if images else np.zeros((0, size, size), np.uint8),
                      np.array(labels, dtype=np.int64), markers), skipped


def release_splits(data: Pathfinder) -> Dict[str, Pathfinder]:
    """The release pipeline's split: first 80 % train, next 10 % val, last 10 % test."""
    n = len(data.labels)
    bounds = {"train": (0, n * 8 // 10), "val": (n * 8 // 10, n * 9 // 10), "test": (n * 9 // 10, n)}
    return {name: Pathfinder(*(a[lo:hi] for a in data)) for name, (lo, hi) in bounds.items()}
