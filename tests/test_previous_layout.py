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


BEFORE_REDESIGN = "tests/data/before_redesign_run"  # configs/tiny.py with position='rope', num_registers=2
# Written and measured by commit d36d90c (the package before the core redesign: one cache of per-layer
# tuples, the table branch in the decoder): `python train.py --config configs/tiny.py --workdir RUN
# --config.train.steps=20 --config.train.eval_every=20 --config.train.checkpoint_every=20
# --config.train.sample_tokens=0 --config.model.position=rope --config.model.num_registers=2`, its
# checkpoint at step 20; then that commit's Decoder and generate on the text and prompts below.
LOSS_BEFORE_REDESIGN = 3.667794704437256
SAMPLED_BEFORE_REDESIGN = [[109, 163, 44, 171, 73, 109, 104, 101, 92, 171, 111, 101],
                           [116, 111, 111, 32, 48, 58, 46, 104, 73, 10, 185, 99]]


@pytest.mark.slow  # make test-all only
def test_a_run_written_before_the_redesign_loads_and_samples_the_same(tmp_path):
    """Its parameters, config and tokenizer load; the forward pass gives that commit's loss, and sampling
    two ragged prompts through today's per-layer cache (registers and RoPE) draws the same tokens."""
    from transformer.sampling.sampler import generate

    cfg, params, tokenizer = restore_for_inference(str(shutil.copytree(BEFORE_REDESIGN, tmp_path / "run")))
    assert cfg.num_registers == 2 and cfg.position == "rope" and count_params(params) == 83_584
    ids = np.array([list(tokenizer.encode(TEXT))])
    logits = Decoder(cfg).apply({"params": params}, ids[:, :-1])[0]
    logp = jax.nn.log_softmax(np.asarray(logits, np.float64), -1)
    np.testing.assert_allclose(float(-np.take_along_axis(logp, ids[:, 1:, None], -1).mean()),
                               LOSS_BEFORE_REDESIGN, rtol=1e-5)
    prompts = [list(tokenizer.encode("ROMEO:")), list(tokenizer.encode("JULIET: O"))]
    out = generate(params, cfg, prompts, jax.random.key(0), 12)
    assert np.asarray(out.tokens).tolist() == SAMPLED_BEFORE_REDESIGN
