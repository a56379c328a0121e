"""The fewer-bytes candidate of configs/sweeps/fewer_tokens_seeds.py (batch 16 x 600, a 50% decay,
Muon's momentum 0.9) on still fewer bytes, over three seeds: how far below 0.75 of the default's bytes
does it keep the default's loss? (Its answer, 560 steps, is configs/modern.py since.)

    python sweep.py --sweep configs/sweeps/fewer_bytes_shorter.py --workdir runs/sweeps/fewer_bytes_shorter --jobs 2

`recipe` is the default run of then (configs/modern_b32.py, 400 x 32); `b16_x600` that candidate; the rest its
schedule (warm-up, a 50% decay, momentum 0.9) over fewer steps or a smaller batch (the fraction of
the default's bytes in each comment). Seeds 0, 1, 2 (train.seed: other initial weights and
batch order); transformer.analysis.statistics.verdict reads the paired differences.
"""

CANDIDATE = {"train.batch_size": 16, "train.steps": 600, "optim.decay_fraction": 0.5, "optim.muon_momentum": 0.9}


def get_config():
    return dict(
        base="modern_b32",
        overrides={"train.eval_every": 100, "train.checkpoint_every": 200, "train.sample_tokens": 0},
        variants={
            "recipe": {},  # 400 x 32: all the bytes
            "b16_x600": CANDIDATE,  # 0.75
            "b16_x560": {**CANDIDATE, "train.steps": 560},  # 0.70
            "b16_x520": {**CANDIDATE, "train.steps": 520},  # 0.65
            "b12_x720": {**CANDIDATE, "train.batch_size": 12, "train.steps": 720},  # 0.675
        },
        seeds=[0, 1, 2],
    )
