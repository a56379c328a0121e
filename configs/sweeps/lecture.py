"""The lecture's comparisons: the default Shakespeare model and eleven variants, each changing one thing.

    make sweep SWEEP=configs/sweeps/lecture.py      # = python sweep.py --sweep configs/sweeps/lecture.py
                                                    #            --workdir runs/sweeps/lecture

Budget: 300 steps of 32 x 128 bytes per run (1.2M tokens, a quarter of an epoch; the learning rate
schedule, configs/shakespeare.py's 100 warm-up steps then cosine decay, spans the 300), evaluated every
50 steps, no sample at the end: the twelve runs take well under an hour on a 2-core CPU (the README's
"The lecture's design choices, measured" gives the run's results and time). Interrupted, the same
command resumes.

Matched parameter counts. The base (configs/shakespeare.py: d_model 128, 4 layers, 4 heads, MLP 4d =
512, learned positions, layer norm with gain and bias, pre-norm) has 842,496 parameters. Grouped-query,
multi-query and latent attention shrink the key / value projections, so each widens the MLP to make up
for it; one more unit of mlp_dim adds 4 layers x (2 x 128 + 1) = 1,028 parameters:

    gqa  2 key/value heads    k, v: 128 -> 64 outputs   saves 66,048   mlp_dim 576 -> 842,240 (-0.03%)
    mqa  1 key/value head     k, v: 128 -> 32 outputs   saves 99,072   mlp_dim 608 -> 842,112 (-0.05%)
    mla  64-wide latent       (the KV cache of mqa)     saves 33,280   mlp_dim 544 -> 842,112 (-0.05%)

Left unmatched, and why: the norm variants drop gains or biases (-0.27% without either, -0.14% for
RMSNorm, -0.03% post-norm: no final norm), under 1%; sinusoidal, rotary and no positions drop the
learned position table (16,384 parameters, -1.9%), a lookup that costs no compute per token, which a
wider MLP would add; and the MLP widths change the parameter count by design (0: -63%, 5d: +16%).
tests/test_sweep.py checks these counts.
"""


def get_config():
    return dict(
        base="shakespeare",
        overrides={
            "train.steps": 300,
            "train.eval_every": 50,  # 8 points per curve in val_loss.png
            "train.checkpoint_every": 100,  # a killed run loses at most 100 steps
            "train.sample_tokens": 0,  # sample a run afterwards: make sample RUN=runs/sweeps/lecture/NAME
        },
        variants={
            "baseline": {},  # layer norm with gain and bias, pre-norm, MLP 4d, learned positions, MHA
            # norms
            "layernorm_plain": {"model.norm_scale": False, "model.norm_bias": False},  # no gain, no bias
            "rmsnorm": {"model.norm": "rmsnorm"},  # with a gain
            "postnorm": {"model.prenorm": False},  # x = norm(x + f(x)), as in the original transformer
            # MLP width (4d = 512 is the base)
            "mlp_0": {"model.mlp_dim": 0},  # attention-only blocks: no MLP, no MLP norm
            "mlp_5d": {"model.mlp_dim": 640},
            # positions (learned is the base)
            "sinusoidal": {"model.position": "sinusoidal"},
            "rope": {"model.position": "rope"},
            "no_positions": {"model.position": "none"},  # only the causal mask tells positions apart
            # attention (MHA is the base), parameter counts matched through mlp_dim (see above)
            "gqa": {"model.num_kv_heads": 2, "model.mlp_dim": 576},
            "mqa": {"model.num_kv_heads": 1, "model.mlp_dim": 608},
            "mla": {"model.attention": "mla", "model.kv_latent_dim": 64, "model.mlp_dim": 544},
        },
    )
