"""A vision transformer on scikit-learn's bundled 8 x 8 digits (no download): ten classes, chance 1/10.

    python train.py --config configs/vit_digits.py --workdir runs/vit_digits

2 x 2 patches: 16 patch tokens and a [CLS] token; trained on 1437 digits, evaluated on the 360 held out
(transformer/data/images.py). About a minute and a half on 2 CPU cores.
"""

from configs.vit import get_config as vit_config


def get_config():
    c = vit_config()
    c.model.update(dict(image_size=8, patch_size=2, channels=1, num_classes=10))
    c.data.images.name = "digits"
    c.train.steps = 600
    c.optim.learning_rate = 2e-3
    c.train.eval_every = 250
    c.train.eval_batches = 6  # the 360 held-out digits, wrapped to 384
    return c
