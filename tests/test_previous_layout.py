"""A run written before the package moved into model/ data/ training/ sampling/ analysis/ still loads.

tests/data/previous_layout_run is configs/tiny.py trained 40 steps by the flat layout (commit 24c7015,
`python train.py --config configs/tiny.py`; its checkpoint at step 40, config and tokenizer). The
loss below was computed from it by that commit's code; the same numbers from today's code mean the
checkpoint's parameter tree, config and tokenizer are read as they were written.
"""

from __future__ import annotations

import shutil

import jax
import numpy as np
import pytest

from transformer import Decoder, count_params
from transformer.run.checkpoint import restore_for_inference

RUN = "tests/data/previous_layout_run"
TEXT = "ROMEO: But soft, what light through yonder window breaks?"
LOSS_BY_PREVIOUS_LAYOUT = 3.4710588455200195  # mean next-byte cross-entropy of TEXT, nats


@pytest.fixture
def run(tmp_path):
    """A copy: orbax may write next to a checkpoint it opens."""
    return shutil.copytree(RUN, tmp_path / "run")


@pytest.mark.slow  # make test-all only (the default set's time: docs/performance.md)
def test_previous_layout_run_loads_with_the_same_numbers(run):
    cfg, params, tokenizer = restore_for_inference(str(run))
    assert count_params(params) == 87_552
    ids = np.array([list(tokenizer.encode(TEXT))])
    out = Decoder(cfg).apply({"params": params}, ids[:, :-1])
    logits = out[0] if isinstance(out, tuple) else out
    logp = jax.nn.log_softmax(np.asarray(logits, np.float64), -1)
    loss = float(-np.take_along_axis(logp, ids[:, 1:, None], -1).mean())
    np.testing.assert_allclose(loss, LOSS_BY_PREVIOUS_LAYOUT, rtol=1e-5)
