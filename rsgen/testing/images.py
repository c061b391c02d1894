"""Small deterministic images for tests: coloured shapes on a grey background, different for every seed."""

from __future__ import annotations

import random

from PIL import Image, ImageDraw


def make_test_image(seed: int, size: tuple[int, int] = (96, 72)) -> Image.Image:
    """An RGB image of `size` (width, height) with a few coloured boxes and discs placed from `seed`."""
    rng = random.Random(seed)
    width, height = size
    image = Image.new("RGB", size, (rng.randrange(90, 170),) * 3)
    draw = ImageDraw.Draw(image)
    for _ in range(rng.randint(3, 7)):
        box_size = rng.randint(max(2, min(size) // 6), max(3, min(size) // 3))
        left, top = rng.randrange(max(1, width - box_size)), rng.randrange(max(1, height - box_size))
        colour = (rng.randrange(256), rng.randrange(256), rng.randrange(256))
        shape = draw.rectangle if rng.random() < 0.5 else draw.ellipse
        shape([left, top, left + box_size, top + box_size], fill=colour)
    return image
