"""train.py end to end, in subprocesses, on configs/tiny.py and the bundled corpus."""

import json
import os
import signal
import subprocess
import time

import pytest

from tests.helpers.cli import ROOT, losses, run, train_cmd
from transformer.run.metrics import read_metrics



@pytest.mark.slow
def test_loss_goes_down_and_run_leaves_checkpoints_and_sample(tmp_path):
    out = run(tmp_path / "run", "--config.train.log_every=1", "--config.train.steps=40")
    assert out.returncode == 0, out.stderr[-3000:]
    loss = losses(tmp_path / "run")
    assert sorted(loss) == list(range(1, 41))
    assert sum(loss[s] for s in range(36, 41)) < 0.8 * sum(loss[s] for s in range(1, 6))
    rows = read_metrics(os.path.join(tmp_path / "run", "metrics.jsonl"))
    evals = [r for r in rows if "val_loss" in r]
    assert {r["step"] for r in evals} == {20, 40}
    assert all(r["val_bits_per_byte"] > 0 and r["val_perplexity"] > 1 for r in evals)
    assert all(r["tokens_per_sec"] > 0 and 0 < r["mfu"] for r in rows if "loss" in r)
    assert sorted(os.listdir(tmp_path / "run" / "checkpoints")) == ["20", "40"]
    assert os.listdir(tmp_path / "run" / "tb")  # TensorBoard event files
    assert "--- sample ---" in out.stdout


@pytest.mark.parametrize("optimizer", ["adamw", pytest.param("muon", marks=pytest.mark.slow)])
def test_resume_is_exact(tmp_path, optimizer):
    """20 steps straight == 10 steps, stop, resume, 10 more (bitwise on CPU), with either optimizer."""
    common = ["--config.train.log_every=1", "--config.train.steps=20", "--config.train.checkpoint_every=10",
              "--config.train.sample_tokens=0", f"--config.optim.name={optimizer}"]
    straight = run(tmp_path / "a", *common)
    assert straight.returncode == 0, straight.stderr[-3000:]
    first = run(tmp_path / "b", *common, "--config.train.run_steps=10")
    assert first.returncode == 0, first.stderr[-3000:]
    assert max(losses(tmp_path / "b")) == 10
    second = run(tmp_path / "b", *common)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed from the checkpoint at step 10" in second.stdout
    assert losses(tmp_path / "a") == losses(tmp_path / "b")  # exact float equality, every step


