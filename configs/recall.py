"""Associative recall in a document: a model with heads to spare that must match a key to answer.

    python train.py --config configs/recall.py --workdir runs/recall

Each training row is one document (transformer/data/needle.py with data.needle.facts = 4): Shakespeare
filler with four facts " The code of Kelav is 482. " planted in it, distinct keys, one of them asked
at the end ("\\nWhat is the code of Kelav? "), and its value; the loss grades only the value's digits.
A model that copies any of the four values is right a quarter of the time (the chance line,
`needle.copy_any_value_accuracy`): to do better it has to match the key.

4 layers x 8 heads of width 16: 32 heads, so that removing a few at random can leave retrieval
intact and a top-k against random-k contrast has room (the one-fact needle model had 12, and 3 random
heads off already broke it). The modern recipe of configs/modern.py (Muon, RoPE, RMSNorm, QK-norm,
zero-initialised outputs) to train within the budget on 2 CPU cores; RoPE and max_seq_len 1024 so
that the same model can be asked about documents 4x past the trained lengths.
"""

from configs import modern


def get_config():
    c = modern.get_config()
    c.model.update(dict(
        max_seq_len=1024,  # evaluation goes past the trained lengths; RoPE has no table to outgrow
        d_model=128,
        num_layers=4,
        num_heads=8,  # d_h = 16: 32 heads to score and ablate
        num_kv_heads=8,
        head_dim=16,
        mlp_dim=256,  # the MLP's share of the compute halved: the task is attention's
    ))
    c.data.task = "needle"
    c.data.needle.facts = 3
    c.data.needle.digits = 3
    c.data.needle.min_length = 120  # the 3 needles (27 bytes each) and the question (28) take 109
    c.data.needle.max_length = 176
    c.data.needle.min_depth = 0.0
    c.data.needle.max_depth = 1.0
    c.data.needle.graded = "answer"
    c.train.steps = 2500
    c.train.batch_size = 32  # documents per step; only their 3 answer digits are graded
    c.train.seq_len = 178  # the longest prompt (176) and its 3-digit answer, less the last token
    c.train.log_every = 25
    c.train.eval_every = 250
    c.train.eval_batches = 4
    c.train.checkpoint_every = 250
    c.train.sample_tokens = 0  # the notebook asks the model questions instead
    return c
