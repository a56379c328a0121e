"""Associative recall in a document: a model with heads to spare that must match a key to answer.

    python train.py --config configs/recall.py --workdir runs/recall

Each training row is one document (transformer/experiments/recall/needle.py with data.needle.facts = 3): Shakespeare
filler with three facts " The code of Kelav is 482. " planted in it, distinct keys, and at the end the
needle's words for one of them, up to its value ("\nThe code of Morup is "; data.needle.question =
'cloze'); the loss grades only the value's digits. A model that copies any of the three values is right
a third of the time (the chance line, `needle.copy_any_value_accuracy`): to do better it has to match
the key.

Why the cloze rather than the question in words ("\nWhat is the code of Morup? "): with the question,
this config stayed at the chance line, copying one of the values without matching the key (0.27 exact
match over the trained lengths after 1,000 and 1,500 steps, docs/experiments/retrieval_heads.md). The
cloze puts the answer after the same words as in the needle, the shape an induction-style head
completes.

4 layers x 8 heads of width 16: 32 heads, so that removing a few at random can leave retrieval
intact and a top-k against random-k contrast has room (the one-fact needle model had 12, and 3 random
heads off already broke it). The modern recipe of configs/modern_b32.py (Muon, RoPE, RMSNorm, QK-norm,
zero-initialised outputs); RoPE and max_seq_len 1024 so that the same model can be asked about
documents 4x past the trained lengths.

Two choices make the escape from the copy-any-value plateau reliable (a seed sweep on a GPU, float32
and the reference attention as on a CPU: docs/experiments/retrieval_heads.md, "Finding a recipe"):
- Layers 0 and 2 see only the last 16 bytes (attention_window=16, global_every=2: layers 1 and 3 see
  everything; the notebook names heads counting layers from 1, so its local layers are L1 and L3). To
  match a key, a head must first gather the key's letters at the value's position and at the cloze's
  end, 4-9 bytes back; a local layer finds those few positions among 16, not among 200.
  With full attention in every layer, 1 of 3 seeds passed 0.9 exact match within 2,500 steps; with the
  window all 3 did, by step 1,500.
- Three graded questions per training row (data.needle.questions = 3; validation rows ask one): three
  times the answers per step. With the window, 6 of 6 seeds passed 0.98 exact match by step 1,000.
"""

from configs import modern_b32


def get_config():
    c = modern_b32.get_config()
    c.model.update(dict(
        max_seq_len=1024,  # evaluation goes past the trained lengths; RoPE has no table to outgrow
        d_model=128,
        num_layers=4,
        num_heads=8,  # d_h = 16: 32 heads to score and ablate
        num_kv_heads=8,
        head_dim=16,
        mlp_dim=256,  # the MLP's share of the compute halved: the task is attention's
        attention_window=16,  # layers 0 and 2 local (the key's letters a few bytes back) ...
        global_every=2,  # ... layers 1 and 3 global (the look-up over the whole document)
    ))
    c.data.task = "needle"
    c.data.needle.facts = 3
    c.data.needle.question = "cloze"
    c.data.needle.digits = 3
    c.data.needle.min_length = 120  # the 3 needles (27 bytes each) and the cloze (22) take 103
    c.data.needle.max_length = 176
    c.data.needle.min_depth = 0.0
    c.data.needle.max_depth = 1.0
    c.data.needle.graded = "answer"
    c.data.needle.questions = 3  # each training row asks 3 times (facts drawn at random), each answer graded
    c.train.steps = 1200
    c.train.batch_size = 32  # documents per step; only their answers' digits are graded
    c.train.seq_len = 228  # the longest prompt (176), its answer (3) and 2 more cloze + answer (2 x 25), less 1
    c.train.log_every = 25
    c.train.eval_every = 200
    c.train.eval_batches = 8  # val_exact_match over 256 single-question documents
    c.train.checkpoint_every = 200
    c.train.sample_tokens = 0  # the notebook asks the model questions instead
    return c
