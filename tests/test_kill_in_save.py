"""A kill -9 inside a checkpoint save, the first one included, costs nothing: the same command
resumes (afresh when no save completed, saying so) and every loss it logs equals, bitwise, the one
an unbroken run logs. The kill is placed inside the save by a test-only hook
(checkpoint.KILL_IN_SAVE), not by timing."""

from __future__ import annotations

import os
import signal

import pytest

from tests.helpers.cli import losses, run
from transformer.run.checkpoint import KILL_IN_SAVE, latest_step
from transformer.run.metrics import read_metrics

pytestmark = pytest.mark.slow
ARGS = ["--config.train.steps=6", "--config.train.checkpoint_every=2", "--config.train.eval_every=2",
        "--config.train.log_every=1", "--config.train.sample_tokens=0"]


def killed_in_save(workdir, step):
    """train.py killed (SIGKILL) while it writes checkpoint `step`; returns its output and the losses
    it had logged."""
    out = run(workdir, *ARGS, env={**os.environ, KILL_IN_SAVE: str(step)})
    assert out.returncode == -signal.SIGKILL, out.stderr[-3000:]
    return out, losses(workdir)


def test_a_kill_in_any_save_resumes_with_the_losses_of_an_unbroken_run(tmp_path):
    unbroken = run(tmp_path / "unbroken", *ARGS)
    assert unbroken.returncode == 0, unbroken.stderr[-3000:]
    expected = losses(tmp_path / "unbroken")
    workdir = tmp_path / "killed"

    _, logged = killed_in_save(workdir, 2)  # the first save
    assert latest_step(workdir) is None and os.path.isdir(workdir / "checkpoints")  # no complete checkpoint
    assert logged == {s: expected[s] for s in logged} and 2 in logged

    out, logged = killed_in_save(workdir, 4)  # the same command starts afresh, then dies in its second save
    assert "no complete checkpoint in" in out.stdout and "starting the run afresh" in out.stdout
    assert "Traceback" not in out.stderr
    assert latest_step(workdir) == 2
    assert logged == {s: expected[s] for s in (1, 2, 3, 4)}

    out = run(workdir, *ARGS)  # resumes from step 2
    assert out.returncode == 0, out.stderr[-3000:]
    assert "resumed from the checkpoint at step 2" in out.stdout
    assert losses(workdir) == expected  # bitwise, every step
    steps = [r["step"] for r in read_metrics(str(workdir / "metrics.jsonl")) if "loss" in r]
    assert steps == sorted(set(steps)) == list(range(1, 7))  # each step once: the killed rows were redone
