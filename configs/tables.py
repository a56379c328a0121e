"""Attention on a table: a TabPFN-style in-context classifier built from the same decoder.

    python train.py --config configs/tables.py --workdir runs/tables

Each training row of a batch is a whole synthetic classification table (transformer/experiments/tables/table_rows.py):
up to 32 features and 4 classes, T = 128 rows of which 8..120 carry their labels; the model gives every
unlabelled row's class in one forward pass, and the loss grades only those. The decoder reads rows
instead of tokens (model.inputs='table', transformer/model/table.py): no positions (a table's rows are
a set), a mask in which a test row sees every training row and itself only, a class head. The run has
no corpus, tokenizer, bits per byte or text sample. About 10 minutes on 2 CPU cores
(docs/experiments/tables.md reports the run and its evaluation against kNN and logistic regression).
"""

from configs.common import base_config


def get_config():
    c = base_config(
        dict(
            vocab_size=4,  # unused by a table model (the class head has num_classes outputs)
            max_seq_len=1024,  # rows per table at evaluation (the training tables have train.seq_len)
            d_model=96,
            num_layers=4,
            num_heads=4,
            mlp_dim=192,
            position="none",  # the rows are a set
            norm="layernorm",
            tie_embeddings=False,
            inputs="table",
            num_features=32,
            num_classes=4,
            dropout=0.0,
            scan_layers=False,  # a Python loop trains faster than nn.scan on CPU at this depth
        )
    )
    c.data.task = "tables"
    c.train.steps = 2000
    c.train.batch_size = 32  # tables per step
    c.train.seq_len = 128  # rows per table
    c.train.log_every = 50
    c.train.eval_every = 500
    c.train.eval_batches = 8  # 256 held-out tables
    c.train.checkpoint_every = 500
    c.train.sample_tokens = 0  # no text to sample
    c.optim.learning_rate = 1e-3
    c.optim.warmup_steps = 200
    c.optim.weight_decay = 0.0
    return c
