"""Images that ship or are generated here (no download): scikit-learn's bundled digits and procedural shapes.

    shapes(n, seed, objects=(1, 3)) -> {
        "images":   float32 [n, 32, 32, 3] in [0, 1]: one to three coloured shapes on a textured background
        "masks":    bool [n, K, 32, 32]: object k's visible pixels (a later object paints over an earlier one)
        "shape":    int [n, K]: index into SHAPES ("circle", "square", "triangle"), -1 where object k is absent
        "colour":   int [n, K]: index into COLOURS ("red", "green", "blue", "yellow"), -1 where absent
        "position": int [n, K]: index into POSITIONS ("left", "right", "top", "bottom"), -1 where absent
        "count":    int [n]: the objects in each picture (objects k < count are present)
        "shape_names", "colour_names", "position_names": the name lists (tuples of str)
    }                                                   K = MAX_OBJECTS = 3
    digits(split="all") -> {"images": float32 [n, 8, 8, 1] in [0, 1], "label": int [n] (0..9), "label_names"}
    classification(name, n, seed) -> (images [n, H, W, C], labels [n]): the sets a ViT is trained on

`shapes` is a function of (n, seed, objects) alone, vectorised numpy (a few thousand pictures a second).
Each picture places its objects in distinct slots, one per side of the centre, so an object's position
label (where it sits relative to the picture's centre) is well defined; its centre is jittered by up to
JITTER pixels and its size drawn per object (shapes of one size have about equal areas, so the pixel
count does not tell the shape). The classification task (`classification`) uses pictures with ONE object
and labels each by that object's shape: three classes, chance 1/3.
"""

from __future__ import annotations

import numpy as np

SHAPES = ("circle", "square", "triangle")
COLOURS = ("red", "green", "blue", "yellow")
POSITIONS = ("left", "right", "top", "bottom")  # of the picture's centre
RGB = np.array([[0.9, 0.15, 0.15], [0.15, 0.75, 0.2], [0.2, 0.3, 0.95], [0.95, 0.85, 0.1]], np.float32)
SIZE = 32  # pixels per side
MAX_OBJECTS = 3  # K
SLOT_OFFSET = 8.5  # an object's centre sits this far from the picture's centre, on its side
JITTER = 1.5  # ... moved by up to this many pixels along each axis
DIGITS_TEST = 360  # held-out digits (20%)
RADIUS = (3.0, 5.0)  # an object's size r (a circle's radius; the others of about equal area)


def _inside(shape: np.ndarray, dx: np.ndarray, dy: np.ndarray, r: np.ndarray) -> np.ndarray:
    """bool [n, H, W]: the pixels inside each object, shape [n] int, dx / dy [n, H, W] from its centre, r [n, 1, 1]."""
    circle = dx ** 2 + dy ** 2 <= r ** 2
    square = np.maximum(np.abs(dx), np.abs(dy)) <= 0.886 * r  # (2 * 0.886 r)^2 = pi r^2
    t, w = 1.1 * r, 1.4 * r  # an upright triangle: apex at -t, base at +t of half-width w (area 2 t w ~ pi r^2)
    triangle = (np.abs(dy) <= t) & (np.abs(dx) <= w * (dy + t) / (2 * t))
    return np.choose(shape[:, None, None], [circle, square, triangle])


def _background(rng: np.random.Generator, n: int) -> np.ndarray:
    """float32 [n, H, W, 3]: a grey of random level and tint, a random sine grating and pixel noise."""
    y, x = np.mgrid[0:SIZE, 0:SIZE].astype(np.float32)
    level = rng.uniform(0.3, 0.6, (n, 1, 1, 1)) + rng.uniform(-0.05, 0.05, (n, 1, 1, 3))
    angle, frequency, phase = rng.uniform(0, np.pi, n), rng.uniform(0.3, 1.2, n), rng.uniform(0, 2 * np.pi, n)
    along = x[None] * np.cos(angle)[:, None, None] + y[None] * np.sin(angle)[:, None, None]  # [n, H, W]
    grating = 0.08 * np.sin(frequency[:, None, None] * along + phase[:, None, None])
    return (level + grating[..., None] + rng.normal(0, 0.04, (n, SIZE, SIZE, 3))).astype(np.float32)


