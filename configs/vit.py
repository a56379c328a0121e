"""A vision transformer (ViT) on procedural shapes: which shape (circle, square, triangle) is in the picture.

    python train.py --config configs/vit.py --workdir runs/vit

Each picture is 32 x 32 x 3 with one coloured shape on a textured background (transformer/data/images.py),
cut into 8 x 8 patches: 16 patch tokens and a [CLS] token that the class head reads. Every token sees
every token (model.mask='bidirectional'); positions are learned. Chance is 1/3. A few minutes on 2 CPU
cores (docs/experiments/vision.md reports the accuracy over seeds, the [CLS] maps and the registers).
"""

from configs.common import base_config


def get_config():
    c = base_config(
        dict(
            vocab_size=1,  # unused by a ViT (the class head has num_classes outputs)
            max_seq_len=17,  # 16 patches + [CLS]
            d_model=64,
            num_layers=4,
            num_heads=4,
            mlp_dim=128,
            position="learned",
            tie_embeddings=False,
            inputs="image",
            mask="bidirectional",
            image_size=32,
            patch_size=8,  # 4 x 4 patches: with 4 x 4 pixels (64 patches) training stalls at chance for hundreds of steps
            channels=3,
            cls_token=True,
            pool="cls",
            num_classes=3,
            scan_layers=False,  # a Python loop trains faster than nn.scan on CPU at this depth
        )
    )
    c.data.task = "images"
    c.data.images.name = "shapes"
    c.train.steps = 1500
    c.train.batch_size = 64  # pictures per step
    c.train.seq_len = 17  # tokens per picture (for the throughput in the log)
    c.train.log_every = 50
    c.train.eval_every = 500
    c.train.eval_batches = 8  # 512 held-out pictures
    c.train.checkpoint_every = 500
    c.train.sample_tokens = 0  # no text to sample
    c.optim.learning_rate = 1e-3
    c.optim.warmup_steps = 50
    c.optim.weight_decay = 0.05
    return c