def wait_for_step(workdir, step, timeout=180):
    """Blocks until metrics.jsonl records `step` (training is running)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if (workdir / "metrics.jsonl").exists() and max(losses(workdir), default=0) >= step:
            return
        time.sleep(0.05)
    raise AssertionError(f"training did not reach step {step} in {timeout} s")


@pytest.mark.slow
def test_kill_9_at_any_moment_then_resume(tmp_path):
    """SIGKILL while training and saving (a checkpoint every step) loses nothing already saved, and
    every loss logged, by the killed runs and by the resumed one, equals an unbroken run's, bitwise."""
    workdir = tmp_path / "k"
    args = ["--config.train.steps=400", "--config.train.checkpoint_every=1", "--config.train.log_every=1",
            "--config.train.sample_tokens=0", "--config.train.keep_checkpoints=2"]
    logged = []  # each killed run's {step: loss}, read before the next run trims the rows past its checkpoint
    for delay in (0.0, 0.13, 0.29):  # kill at different moments of the step/save cycle
        before = max(losses(workdir), default=0) if (workdir / "metrics.jsonl").exists() else 0
        proc = subprocess.Popen(train_cmd(workdir, *args), cwd=ROOT, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        wait_for_step(workdir, before + 3)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        logged.append(losses(workdir))
    complete = max(int(d) for d in os.listdir(workdir / "checkpoints") if d.isdigit())
    out = run(workdir, *args, "--config.train.run_steps=2")
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"resumed from the checkpoint at step {complete}" in out.stdout
    resumed = losses(workdir)
    assert sorted(resumed) == list(range(1, complete + 3))  # each step once, the killed rows past `complete` redone
    last = max(max(run_losses) for run_losses in logged)
    unbroken = run(tmp_path / "u", *args, "--config.train.checkpoint_every=400",
                   f"--config.train.run_steps={max(last, complete + 2)}")
    assert unbroken.returncode == 0, unbroken.stderr[-3000:]
    expected = losses(tmp_path / "u")
    for run_losses in [*logged, resumed]:
        assert run_losses == {s: expected[s] for s in run_losses}  # bitwise, every step


@pytest.mark.slow
@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_saves_then_exits_non_zero(tmp_path, sig, code):
    """SIGTERM / Ctrl-C while training: a checkpoint is saved, and the exit code says the run was
    stopped (128 + the signal), so `train.py ... && sample.py ...` does not go on."""
    workdir = tmp_path / "t"
    proc = subprocess.Popen(train_cmd(workdir, "--config.train.steps=100000", "--config.train.log_every=1",
                                      "--config.train.checkpoint_every=100000"),
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 180
    while time.time() < deadline and not ((workdir / "metrics.jsonl").exists() and losses(workdir)):
        time.sleep(0.2)
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == code, stderr[-3000:]
    saved = [int(s) for s in os.listdir(workdir / "checkpoints")]
    assert len(saved) == 1 and saved[0] >= 1
    assert f"{sig.name}: stopped after saving the checkpoint at step {saved[0]}" in stderr
    assert "Traceback" not in stderr


@pytest.mark.slow
def test_a_signal_during_set_up_ends_cleanly_and_writes_nothing(tmp_path):
    """Ctrl-C at any moment of the set-up (imports, tokenizing, init, compiling) exits 130, cleanly."""
    for i, delay in enumerate((0.3, 1.0, 2.5, 4.0, 6.0)):
        workdir = tmp_path / f"s{i}"
        proc = subprocess.Popen(train_cmd(workdir, "--config.train.steps=100000"), cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
        if "model:" in stdout:  # set-up was over: the run stopped at a step instead, after saving
            assert proc.returncode == 130 and os.listdir(workdir / "checkpoints"), stderr[-3000:]
            continue
        assert proc.returncode == 130, (delay, proc.returncode, stderr[-3000:])
        assert not workdir.exists()


@pytest.mark.slow
def test_bad_override_fails_clearly(tmp_path):
    out = run(tmp_path / "bad", "--config.model.num_heads=5")
    assert out.returncode != 0
    assert "num_heads=5" in out.stderr and "d_model=64" in out.stderr
    assert "Traceback" not in out.stderr
    out = run(tmp_path / "bad2", "--config.train.stpes=3")
    assert out.returncode != 0 and "stpes" in out.stderr


@pytest.mark.slow
def test_diverged_loss_stops_and_keeps_last_good_checkpoint(finished_run):
    """Resumed at step 4 with a learning rate that overflows: the run stops at step 5, saving nothing."""
    bad = run(finished_run, "--config.train.steps=8", "--config.optim.learning_rate=1e38")
    assert bad.returncode == 1
    assert "became" in bad.stderr and "at step 5" in bad.stderr and "Traceback" not in bad.stderr
    assert sorted(os.listdir(finished_run / "checkpoints")) == ["2", "4"]


@pytest.mark.slow
def test_checkpoint_of_another_model_is_refused(finished_run):
    out = run(finished_run, "--config.train.steps=6", "--config.model.d_model=32")
    assert out.returncode == 1
    assert "d_model: checkpoint 64, config 32" in out.stderr and "--workdir" in out.stderr


@pytest.mark.slow
def test_bpe_run_saves_its_tokenizer(tmp_path):
    workdir = tmp_path / "bpe"
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("To be, or not to be, that is the question.\n" * 400)
    out = run(workdir, "--config.data.tokenizer=bpe", "--config.model.vocab_size=270",  # the text gives 280
              f"--config.data.path={corpus}", "--config.train.steps=3", "--config.train.sample_tokens=0")
    assert out.returncode == 0, out.stderr[-3000:]
    kind = json.loads((workdir / "tokenizer" / "tokenizer_kind.json").read_text())
    assert kind == {"kind": "bpe"}
