"""configs/sweeps/window.py's extremes again with another seed (train.seed=1: other initial weights
and batch order), to tell what a window costs from run-to-run noise.

    python sweep.py --sweep configs/sweeps/window_seed1.py --workdir runs/sweeps/window_seed1
"""

from configs.sweeps import window

KEPT = ("full", "window_16", "window_4")


def get_config():
    c = window.get_config()
    c["overrides"] = {**c["overrides"], "train.seed": 1}
    c["variants"] = {name: v for name, v in c["variants"].items() if name in KEPT}
    return c
