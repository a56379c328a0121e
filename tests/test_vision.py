"""The ViT half of attention beyond language: image patches, the bidirectional mask, registers, the image data."""

import numpy as np
import pytest

from transformer.data import images


def test_shapes_are_deterministic_per_seed_and_their_masks_match_their_labels():
    a, b, c = images.shapes(64, seed=3), images.shapes(64, seed=3), images.shapes(64, seed=4)
    for key in ("images", "masks", "shape", "colour", "position", "count"):
        np.testing.assert_array_equal(a[key], b[key])
    assert not np.array_equal(a["images"], c["images"])
    assert a["images"].shape == (64, 32, 32, 3) and a["images"].dtype == np.float32
    assert a["masks"].shape == (64, images.MAX_OBJECTS, 32, 32) and a["masks"].dtype == bool
    present = a["shape"] >= 0
    np.testing.assert_array_equal(present, np.arange(images.MAX_OBJECTS)[None] < a["count"][:, None])
    np.testing.assert_array_equal(present, a["colour"] >= 0)
    np.testing.assert_array_equal(present, a["masks"].any(axis=(2, 3)))  # an absent object draws nothing
    assert not (a["masks"].sum(axis=1) > 1).any()  # a pixel belongs to one object at most
    y, x = np.mgrid[0:32, 0:32] + 0.5
    side = {"left": (-1, 0), "right": (1, 0), "top": (0, -1), "bottom": (0, 1)}
    for i, k in zip(*np.nonzero(present)):
        mask = a["masks"][i, k]
        dx, dy = x[mask].mean() - 16, y[mask].mean() - 16  # the object's centre from the picture's
        sx, sy = side[images.POSITIONS[a["position"][i, k]]]
        assert dx * sx + dy * sy > 4 and abs(dx * sy + dy * sx) < 4  # on its labelled side of the centre
        pixels = a["images"][i][mask]  # [m, 3]: the object's colour, a little shaded
        nearest = np.linalg.norm(pixels.mean(0)[None] - images.RGB, axis=1).argmin()
        assert nearest == a["colour"][i, k]


def test_classification_sets():
    x, y = images.classification("shapes", 16, seed=0)
    assert x.shape == (16, 32, 32, 3) and set(y) <= {0, 1, 2}
    x, y = images.classification("digits", 16, seed=0)
    assert x.shape == (16, 8, 8, 1) and 0 <= x.min() and x.max() <= 1 and set(y) <= set(range(10))
    train, test = images.digits("train"), images.digits("test")
    assert len(train["label"]) + len(test["label"]) == 1797 and len(test["label"]) == images.DIGITS_TEST
    with pytest.raises(ValueError, match="no image set"):
        images.classification("cifar", 4, 0)
    with pytest.raises(ValueError, match="objects"):
        images.shapes(4, 0, objects=(0, 2))
