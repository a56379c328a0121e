"""The default recipe as it was (configs/modern_b32.py) on fewer training tokens: which batch size, step count and
schedule reach the default run's validation loss soonest (issue: time to quality).

    python sweep.py --sweep configs/sweeps/fewer_tokens.py --workdir runs/sweeps/fewer_tokens --jobs 2

Every run: the recipe's model and optimizer, evaluated every 100 steps, no sample at the end, once per
seed (train.seed: other initial weights and batch order). `recipe` is the default run of then itself (400 steps
of 32 x 128 bytes); every other variant trains on fewer bytes (the fraction in its name's comment), by
a smaller batch, fewer steps or both, some with a longer decay or a higher Muon rate. The keep rule:
a variant replaces the default only if its mean final validation loss over the seeds is no worse than
the recipe's and its wall time (bench/time_to_quality.py) is lower.
"""


B16_D50 = {"train.batch_size": 16, "train.steps": 600, "optim.decay_fraction": 0.5}
B16_TUNED = {**B16_D50, "optim.learning_rate": 8e-3, "optim.warmup_steps": 20, "optim.decay_fraction": 0.7}


def get_config():
    return dict(
        base="modern_b32",
        overrides={"train.eval_every": 100, "train.checkpoint_every": 200, "train.sample_tokens": 0},
        variants={
            "recipe": {},  # 400 x 32 sequences: all the bytes
            "steps_300": {"train.steps": 300},  # 0.75 of the bytes
            "steps_300_decay_50": {"train.steps": 300, "optim.decay_fraction": 0.5},  # 0.75
            "batch_24": {"train.batch_size": 24},  # 0.75
            "batch_16_x600": {"train.batch_size": 16, "train.steps": 600},  # 0.75
            "batch_16_x600_decay_50": {"train.batch_size": 16, "train.steps": 600, "optim.decay_fraction": 0.5},
            "batch_16_x600_muon_03": {"train.batch_size": 16, "train.steps": 600, "optim.muon_learning_rate": 0.03},
            "batch_16_x500": {"train.batch_size": 16, "train.steps": 500},  # 0.625
            # the best of the above, batch 16 x 600 with a 50% decay, with one more change each
            "b16_d50_warmup_20": {**B16_D50, "optim.warmup_steps": 20},
            "b16_d50_adamw_8e-3": {**B16_D50, "optim.learning_rate": 8e-3},  # embeddings, head, gains
            "b16_d50_min_lr_0": {**B16_D50, "optim.min_lr_ratio": 0.0},
            "b16_d70": {**B16_D50, "optim.decay_fraction": 0.7},
            "b16_d50_momentum_09": {**B16_D50, "optim.muon_momentum": 0.9},
            "b16_d50_softcap_15": {**B16_D50, "model.logit_softcap": 15.0},
            # the three that helped, together, on 0.75, 0.65 and 0.6 of the bytes
            "b16_x600_tuned": {**B16_TUNED},
            "b16_x520_tuned": {**B16_TUNED, "train.steps": 520},
            "b16_x480_tuned": {**B16_TUNED, "train.steps": 480},
            "b16_x520_tuned_adamw_12e-3": {**B16_TUNED, "train.steps": 520, "optim.learning_rate": 1.2e-2},
        },
        seeds=[0],
    )
