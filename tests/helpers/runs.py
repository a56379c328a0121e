"""Short training runs in this process, for the tests of the loop's behaviour (resume, locks,
faults): configs/tiny.py with the token cache beside the run, trained quietly."""

from __future__ import annotations

import contextlib
import io

from configs import tiny
from transformer.experiments.catalog import train


def tiny_config(tmp_path, steps: int = 6, every: int = 2):
    """configs/tiny.py for `steps` steps, evaluating and saving every `every`, no sample."""
    c = tiny.get_config()
    c.data.cache_dir = str(tmp_path / "tokens")
    c.train.update(dict(steps=steps, eval_every=every, checkpoint_every=every, log_every=1, sample_tokens=0))
    return c


def quiet_train(config, workdir) -> dict:
    """loop.train without its printed lines; returns the last evaluation."""
    with contextlib.redirect_stdout(io.StringIO()):
        return train(config, str(workdir), progress=False)
