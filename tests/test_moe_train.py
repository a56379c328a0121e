"""configs/moe.py from the command line: it trains, logs each expert's load, and resumes exactly."""

import os

import pytest

from tests.helpers.cli import ROOT, losses, run
from transformer.run.metrics import read_metrics

MOE = os.path.join(ROOT, "configs", "moe.py")
SHORT = ["--config.train.log_every=1", "--config.train.steps=12", "--config.train.checkpoint_every=6",
         "--config.train.eval_every=6", "--config.train.eval_batches=1", "--config.train.sample_tokens=0",
         "--config.optim.warmup_steps=2"]


@pytest.mark.slow
def test_the_moe_config_trains_logs_expert_load_and_resumes_exactly(tmp_path):
    """12 steps straight == 6 steps, stop, resume, 6 more (bitwise on CPU); every row logs the load of
    each of the 4 experts of both layers, 2 experts per token."""
    straight = run(tmp_path / "a", *SHORT, config=MOE)
    assert straight.returncode == 0, straight.stderr[-3000:]
    first = run(tmp_path / "b", *SHORT, "--config.train.run_steps=6", config=MOE)
    assert first.returncode == 0, first.stderr[-3000:]
    second = run(tmp_path / "b", *SHORT, config=MOE)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed from the checkpoint at step 6" in second.stdout
    assert losses(tmp_path / "a") == losses(tmp_path / "b")  # exact float equality, every step
    for row in (r for r in read_metrics(os.path.join(tmp_path / "a", "metrics.jsonl")) if "loss" in r):
        loads = [[row[f"load/{layer}/{e}"] for e in range(4)] for layer in range(2)]
        assert all(abs(sum(layer) - 2.0) < 1e-5 for layer in loads) and row["balance_loss"] >= 2.0 - 1e-5
