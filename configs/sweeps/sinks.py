"""Watching an attention sink form: configs/sinks.py trained plain, with a sink logit, with registers,
and plain with a fixed start token at the head of every window.

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
            # plain again, every window begun by byte 0 (absent from the text): a fixed start token, as a BOS
            "start_token": {"data.start_token": 0},
        },
    )
