"""Two of the fewer-tokens sweep's variants against the default recipe, over three seeds: does batch
16 x 600 steps (0.75 of the bytes) with a 70% decay, or with a 50% decay and Muon's momentum at 0.9,
reach the default run's loss?

    python sweep.py --sweep configs/sweeps/fewer_tokens_seeds.py --workdir runs/sweeps/fewer_tokens_seeds --jobs 2

The variants and overrides are configs/sweeps/fewer_tokens.py's; seeds 0, 1, 2 (train.seed: other
initial weights and batch order). transformer.analysis.statistics.verdict reads the paired differences.
"""

from configs.sweeps import fewer_tokens

KEPT = ("recipe", "b16_d70", "b16_d50_momentum_09")


def get_config():
    c = fewer_tokens.get_config()
    c["variants"] = {name: v for name, v in c["variants"].items() if name in KEPT}
    c["seeds"] = [0, 1, 2]
    return c
