"""A sparse autoencoder on a trained run's named point, its activations captured on the fly.

    python train.py --config configs/sae.py --workdir runs/sae                # after `make train`
    python train.py --config configs/sae.py --workdir runs/sae_jumprelu --config.sae.architecture=jumprelu

train.py hands a config with an `sae` section to transformer/analysis/sae/training.py. The defaults
train a TopK SAE 4x the width of the default model's residual stream after layer 1 (of 4) on 2M
activations, one pass, in a few minutes on a CPU; docs/experiments/sae.md reads it.
"""

from ml_collections import ConfigDict


def get_config():
    return ConfigDict(dict(sae=dict(
        run="runs/shakespeare",  # the trained run whose activations it reads (`make train`)
        data_path="",  # its text, if not at the run's saved data.path ("": there, or the bundled plays)
        point="blocks.1.resid_post",  # any point of shape [B, T, width] (transformer/model/points.py)
        architecture="topk",  # or "jumprelu"
        features=512,  # N, the dictionary's size
        k=16,  # TopK: features active per token
        # JumpReLU: the L0 penalty's weight against the fraction of variance unexplained, the thresholds'
        # start and the straight-through window. Adam moves a threshold by about learning_rate a step, so
        # they start near the pre-activations' scale (tried briefly on the default run; not tuned).
        l0_coefficient=1e-2,
        threshold=5.0,
        bandwidth=2.0,
        learning_rate=1e-3,
        steps=2000,
        batch_size=1024,  # activations per SAE step
        model_batches=8,  # model batches of windows per shuffled chunk of activations
        model_batch_size=32,  # windows per model batch
        seq_len=128,  # tokens per window (the run's context)
        eval_batches=2,  # validation batches of windows for the evaluation
        log_every=100,
        eval_every=500,
        seed=0,
    )))
