"""The lecture sweep's close calls again, with another seed (train.seed=1: other initial weights,
dropout keys and batch order), to tell a difference from run-to-run noise.

    python sweep.py --sweep configs/sweeps/lecture_seed1.py --workdir runs/sweeps/lecture_seed1

The variants are those of configs/sweeps/lecture.py whose final validation loss came within 0.03
nats of the baseline's in the first run (seed 0), and the baseline itself.
"""

from configs.sweeps import lecture

CLOSE = ("baseline", "layernorm_plain", "rmsnorm", "mlp_5d", "gqa", "mqa")


def get_config():
    c = lecture.get_config()
    c["overrides"] = {**c["overrides"], "train.seed": 1}
    c["variants"] = {name: v for name, v in c["variants"].items() if name in CLOSE}
    return c
