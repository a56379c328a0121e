"""The image task (`data.task='images'`): pictures and their class for a ViT (model.inputs='image').

    inputs  [B, H, W, C] float32   images.classification(data.images.name): 'shapes' (one object a
                                   picture, its shape's class; 32 x 32 x 3) or 'digits' (8 x 8 x 1)
    targets [B, 1] int32           the class: the loss reads the ViT's one logit row [B, 1, C]

Training batch `step` is drawn from (seed, step) alone; the held-out batches are shapes drawn from
EVAL_SEED, or the digits' test split (never a training picture), read in order and wrapped around."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from transformer.data import images
from transformer.data.batches import host_rows
from transformer.data.tasks import DataTask

EVAL_SEED = 3_000_017
SETS = {"shapes": (32, 3, len(images.SHAPES)), "digits": (8, 1, 10)}  # name -> (image_size, channels, classes)


def batch_at(tokens: Any, *, seed: int, step: int, batch_size: int, seq_len: int, name: str, host_index: int = 0,
             host_count: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Training batch `step` (no text: `tokens` is unused): (images [B / hosts, H, W, C], classes int32 [B / hosts, 1])."""
    x, y = images.classification(name, batch_size, [seed, step])
    rows = host_rows(batch_size, host_index, host_count)
    return x[rows], y[rows, None].astype(np.int32)


def eval_batches(tokens: Any, *, num_batches: int, batch_size: int, seq_len: int, name: str, host_index: int = 0,
                 host_count: int = 1) -> list[tuple[np.ndarray, np.ndarray]]:
    """`num_batches` held-out batches as `batch_at` gives them."""
    if name == "digits":
        test = images.digits("test")
        index = np.arange(num_batches * batch_size) % len(test["label"])
        x, y = test["images"][index], test["label"][index]
    else:
        x, y = images.classification(name, num_batches * batch_size, EVAL_SEED)
    rows = host_rows(batch_size, host_index, host_count)
    return [(x[i: i + batch_size][rows], y[i: i + batch_size][rows, None].astype(np.int32))
            for i in range(0, num_batches * batch_size, batch_size)]


def image_task(config: Any) -> DataTask:
    """data.task='images': the set data.images.name, checked against the model."""
    name, model = config.data.images.name, config.model
    if name not in SETS:
        raise ValueError(f"data.images.name={name!r} is not an image set; use one of {', '.join(map(repr, SETS))}")
    size, channels, classes = SETS[name]
    if (model.get("inputs"), model.image_size, model.channels) != ("image", size, channels) or model.num_classes < classes:
        raise ValueError(f"data.images.name={name!r} gives {size} x {size} x {channels} images of {classes} classes; "
                         f"set model.inputs='image', image_size={size}, channels={channels}, num_classes >= {classes} "
                         "(configs/vit.py, configs/vit_digits.py)")
    return DataTask(functools.partial(batch_at, name=name), functools.partial(eval_batches, name=name), text=False)