def shapes(n: int, seed: int | list[int], objects: tuple[int, int] = (1, MAX_OBJECTS),
           radius: tuple[float, float] = RADIUS, offset: float = SLOT_OFFSET) -> dict:
    """n pictures of `objects` = (fewest, most) shapes each, drawn from `seed` alone: the dict of the
    module docstring. Sizes r drawn in `radius`; a slot's centre `offset` pixels from the picture's.
    The same arguments give the same arrays."""
    lo, hi = objects
    if not 1 <= lo <= hi <= MAX_OBJECTS:
        raise ValueError(f"objects={objects} must be (fewest, most) with 1 <= fewest <= most <= {MAX_OBJECTS}")
    rng = np.random.default_rng(seed)
    images = _background(rng, n)
    count = rng.integers(lo, hi, size=n, endpoint=True)
    present = np.arange(MAX_OBJECTS)[None] < count[:, None]  # [n, K]
    shape = rng.integers(0, len(SHAPES), (n, MAX_OBJECTS))
    colour = rng.integers(0, len(COLOURS), (n, MAX_OBJECTS))
    position = np.argsort(rng.random((n, len(POSITIONS))), axis=1)[:, :MAX_OBJECTS]  # distinct slots per picture
    r = rng.uniform(*radius, (n, MAX_OBJECTS))
    jitter = rng.uniform(-JITTER, JITTER, (n, MAX_OBJECTS, 2))
    shade = rng.uniform(0.85, 1.0, (n, MAX_OBJECTS, 1))  # a little brightness variation per object
    side = np.array([[-1, 0], [1, 0], [0, -1], [0, 1]], np.float32)  # (x, y) direction of each position
    centre = SIZE / 2 + offset * side[position] + jitter  # [n, K, 2]
    y, x = np.mgrid[0:SIZE, 0:SIZE].astype(np.float32) + 0.5  # pixel centres
    masks = np.zeros((n, MAX_OBJECTS, SIZE, SIZE), bool)
    for k in range(MAX_OBJECTS):  # later objects paint over earlier ones
        drawn = _inside(shape[:, k], x[None] - centre[:, k, 0, None, None], y[None] - centre[:, k, 1, None, None],
                        r[:, k, None, None]) & present[:, k, None, None]
        masks[:, :k] &= ~drawn[:, None]
        masks[:, k] = drawn
        images = np.where(drawn[..., None], (RGB[colour[:, k]] * shade[:, k])[:, None, None], images)
    absent = lambda a: np.where(present, a, -1)  # noqa: E731
    return {"images": np.clip(images, 0.0, 1.0).astype(np.float32), "masks": masks, "shape": absent(shape),
            "colour": absent(colour), "position": absent(position), "count": count,
            "shape_names": SHAPES, "colour_names": COLOURS, "position_names": POSITIONS}


def digits(split: str = "all") -> dict:
    """scikit-learn's bundled 8 x 8 digits scaled to [0, 1]: images float32 [n, 8, 8, 1], label int [n]; split
    'all' (n = 1797), or 'train' / 'test' (a fixed shuffle's first 1437 / last DIGITS_TEST = 360)."""
    try:
        from sklearn.datasets import load_digits  # optional: the dev and notebooks extras
    except ImportError:
        raise ImportError("the digits come from scikit-learn: pip install -e '.[dev]' (or scikit-learn)") from None
    if split not in ("all", "train", "test"):
        raise ValueError(f"digits(split={split!r}): use 'all', 'train' or 'test'")
    data = load_digits()
    order = np.random.default_rng(0).permutation(len(data.target))
    index = {"all": np.arange(len(order)), "train": order[:-DIGITS_TEST], "test": order[-DIGITS_TEST:]}[split]
    return {"images": (data.images[index] / 16.0).astype(np.float32)[..., None],
            "label": data.target[index].astype(np.int64), "label_names": tuple(str(d) for d in range(10))}


def classification(name: str, n: int, seed: int | list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(images float32 [n, H, W, C], labels int [n]) of the classification set `name`: 'shapes' (one
    object per picture, labelled by its shape; H = W = 32, C = 3) drawn from `seed`, or 'digits' (n
    pictures of the training split drawn with replacement by `seed`; H = W = 8, C = 1)."""
    if name == "shapes":
        data = shapes(n, seed, objects=(1, 1))
        return data["images"], data["shape"][:, 0]
    if name == "digits":
        data = digits("train")
        index = np.random.default_rng(seed).integers(0, len(data["label"]), n)
        return data["images"][index], data["label"][index]
    raise ValueError(f"no image set {name!r}; use 'shapes' or 'digits'")
