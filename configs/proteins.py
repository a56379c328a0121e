"""A protein language model on synthetic families whose contacts are known (docs/experiments/proteins.md).

    python train.py --config configs/proteins.py --workdir runs/proteins

Eight families (transformer/experiments/proteins/): each a compact lattice fold of 48-64 residues, a
Potts model over the 20 amino acids with couplings on its contacts, and 20,000 sequences Gibbs-sampled
from it (about a minute for all eight, drawn once per process). The model is the project's causal
decoder reading one sequence a row after a start token (vocabulary 21): causal protein language models
carry contacts in their attention too (a pair i < j is seen by j; symmetrising the map recovers it), and
a masked-LM objective is left for later. 16 heads (4 layers x 4) for the logistic regression over heads
to read; 3,000 steps of 64 sequences is about one pass over the 156,000 training sequences, a few
minutes on 2 CPU cores. scripts/protein_experiment.py trains three seeds and reads their contacts.
"""

import ml_collections

from configs.common import base_config


def get_config():
    c = base_config(
        dict(
            vocab_size=21,  # 20 amino acids, then the start token
            max_seq_len=64,
            d_model=64,
            num_layers=2,
            num_heads=8,  # 16 heads for the logistic regression to read
            mlp_dim=128,
            position="learned",  # a family's contacts sit at fixed positions
            norm="layernorm",
            dropout=0.0,
            scan_layers=False,  # a Python loop trains faster than nn.scan on CPU at this depth
        )
    )
    c.data.task = "proteins"
    c.data.proteins = ml_collections.ConfigDict()  # the families (transformer/experiments/proteins/families.py)
    c.data.proteins.families = 8  # families drawn; the first train_families fit the contact read-outs
    c.data.proteins.train_families = 4  # the other families score them
    c.data.proteins.min_length = 48  # a family's length is drawn in [min_length, max_length]
    c.data.proteins.max_length = 64
    c.data.proteins.sequences = 20_000  # per family
    c.data.proteins.held_out = 500  # the last this many of a family: validation, and contacts are read from them
    c.data.proteins.sweeps = 50  # Gibbs sweeps per chain (tests/test_proteins.py: two starts agree after 50)
    c.data.proteins.coupling = 0.5  # std of a contact's couplings J_ij(a, b)
    c.data.proteins.field = 1.0  # std of the fields h_i(a): conserved sites tell a family from the first residues
    c.data.proteins.seed = 0  # the families: the same whatever train.seed
    c.train.steps = 2000
    c.train.batch_size = 64
    c.train.seq_len = 64
    c.train.log_every = 100
    c.train.eval_every = 500
    c.train.eval_batches = 8
    c.train.checkpoint_every = 500
    c.train.keep_checkpoints = 10  # the experiment reads contacts at every checkpoint
    c.train.sample_tokens = 0  # no text to sample
    c.optim.learning_rate = 3e-3
    c.optim.warmup_steps = 100
    c.optim.weight_decay = 0.0
    return c
