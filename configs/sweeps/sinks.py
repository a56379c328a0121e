"""Watching an attention sink form: configs/sinks.py trained plain, with a sink logit, with registers.

    python sweep.py --sweep configs/sweeps/sinks.py --workdir runs/sweeps/sinks
    make sweep SWEEP=configs/sweeps/sinks.py                   # the same

notebooks/attention_sinks.ipynb trains these runs if they are missing and plots them.
"""


def get_config():
    return dict(
        base="sinks",
        variants={
            "plain": {},
            "sink": {"model.attention_sink": True},
            "registers": {"model.num_registers": 4},
        },
    )
