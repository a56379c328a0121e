"""Image question answering: a byte decoder that cross-attends to a ViT encoder of the picture.

    python train.py --config configs/vqa.py --workdir runs/vqa

Each row is one procedural picture (transformer/data/images.py: one to three coloured shapes) and one
question about it, in bytes: "colour of the circle? red", "where is the square? left", "which shape is
blue? triangle" (transformer/experiments/vqa/questions.py); the loss grades the answer's bytes only. The
model reads {"image": [B, 32, 32, 3], "tokens": [B, T]} (model.inputs='image_text'): the encoder, a ViT
of 8 x 8 patches with 2-D sinusoidal positions (model.encoder, its own model fields), gives its 16 output
tokens; every block of the decoder cross-attends to them (model.cross_attention). With 4 x 4 patches
(64 tokens) it learned more slowly at this budget, and never read an object's position. The validation
metric is the exact match of greedily decoded answers (the sampler's cached path); the text-only chance
line and the results over seeds: docs/experiments/vqa.md (scripts/vqa_experiment.py).
"""

from configs.common import base_config

ENCODER = dict(  # a ViT over 16 patches; its class head is unused (the decoder reads its output tokens)
    vocab_size=1, max_seq_len=16, d_model=64, num_layers=2, num_heads=4, mlp_dim=128, position="sinusoidal",
    tie_embeddings=False, inputs="image", mask="bidirectional", image_size=32, patch_size=8, channels=3,
    pool="mean", num_classes=2, scan_layers=False,
)


def get_config():
    c = base_config(
        dict(
            vocab_size=256,  # bytes
            max_seq_len=40,  # the longest question and answer (31 bytes) and greedy decoding's extra bytes
            d_model=64,
            num_layers=2,
            num_heads=4,
            mlp_dim=128,
            position="learned",
            dropout=0.0,
            scan_layers=False,  # a Python loop trains faster than nn.scan on CPU at this depth
            inputs="image_text",
            cross_attention=True,
            encoder=ENCODER,
        )
    )
    c.data.task = "vqa"
    c.train.steps = 6000
    c.train.batch_size = 32
    c.train.seq_len = 32
    c.train.log_every = 50
    c.train.eval_every = 1000
    c.train.eval_batches = 8  # 256 held-out pictures
    c.train.checkpoint_every = 1000
    c.train.sample_tokens = 0  # no corpus to sample
    c.optim.learning_rate = 2e-3
    c.optim.warmup_steps = 100
    c.optim.weight_decay = 0.0
    return c
