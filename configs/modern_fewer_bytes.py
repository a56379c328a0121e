"""The fewer-bytes sweeps' candidate for the default run: configs/modern.py on 0.7 of its bytes.

    python train.py --config configs/modern_fewer_bytes.py --workdir runs/modern_fewer_bytes
    python bench/time_to_quality.py --default configs/modern_fewer_bytes.py --sides ca --rounds 1

Batch 16 for 560 steps (the default: 32 for 400), the decay over the last half of the steps (the
default: 30%) and Muon's momentum 0.9 (the default: 0.95); the model, data, sequence length and rates
are the default's. Over seeds 0-2 its final validation loss is no different from the default's
(docs/experiments/fewer_tokens.md, "Fewer bytes still"); 600 steps (`--config.train.steps=600`, 0.75
of the bytes) was the candidate measured before. `make train` still runs configs/modern.py, whose run
the notebooks and experiments read.
"""

from configs import modern


def get_config():
    c = modern.get_config()
    c.train.batch_size = 16  # the default: 32
    c.train.steps = 560  # the default: 400 (0.7 of its bytes)
    c.train.checkpoint_every = 280
    c.optim.decay_fraction = 0.5  # the default: 0.3
    c.optim.muon_momentum = 0.9  # the default: 0.95
    return c
