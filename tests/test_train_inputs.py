"""train.py with bad or unusual input, as a new user would type it: each a one-line error before
anything is compiled or written, and nothing silently wrong (issue: reliability and the first run)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.helpers.cli import ROOT, TINY, learning_rates, losses, run, sample
from transformer.data.tokenizer import ByteTokenizer, save_tokenizer

pytestmark = pytest.mark.slow
QUICK = ("--config.train.steps=2", "--config.train.eval_every=2", "--config.train.checkpoint_every=2",
         "--config.train.sample_tokens=0", "--config.optim.warmup_steps=1")


def assert_one_line_error(out: subprocess.CompletedProcess, *fragments: str, code: int = 1) -> None:
    """Exit `code`, one line on stderr naming the problem, no traceback, nothing compiled."""
    assert out.returncode == code, (out.returncode, out.stdout[-2000:], out.stderr[-3000:])
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr[-3000:]
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    assert "model:" not in out.stdout  # the model line comes after compiling


@pytest.mark.parametrize("override, expected", [
    ("--config.train.stpes=3", "did you mean config.train.steps?"),
    ("--config.model.num_head=3", "did you mean config.model.num_heads?"),
    ("--config.bogus.x=1", "unknown config field config.bogus.x"),
    ("--config.train.steps=abc", "--config.train.steps=abc"),
])
def test_unknown_or_ill_typed_field_is_one_line_naming_the_closest(tmp_path, override, expected):
    out = run(tmp_path / "w", override)
    assert_one_line_error(out, expected, code=2)
    assert not (tmp_path / "w").exists()


def test_config_file_errors_and_the_default_from_any_folder(tmp_path):
    out = run(tmp_path / "w", config="no/such/config.py")
    assert_one_line_error(out, "'no/such/config.py': no such file", code=2)
    # A path relative to the repository, typed from elsewhere: the error says where the file is.
    out = run(tmp_path / "w", cwd=str(tmp_path), config="configs/tiny.py")
    assert_one_line_error(out, os.path.join(ROOT, "configs/tiny.py"), code=2)
    # No --config from another folder: the default config is found (the typo is then reported).
    cmd = [sys.executable, os.path.join(ROOT, "train.py"), "--workdir", str(tmp_path / "w"), "--config.train.stpes=1"]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=str(tmp_path), timeout=120)
    assert_one_line_error(out, "did you mean config.train.steps?", code=2)
    # The default config named by its absolute path: parsed once, not "defined twice".
    default = os.path.join(ROOT, "configs", "modern.py")
    out = subprocess.run([*cmd, "--config", default], capture_output=True, text=True, cwd=str(tmp_path), timeout=120)
    assert_one_line_error(out, "did you mean config.train.steps?", code=2)


@pytest.mark.parametrize("override, expected", [
    ("--config.train.batch_size=0", "train.batch_size=0 must be a positive integer"),
    ("--config.train.seq_len=0", "train.seq_len=0 must be a positive integer"),
    ("--config.train.seq_len=-4", "train.seq_len=-4 must be a positive integer"),
    ("--config.train.grad_accum=0", "train.grad_accum=0 must be a positive integer"),
    ("--config.optim.learning_rate=-0.001", "optim.learning_rate=-0.001 must be a number >= 0"),
    ("--config.optim.learning_rate=nan", "optim.learning_rate=nan"),
    ("--config.optim.min_lr_ratio=2", "optim.min_lr_ratio=2"),
    ("--config.data.tokenizer=bytepair", "data.tokenizer='bytepair'"),
])
def test_bad_training_field_is_one_line_before_compiling(tmp_path, override, expected):
    out = run(tmp_path / "w", override)
    assert_one_line_error(out, expected)
    assert not (tmp_path / "w").exists()


def test_bad_workdir_is_one_line(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert_one_line_error(run(a_file), "is a file, not a folder")
    assert_one_line_error(run(a_file / "run"), "cannot be created", "is a file")
    assert_one_line_error(run(""), "--workdir is empty")
    assert_one_line_error(run("/proc/no-such-run"), "cannot be written")


def test_a_failed_attempt_writes_nothing_and_the_corrected_run_uses_its_own_tokenizer(tmp_path):
    """The stale-tokenizer bug: a failed first attempt left workdir/tokenizer (bytes), and the
    corrected BPE command trained with it while config.json said bpe."""
    workdir = tmp_path / "w"
    failed = run(workdir, "--config.data.path=/no/such/corpus.txt", *QUICK)
    assert failed.returncode == 1 and "No text found" in failed.stderr
    assert not workdir.exists()  # nothing written before the set-up succeeded
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("To be, or not to be, that is the question.\n" * 300)
    ok = run(workdir, f"--config.data.path={corpus}", "--config.data.tokenizer=bpe",
             "--config.model.vocab_size=270", *QUICK)  # the text gives 280
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert f"training a 270-token BPE tokenizer on {corpus} ..." in ok.stdout  # a sign of the slow part
    assert json.loads((workdir / "tokenizer" / "tokenizer_kind.json").read_text()) == {"kind": "bpe"}
    saved = json.loads((workdir / "config.json").read_text())
    assert saved["data"]["tokenizer"] == "bpe" and saved["data"]["path"] == str(corpus)  # absolute


def test_a_bpe_larger_than_the_corpus_gives_is_refused_before_compiling(tmp_path):
    """#31: a 12-word corpus gives a ~300-token BPE; vocab_size=4096 trained a 4096-way head whose ids above
    ~300 no text encodes to (and that sample.py's decode dropped)."""
    corpus = tmp_path / "twelve_words.txt"
    corpus.write_text("one two three four five six seven eight nine ten eleven twelve\n")
    out = run(tmp_path / "w", f"--config.data.path={corpus}", "--config.data.tokenizer=bpe",
              "--config.model.vocab_size=4096", "--config.data.vocab_size=4096", *QUICK)
    assert_one_line_error(out, "the corpus gives a BPE of only", "not vocab_size=4096")
    size = int(re.search(r"--config.data.vocab_size=(\d+) --config.model.vocab_size=\1\b", out.stderr)[1])
    assert 256 < size < 4096
    assert not (tmp_path / "w").exists()


def test_a_config_file_whose_get_config_returns_a_dict_is_one_line(tmp_path):
    """#31: ml_collections takes the dict; the run then failed with an AttributeError traceback."""
    path = tmp_path / "dict_config.py"
    path.write_text("def get_config():\n    return {'train': {'steps': 3}}\n")
    for overrides in ((), ("--config.train.steps=4",)):
        out = run(tmp_path / "w", *overrides, config=str(path))
        assert_one_line_error(out, f"config file {path}: get_config() returned dict, not an ml_collections "
                                   "ConfigDict; build it with configs/common.base_config", code=2)
    assert not (tmp_path / "w").exists()


def test_a_tokenizer_left_in_the_workdir_is_checked_against_the_config(tmp_path):
    """A run that died before its first checkpoint left a byte tokenizer; a BPE config is refused
    with the difference named, not trained with the wrong tokenizer."""
    workdir = tmp_path / "w"
    save_tokenizer(ByteTokenizer(), workdir / "tokenizer")
    (workdir / "config.json").write_text(json.dumps({"data": {"tokenizer": "bytes", "vocab_size": 256, "path": ""}}))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("To be, or not to be, that is the question.\n" * 300)
    out = run(workdir, f"--config.data.path={corpus}", "--config.data.tokenizer=bpe",
              "--config.model.vocab_size=300", *QUICK)
    assert_one_line_error(out, "data.tokenizer: 'bytes' there, 'bpe' now", str(workdir / "tokenizer"))


def test_resuming_on_other_data_is_refused_naming_the_field(tmp_path):
    """A BPE trained on one corpus is not reused for another: the resume names data.path."""
    workdir = tmp_path / "w"
    small, other = tmp_path / "small.txt", tmp_path / "other.txt"
    small.write_text("To be, or not to be, that is the question.\n" * 300)
    other.write_text("Now is the winter of our discontent.\n" * 300)
    bpe = ("--config.data.tokenizer=bpe", "--config.model.vocab_size=270")  # both texts give more
    assert run(workdir, f"--config.data.path={small}", *bpe, *QUICK).returncode == 0
    out = run(workdir, f"--config.data.path={other}", *bpe, *QUICK[1:], "--config.train.steps=4")
    assert_one_line_error(out, "other data", "data.path", str(small), str(other))
    # Needle documents from the same corpus are other data too (they take bytes and a longer window).
    bytes_workdir = tmp_path / "bytes"
    assert run(bytes_workdir, f"--config.data.path={small}", *QUICK).returncode == 0
    out = run(bytes_workdir, f"--config.data.path={small}", *QUICK[1:], "--config.train.steps=4",
              "--config.train.seq_len=64", "--config.data.task=needle", "--config.data.needle.min_length=57",
              "--config.data.needle.max_length=58")
    assert_one_line_error(out, "other data", "data.task: checkpoint 'text', config 'needle'")


def test_steps_below_the_checkpoint_is_refused_and_equal_does_nothing(tmp_path):
    workdir = tmp_path / "w"
    assert run(workdir, *QUICK[1:], "--config.train.steps=4").returncode == 0
    config_json = (workdir / "config.json").read_text()
    out = run(workdir, *QUICK[1:], "--config.train.steps=2")
    assert_one_line_error(out, "train.steps=2 is below the checkpoint's step 4")
    same = run(workdir, *QUICK[1:], "--config.train.steps=4")
    assert same.returncode == 0 and "already complete at step 4" in same.stdout
    assert (workdir / "config.json").read_text() == config_json


def test_a_three_step_run_is_quiet(tmp_path):
    """Nothing but the model line, the progress bar, the evaluation lines and the summary; the
    libraries' INFO logs come back with --verbosity=0. The token cache defaults to the repository's
    .cache/tokens, wherever the command starts."""
    cmd = [sys.executable, os.path.join(ROOT, "train.py"), "--config", TINY, "--workdir", str(tmp_path / "w"),
           "--config.train.steps=3", "--config.train.eval_every=3", "--config.train.checkpoint_every=3",
           "--config.train.sample_tokens=0", "--config.optim.warmup_steps=1", "--config.train.log_every=1"]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=str(tmp_path), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stderr == ""
    lines = [line for line in out.stdout.replace("\r", "\n").splitlines() if line.strip() and "it/s" not in line
             and "?it" not in line and "%|" not in line]
    assert [line.split(":")[0] for line in lines] == ["model", "step 3", "done"], lines
    assert "compiled in" in lines[0] and "KV cache 1,024 bytes per token" in lines[0]
    assert "tokens/s training" in lines[-1]
    assert not (tmp_path / ".cache").exists() and os.path.isdir(os.path.join(ROOT, ".cache", "tokens"))
    saved = json.loads((tmp_path / "w" / "config.json").read_text())
    assert saved["data"]["cache_dir"] == os.path.join(ROOT, ".cache", "tokens")
    loud = subprocess.run(cmd + ["--verbosity=0", "--config.train.steps=4"], capture_output=True, text=True,
                          cwd=str(tmp_path), timeout=300)
    assert loud.returncode == 0 and "checkpoint_manager.py" in loud.stderr


def test_a_warm_up_as_long_as_the_run_warns_and_a_longer_one_is_refused(tmp_path):
    """#31: warmup_steps=100 with train.steps=4 warned "never decays" and trained with a 3-step warm-up."""
    out = run(tmp_path / "w", *QUICK[:-1], "--config.optim.warmup_steps=2")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "warning: the learning rate warms up for optim.warmup_steps=2 steps but decays over 2" in out.stderr
    out = run(tmp_path / "longer", *QUICK[:-1], "--config.optim.warmup_steps=100")
    assert out.returncode == 1 and "Traceback" not in out.stderr and "model:" not in out.stdout
    assert out.stderr.strip().splitlines()[-1] == (  # after run_config's warning line
        "error: optim.warmup_steps=100 is longer than train.steps=2: the warm-up would end early, at step 1; "
        "set --config.optim.warmup_steps=2 or fewer, or --config.train.steps=100 or more")
    assert not (tmp_path / "longer").exists()


def test_extending_a_finished_run_warns_unless_the_schedule_is_kept(tmp_path):
    """Raising train.steps re-spans the cosine (the learning rate jumps back up): a warning says so
    and names optim.decay_steps, which extends the finished schedule at its final rate."""
    workdir, kept = tmp_path / "w", tmp_path / "kept"
    base = ("--config.train.eval_every=4", "--config.train.checkpoint_every=4", "--config.train.sample_tokens=0",
            "--config.optim.warmup_steps=1", "--config.train.log_every=1")
    for w in (workdir, kept):
        assert run(w, *base, "--config.train.steps=4").returncode == 0
    respanned = run(workdir, *base, "--config.train.steps=8")
    assert respanned.returncode == 0
    assert "changes the learning rate schedule" in respanned.stderr
    assert "--config.optim.decay_steps=4" in respanned.stderr
    extended = run(kept, *base, "--config.train.steps=8", "--config.optim.decay_steps=4")
    assert extended.returncode == 0 and "warning" not in extended.stderr, extended.stderr
    lr = learning_rates(kept)
    final = 3e-3 * 0.1  # tiny.py's peak x min_lr_ratio
    assert all(abs(lr[s] - final) < 1e-9 for s in (5, 6, 7, 8)), lr
    assert learning_rates(workdir)[5] > 2 * final  # re-spanned: back up


def test_resuming_accepts_execution_changes_and_converts_the_layer_stack(tmp_path):
    """dtype, remat, dropout, attention_impl and scan_layers change how the parameters are computed,
    not what they are: a resume with them changed goes on (saying so), and a scan_layers change gives
    the losses of an unbroken run."""
    straight, changed = tmp_path / "a", tmp_path / "b"
    common = ("--config.train.eval_every=4", "--config.train.checkpoint_every=4", "--config.train.sample_tokens=0",
              "--config.train.log_every=1")
    assert run(straight, *common, "--config.train.steps=8").returncode == 0
    assert run(changed, *common, "--config.train.steps=8", "--config.train.run_steps=4").returncode == 0
    out = run(changed, *common, "--config.train.steps=8", "--config.model.scan_layers=False",
              "--config.model.remat=True", "--config.model.attention_impl=xla")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "resuming with other execution settings: attention_impl: 'reference' -> 'xla'" in out.stdout
    assert "scan_layers: True -> False" in out.stdout
    a, b = losses(straight), losses(changed)
    assert sorted(b) == list(range(1, 9))
    assert all(abs(a[s] - b[s]) < 1e-4 * abs(a[s]) for s in a), (a, b)
    bf16 = run(changed, *common, "--config.train.steps=9", "--config.model.dtype=bfloat16",
               "--config.model.dropout=0.1")
    assert bf16.returncode == 0, bf16.stderr[-3000:]
    assert "dtype: 'float32' -> 'bfloat16'" in bf16.stdout
    other = run(changed, *common, "--config.train.steps=10", "--config.model.d_model=32")
    assert_one_line_error(other, "d_model: checkpoint 64, config 32")


def test_a_damaged_checkpoint_gives_one_clear_error(tmp_path):
    """The error names the damaged folder, without 'Event loop is closed' tracebacks around it."""
    workdir = tmp_path / "w"
    assert run(workdir, *QUICK).returncode == 0
    for root, _, files in os.walk(workdir / "checkpoints" / "2" / "state"):
        for name in files:
            if os.sep + "d" in root:  # the array data, not the metadata
                with open(os.path.join(root, name), "r+b") as f:
                    f.truncate(8)
    for _ in range(3):  # the noise came from a race: try a few times
        out = run(workdir, *QUICK[1:], "--config.train.steps=4")
        assert_one_line_error(out, "is damaged", str(workdir / "checkpoints" / "2"))
        out = sample("--workdir", str(workdir), "--max_new_tokens", "3")
        assert out.returncode == 1 and "Event loop" not in out.stderr and "is damaged" in out.stderr


def test_a_mesh_that_does_not_divide_the_model_is_one_line_naming_the_field(tmp_path):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=3")
    out = run(tmp_path / "w", *QUICK, "--config.mesh.tensor=3", env=env)  # vocab 256, 4 heads
    assert_one_line_error(out, "model.vocab_size", "mesh.rules.vocab", "mesh.tensor")
    out = run(tmp_path / "w", *QUICK, "--config.mesh.tensor=3", "--config.mesh.rules.vocab=", env=env)
    assert_one_line_error(out, "model.num_heads", "mesh.rules.heads")
    assert not (tmp_path / "w").exists()


def test_a_checkpoint_saved_on_four_devices_samples_on_one(tmp_path):
    workdir = tmp_path / "w"
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4")
    out = run(workdir, *QUICK, "--config.mesh.fsdp=2", env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "mesh {'data': 2, 'fsdp': 2, 'tensor': 1}" in out.stdout
    one = sample("--workdir", str(workdir), "--max_new_tokens", "5", "--temperature", "0")
    assert one.returncode == 0, one.stderr[-3000:]
    assert "--- sample 1 of 1 ---" in one.stdout
    two = sample("--workdir", str(workdir), "--max_new_tokens", "5", "--temperature", "0",
                 env=dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2"))
    assert two.returncode == 0 and two.stdout == one.stdout
    resumed = run(workdir, *QUICK[1:], "--config.train.steps=4")  # and training resumes on one device
    assert resumed.returncode == 0 and max(losses(workdir)) == 4, resumed.stderr[-3000:]


def test_prompt_file_errors_name_the_file(tmp_path):
    workdir = tmp_path / "w"
    assert run(workdir, *QUICK).returncode == 0
    out = sample("--workdir", str(workdir), "--prompt_file", str(tmp_path))
    assert out.returncode == 1 and f"--prompt_file {str(tmp_path)!r} is a folder" in out.stderr
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("café".encode("latin-1"))
    out = sample("--workdir", str(workdir), "--prompt_file", str(latin1))
    assert out.returncode == 1 and f"{str(latin1)!r} is not UTF-8 text" in out.stderr
    assert "Traceback" not in out.stderr
