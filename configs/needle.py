"""Needle in a haystack: a small byte-level model that learns to retrieve one fact from filler text.

    python train.py --config configs/needle.py --workdir runs/needle

Each training row is one document (transformer/experiments/recall/needle.py): Shakespeare filler with " The code of
Kelav is 48213. " planted at a random depth, then "\\nWhat is the code of Kelav? " and the answer;
the loss grades only the answer's digits (data.needle.graded). Prompts of 64-128 bytes; RoPE and
max_seq_len 1024, so that the same model can be asked about documents past the trained lengths
(docs/experiments/retrieval_heads.md reports the run of 2026-12-02).

Kept as the one-fact case of the task (data.needle.facts = 1): the cheapest look at retrieval and its
length generalisation. The retrieval-heads experiment uses configs/recall.py instead: with one number
in the document a model can answer by copying it without reading the key.
"""

from configs.common import base_config


def get_config():
    c = base_config(
        dict(
            vocab_size=256,  # bytes
            max_seq_len=1024,  # evaluation goes past the trained lengths; RoPE has no table to outgrow
            d_model=64,
            num_layers=3,
            num_heads=4,  # d_h = 16; 12 heads to score and ablate
            mlp_dim=256,
            position="rope",
            norm="rmsnorm",
            activation="gelu",
            dropout=0.0,
            scan_layers=False,  # a Python loop trains faster than nn.scan on CPU at this depth
        )
    )
    c.data.task = "needle"
    c.data.needle.min_length = 64
    c.data.needle.max_length = 128
    c.data.needle.min_depth = 0.0
    c.data.needle.max_depth = 1.0
    c.data.needle.digits = 5
    c.data.needle.graded = "answer"  # only the answer's digits (grading every byte learned slower, README)
    c.train.steps = 2500
    c.train.batch_size = 32  # documents per step; only their 5 answer digits are graded
    c.train.seq_len = 132  # the longest prompt (128) and its 5-digit answer, less the last token
    c.train.log_every = 25
    c.train.eval_every = 250
    c.train.eval_batches = 4
    c.train.checkpoint_every = 250
    c.train.sample_tokens = 0  # the notebook asks the model questions instead
    c.optim.learning_rate = 3e-3
    c.optim.warmup_steps = 100
    return c
