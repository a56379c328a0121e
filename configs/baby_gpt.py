"""nanoGPT's "baby GPT" (config/train_shakespeare_char.py): 6 layers, 6 heads, d 384, context 256.

Karpathy's character-level Shakespeare model, here on bytes (vocabulary 256 instead of nanoGPT's 65
characters) and at batch 16 x 256 (nanoGPT trains it at 64 x 256 on a GPU). 10.8M parameters; the
training benchmark (bench/train.py) runs it against the same architecture in PyTorch.

Where a field differs from the defaults (ModelConfig's, and configs/common.py's), the comment says so.
"""

from configs.common import base_config


def get_config():
    c = base_config(
        dict(
            vocab_size=256,  # bytes (nanoGPT: the 65 characters of its Shakespeare text)
            max_seq_len=256,  # nanoGPT's block_size
            d_model=384,  # n_embd
            num_layers=6,  # n_layer
            num_heads=6,  # n_head: 6 heads of width 64
            position="learned",  # a learned position table, as GPT-2 (the default, stated)
            activation="gelu",  # exact (erf) GELU, nanoGPT's nn.GELU() (the default, stated)
            norm="layernorm",  # with gain and bias (the default, stated); nanoGPT's bias=False
            # drops the norm and projection biases, we keep them to match GPT-2 / GPT2LMHeadModel
            dropout=0.0,  # nanoGPT uses 0.2 for this model; 0 keeps the benchmark deterministic
            dtype="auto",  # compute dtype (the default, stated): float32 on a CPU, where bfloat16
            # gains nothing on XLA:CPU; bfloat16 on a GPU or TPU (transformer/model/execution.py)
            scan_layers=False,  # default True; on XLA:CPU an unrolled loop over 6 layers trains
            # faster than nn.scan and still compiles quickly (docs/performance.md, "Scanned layers"):
            # the scan writes each layer's saved activations into stacked [L, ...] buffers and reads
            # them back in the backward pass. Keep True for deep models, and for remat: unrolled,
            # XLA:CPU undoes the recomputation.
        )
    )
    c.train.steps = 5000  # nanoGPT's max_iters (default 2000)
    c.train.batch_size = 16  # default 32; nanoGPT uses 64 on a GPU
    c.train.seq_len = 256  # the full context (default 128)
    c.train.eval_every = 250  # nanoGPT's eval_interval (the default, stated)
    c.train.log_every = 10  # nanoGPT's log_interval (default 50)
    c.optim.learning_rate = 1e-3  # nanoGPT's "baby networks can afford a bit higher" rate (the default)
    c.optim.warmup_steps = 100  # nanoGPT's warmup_iters (the default, stated)
    c.optim.min_lr_ratio = 0.1  # nanoGPT's min_lr = learning_rate / 10 (the default, stated)
    c.optim.b2 = 0.99  # nanoGPT: "make a bit bigger because number of tokens per iter is small"
    return c
