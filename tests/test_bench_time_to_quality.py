"""bench/time_to_quality.py and its PyTorch side, bench/torch_gpt.py: a tiny round of (c) and (a) gives
the table and the figure; the PyTorch run trains on train.py's batches with optim.py's schedule; the
time to a target is interpolated between evaluations; train.py's evaluation rows carry elapsed_seconds."""

import os
import subprocess
import sys

import numpy as np
import pytest

from bench import time_to_quality, torch_gpt
from bench.steps import model_config, torch_gpt2
from transformer.data.batches import batch_at
from transformer.run.metrics import read_metrics
from transformer.training.optimizer import make_schedule

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "configs", "tiny.py")
STEPS = 20


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """One round of (c) and (a) on configs/tiny.py, 20 steps, an evaluation every 10, a loss logged every step."""
    tmp = tmp_path_factory.mktemp("ttq")
    overrides = [f"--config.data.cache_dir={tmp / 'tokens'}", "--config.train.log_every=1",
                 "--config.train.sample_tokens=0"]
    done = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "time_to_quality.py"), "--default", TINY, "--lecture", TINY,
         "--sides", "ca", "--rounds", "1", "--steps", str(STEPS), "--eval_every", "10",
         "--workdir", str(tmp / "runs"), "--figure", str(tmp / "ttq.png"), *overrides],
        capture_output=True, text=True, cwd=ROOT, timeout=600, env=dict(os.environ, PYTHONPATH=ROOT))
    assert done.returncode == 0, done.stderr[-3000:]
    config = time_to_quality.load_config(TINY, [f"--config.train.steps={STEPS}", *overrides])
    return done.stdout, tmp, config


def rows(table: str) -> dict[str, list[str]]:
    """{side: its cells} of the table's rows."""
    return {cells[0]: cells for cells in ([c.strip() for c in line.strip("|").split("|")]
                                          for line in table.splitlines() if line.startswith("| ("))}


@pytest.mark.slow
def test_the_table_has_a_row_per_side_and_the_figure_is_written(tiny):
    out, tmp, _ = tiny
    table = rows(out)
    assert set(table) == {"(c) PyTorch GPT-2", "(a) default recipe"}
    reference = read_metrics(tmp / "runs" / "round1" / "c" / "metrics.jsonl")
    final = [r for r in reference if "val_loss" in r][-1]
    assert final["step"] == STEPS
    assert f"round 1: {final['val_loss']:.4f}" in out  # the target: (c)'s loss at its last step
    side, config, round_, setup, steps, seconds, ratio, loss, process, whole = table["(c) PyTorch GPT-2"]
    assert (config, round_, steps, ratio, loss, whole) == ("`configs/tiny.py`", "1", str(STEPS), "1.00",
                                                          f"{final['val_loss']:.4f}", "1.00")
    assert 0 < float(setup) < float(seconds) == pytest.approx(final["elapsed_seconds"], abs=0.05)
    ours = [r for r in read_metrics(tmp / "runs" / "round1" / "a" / "metrics.jsonl") if "val_loss" in r]
    assert table["(a) default recipe"][7] == f"{ours[-1]['val_loss']:.4f}"
    # the whole run's ratio: the two processes' seconds, as the table prints them
    a_process, a_whole = table["(a) default recipe"][8:10]
    assert float(a_whole) == pytest.approx(float(a_process) / float(process), abs=0.03)
    assert f"Mean over the rounds of whole run x (c): (c) PyTorch GPT-2 1.00; (a) default recipe {a_whole}." in out
    assert (tmp / "ttq.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_train_py_evaluations_carry_the_time_since_the_process_started(tiny):
    _, tmp, _ = tiny
    metrics = read_metrics(tmp / "runs" / "round1" / "a" / "metrics.jsonl")
    setup = metrics[0]
    evals = [r for r in metrics if "val_loss" in r]
    assert [r["step"] for r in evals] == [10, 20]
    times = [setup["elapsed_seconds"]] + [r["elapsed_seconds"] for r in evals]
    assert setup["elapsed_seconds"] > setup["compile_seconds"] > 0  # imports and data come before compiling
    assert times == sorted(times) and len(set(times)) == 3


@pytest.mark.slow
def test_the_pytorch_run_trains_on_train_pys_first_batch(tiny):
    """Its step-1 loss is that of its initial model on batch_at(seed, step 0), not on another batch."""
    _, tmp, config = tiny
    train_tokens, _ = torch_gpt.load_tokens(config)
    t = config.train
    first = batch_at(train_tokens, seed=t.seed, step=0, batch_size=t.batch_size, seq_len=t.seq_len)
    np.testing.assert_array_equal(torch_gpt.training_batch(config, train_tokens, 0)[0], first[0])
    logged = {r["step"]: r["loss"] for r in read_metrics(tmp / "runs" / "round1" / "c" / "metrics.jsonl")
              if "loss" in r}
    model = torch_gpt.init_model(config)
    loss = {s: torch_gpt.evaluate(model, [torch_gpt.as_torch(torch_gpt.training_batch(config, train_tokens, s))])
            for s in (0, 1)}
    assert logged[1] == pytest.approx(loss[0], rel=1e-5)
    assert logged[1] != pytest.approx(loss[1], rel=1e-3)


@pytest.mark.slow
def test_the_pytorch_run_follows_optim_pys_schedule(tiny):
    _, tmp, config = tiny
    logged = {r["step"]: r["learning_rate"] for r in read_metrics(tmp / "runs" / "round1" / "c" / "metrics.jsonl")
              if "learning_rate" in r}
    schedule = make_schedule(config.optim, STEPS)
    assert sorted(logged) == list(range(1, STEPS + 1))
    for step, rate in logged.items():  # step s's update used the rate of the s-1 steps before it
        assert rate == pytest.approx(float(schedule(step - 1)), rel=1e-6)


def test_time_to_target_interpolates_between_evaluations():
    evals = [{"step": 10, "val_loss": 3.0, "elapsed_seconds": 5.0},
             {"step": 20, "val_loss": 2.0, "elapsed_seconds": 9.0},
             {"step": 30, "val_loss": 1.5, "elapsed_seconds": 13.0}]
    assert time_to_quality.time_to_target(evals, 2.5) == pytest.approx((15.0, 7.0))
    assert time_to_quality.time_to_target(evals, 2.0) == pytest.approx((20.0, 9.0))
    assert time_to_quality.time_to_target(evals, 3.5) == (10.0, 5.0)  # the first evaluation is below it
    assert time_to_quality.time_to_target(evals, 1.0) is None


def test_torch_gpt2_refuses_an_architecture_gpt2_cannot_express():
    config = time_to_quality.load_config(TINY, ["--config.model.position=rope"])
    with pytest.raises(ValueError, match=r"'position': 'rope'"):
        torch_gpt2(model_config(config.model))


@pytest.mark.parametrize("argv, committed", [
    ([], True),  # the page's own comparison: every side, the default configs and steps
    (["--sides", "ca", "--rounds", "1"], False),
    (["--default", "configs/tiny.py"], False),
    (["--quick"], False),
    (["--config.train.seed=1"], False),
    (["--sides", "ca", "--figure", "elsewhere.png"], False),
])
def test_only_the_pages_own_comparison_redraws_the_committed_figure(argv, committed):
    args, _ = time_to_quality.parse(argv)
    assert (args.figure == time_to_quality.DEFAULT_FIGURE) == committed
    if "--figure" in argv:
        assert args.figure == "elsewhere.png"
