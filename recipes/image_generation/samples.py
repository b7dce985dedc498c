"""Grids of sampled images written as PNG (as the Momentum Transformer's Figure 3 shows samples
per model). PIL, which matplotlib depends on, writes the file losslessly: one PNG pixel per
image pixel (times `scale`), levels unchanged."""
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from recipes.image_generation.data import sequences_to_images


def image_grid(images: torch.Tensor, columns: int = 8, padding: int = 2, pad_value: int = 255,
               scale: int = 1) -> np.ndarray:
    """(N, H, W, C) levels → one (rows·(H·scale + padding) + padding,
    columns·(W·scale + padding) + padding, C) uint8 array, images in row-major order, each
    enlarged `scale` times by pixel repetition and separated by `padding` pixels of pad_value;
    unused cells of the last row are pad_value."""
    for value, name, low in ((columns, "columns", 1), (padding, "padding", 0), (scale, "scale", 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    if isinstance(pad_value, bool) or not isinstance(pad_value, int) or not 0 <= pad_value <= 255:
        raise ValueError(f"pad_value must be an integer in [0, 255], got {pad_value!r}")
    if not isinstance(images, torch.Tensor) or images.dim() != 4 or images.shape[0] == 0 \
            or images.shape[-1] not in (1, 3):
        found = tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
        raise ValueError(f"images must be a tensor (N >= 1, H, W, C in {{1, 3}}), got {found}")
    if images.is_floating_point() or bool(((images < 0) | (images > 255)).any()):
        raise ValueError("images must hold integer levels in [0, 255]")
    pixels = images.to(torch.uint8).cpu().numpy()
    pixels = pixels.repeat(scale, axis=1).repeat(scale, axis=2)
    n, height, width, channels = pixels.shape
    columns = min(columns, n)
    rows = -(-n // columns)
    grid = np.full((rows * (height + padding) + padding, columns * (width + padding) + padding, channels),
                   pad_value, dtype=np.uint8)
    for i in range(n):
        top = padding + (i // columns) * (height + padding)
        left = padding + (i % columns) * (width + padding)
        grid[top:top + height, left:left + width] = pixels[i]
    return grid


def save_sample_grid(sequences: torch.Tensor, path: Path, height: int, width: int, channels: int,
                     columns: int = 8, padding: int = 2, scale: int = 1) -> Path:
    """Write sampled pixel sequences (N, H·W·C) as one PNG grid; returns the path."""
    grid = image_grid(sequences_to_images(sequences, height, width, channels), columns=columns,
                      padding=padding, scale=scale)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(grid[..., 0] if channels == 1 else grid).save(path, format="PNG")  # mode L or RGB
    return path
