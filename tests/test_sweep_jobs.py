"""`sweep.py --jobs N`: a sweep's runs trained side by side, each in a process of its own with its
log; stopped by SIGTERM, the same command resumes it, and every run ends where a sweep trained one
after another in this process ends, to the bit."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import time

import pytest

from transformer.experiments import sweep
from transformer.run.metrics import read_metrics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNS = ("baseline", "attention_only", "rmsnorm")


def sweep_file(folder, cache_dir) -> str:
    path = os.path.join(folder, "three.py")
    with open(path, "w") as f:
        f.write(f"""def get_config():
    return dict(
        base="tiny",
        overrides={{"train.steps": 6, "train.log_every": 2, "train.eval_every": 2, "train.checkpoint_every": 2,
                   "train.sample_tokens": 0, "optim.warmup_steps": 2, "data.cache_dir": {cache_dir!r}}},
        variants={{"baseline": {{}}, "attention_only": {{"model.mlp_dim": 0}}, "rmsnorm": {{"model.norm": "rmsnorm"}}}},
    )
""")
    return path


def command(path, workdir, jobs=2) -> list[str]:
    return [sys.executable, os.path.join(ROOT, "sweep.py"), "--sweep", path, "--workdir", str(workdir), "--jobs", str(jobs)]


def val_losses(workdir, name) -> list[tuple[int, float]]:
    return [(r["step"], r["val_loss"]) for r in read_metrics(os.path.join(workdir, name, "metrics.jsonl"))
            if "val_loss" in r]


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """The sweep one run after another in this process; then side by side, stopped by SIGTERM once its
    runs have started, and run again."""
    folder = tmp_path_factory.mktemp("sweep")
    path = sweep_file(folder, str(folder / "tokens"))
    with contextlib.redirect_stdout(io.StringIO()):
        assert sweep.run_sweep(path, str(folder / "one_by_one")) == 0
    workdir = folder / "side_by_side"
    stopped = subprocess.Popen(command(path, workdir), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               cwd=ROOT)
    deadline = time.time() + 120
    while not any(os.path.isdir(workdir / name / "checkpoints") for name in RUNS) and time.time() < deadline:
        time.sleep(0.2)  # until a run has saved a checkpoint: stopped while training
    stopped.send_signal(signal.SIGTERM)
    out, err = stopped.communicate(timeout=120)
    again = subprocess.run(command(path, workdir), capture_output=True, text=True, cwd=ROOT, timeout=300)
    return folder, workdir, (stopped.returncode, out, err), again


@pytest.mark.slow
def test_sigterm_stops_every_run_and_says_how_to_go_on(swept):
    _, workdir, (code, out, err), _ = swept
    assert code == 143, err
    assert "rerun the same command to resume" in err and "Traceback" not in err
    assert out.count("started ") == 2  # two at once; the third had not started


@pytest.mark.slow
def test_the_rerun_finishes_every_run_as_one_after_another_would(swept):
    folder, workdir, _, again = swept
    assert again.returncode == 0, again.stderr
    assert "3 of 3 runs finished" in again.stdout
    for name in RUNS:
        reference = val_losses(folder / "one_by_one", name)
        assert [s for s, _ in reference] == [2, 4, 6]
        side_by_side = dict(val_losses(workdir, name))  # a run stopped between evaluations also has its stop's
        assert [(s, side_by_side[s]) for s, _ in reference] == reference  # to the bit
        assert os.path.isfile(workdir / "logs" / f"{name}.log")
    with open(workdir / "results.md") as f:
        table = f.read()
    assert all(name in table for name in RUNS)
    resumed = [name for name in RUNS if "resuming at step" in open(workdir / "logs" / f"{name}.log").read()]
    assert resumed, "no run resumed from the checkpoint the stop left"


@pytest.mark.slow
def test_jobs_below_one_is_a_one_line_error(tmp_path):
    done = subprocess.run(command(os.path.join(ROOT, "configs", "sweeps", "tiny.py"), tmp_path, jobs=0),
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "error: --jobs=0: give the number of runs to train at once, 1 or more"]
