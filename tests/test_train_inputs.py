"""train.py with bad or unusual input, as a new user would type it: each a one-line error naming the
problem and the fix before anything is compiled or written, and nothing silently wrong (issue:
reliability and the first run).

The bad configs run in this process, through what train.py calls before training: the flags
parser (transformer/cli.py), `check_run` and `run_tokenizer` (training/setup.py). A few run through
train.py too (test_the_command_line_prints_a_bad_config_as_one_line), to show the command line
turns those errors into one line and an exit code.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.helpers.cli import ROOT, TINY, learning_rates, losses, run, sample
from tests.helpers.runs import quiet_train, tiny_config
from transformer.cli import config_flags_parser, explain_flag_error
from transformer.data.tokenizer import ByteTokenizer, save_tokenizer
from transformer.run.checkpoint import CheckpointError
from transformer.run.config_files import load_config, set_fields
from transformer.experiments.catalog import train
from transformer.training.optimizer import make_optimizer
from transformer.training.setup import check_run, run_tokenizer

QUICK = ("--config.train.steps=2", "--config.train.eval_every=2", "--config.train.checkpoint_every=2",
         "--config.train.sample_tokens=0", "--config.optim.warmup_steps=1")
DEFAULT_CONFIG = os.path.join(ROOT, "configs", "modern.py")  # train.py's, with no --config


def assert_one_line_error(out: subprocess.CompletedProcess, *fragments: str, code: int = 1) -> None:
    """Exit `code`, one line on stderr naming the problem, no traceback, nothing compiled."""
    assert out.returncode == code, (out.returncode, out.stdout[-2000:], out.stderr[-3000:])
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr[-3000:]
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    assert "model:" not in out.stdout  # the model line comes after compiling


def config_with(tmp_path, **fields):
    """configs/tiny.py (token cache under tmp_path) with dotted fields changed: {"train.steps": 3}."""
    config = tiny_config(tmp_path)
    set_fields(config, fields, "the test")
    return config


def refused(check, error: type[Exception] = ValueError) -> str:
    """The message of the `error` that check() raises."""
    with pytest.raises(error) as raised:
        check()
    return str(raised.value)


def parser_exit(capsys, argv: list[str]) -> str:
    """train.py's flags parser on argv: it exits 2; returns its stderr (one 'error:' line)."""
    with pytest.raises(SystemExit) as exit_:
        config_flags_parser(DEFAULT_CONFIG)(argv)
    assert exit_.value.code == 2
    return capsys.readouterr().err


# ----------------------------------------------------------------------------- in this process


@pytest.mark.parametrize("override, message", [
    ("train.stpes=3", "unknown config field config.train.stpes; did you mean config.train.steps?"),
    ("model.num_head=3", "unknown config field config.model.num_head; did you mean config.model.num_heads?"),
    ("bogus.x=1", "unknown config field config.bogus.x; configs/common.py lists the fields"),
], ids=["train.stpes", "model.num_head", "bogus.x"])
def test_an_unknown_field_is_named_with_the_closest(override, message):
    """What the flags parser prints when absl refuses a --config.* override (the error absl raises
    is not read for an unknown field)."""
    assert explain_flag_error(TINY, ["train.py", f"--config={TINY}", f"--config.{override}"], KeyError()) == message


def test_a_missing_config_file_is_named_and_found_in_the_repository(tmp_path, capsys, monkeypatch):
    err = parser_exit(capsys, ["train.py", "--config=no/such/config.py"])
    assert err == f"error: --config 'no/such/config.py': no such file (looked from {os.getcwd()})\n"
    # A path relative to the repository, typed from elsewhere: the error says where the file is.
    monkeypatch.chdir(tmp_path)
    err = parser_exit(capsys, ["train.py", "--config", "configs/tiny.py"])
    assert err == (f"error: --config 'configs/tiny.py': no such file (looked from {tmp_path}) (it is in the "
                   f"repository: pass {os.path.join(ROOT, 'configs/tiny.py')})\n")


def test_a_config_file_whose_get_config_returns_a_dict_is_named_with_the_fix(tmp_path):
    """#31: ml_collections takes the dict; the run then failed with an AttributeError traceback.
    Without overrides the parser checks the file's config (load_config's check); with one, absl
    fails on the dict and the parser explains it."""
    path = tmp_path / "dict_config.py"
    path.write_text("def get_config():\n    return {'train': {'steps': 3}}\n")
    message = (f"config file {path}: get_config() returned dict, not an ml_collections ConfigDict; build it "
               "with configs/common.base_config")
    assert refused(lambda: load_config(str(path))) == message
    argv = ["train.py", f"--config={path}", "--config.train.steps=4"]
    assert explain_flag_error(str(path), argv, AttributeError()) == message


# (fields, the whole message: the field, its value and the values it may take), as train.py prints them
BAD_TRAINING_FIELDS = [
    ({"train.batch_size": 0}, "train.batch_size=0 must be a positive integer (sequences per step)"),
    ({"train.seq_len": 0}, "train.seq_len=0 must be a positive integer (tokens per sequence)"),
    ({"train.seq_len": -4}, "train.seq_len=-4 must be a positive integer (tokens per sequence)"),
    ({"train.grad_accum": 0}, "train.grad_accum=0 must be a positive integer (micro-batches per step)"),
    ({"optim.learning_rate": -0.001}, "optim.learning_rate=-0.001 must be a number >= 0 (the peak rate, e.g. 1e-3)"),
    ({"optim.learning_rate": float("nan")}, "optim.learning_rate=nan must be a number >= 0 (the peak rate, e.g. 1e-3)"),
    ({"optim.min_lr_ratio": 2.0}, "optim.min_lr_ratio=2.0 must be in [0.0, 1.0]"),
    ({"data.tokenizer": "bytepair"}, "data.tokenizer='bytepair' is not known; use 'bytes' or 'bpe'"),
]


@pytest.mark.parametrize("fields, message", BAD_TRAINING_FIELDS,
                         ids=[",".join(f"{k}={v}" for k, v in fields.items()) for fields, _ in BAD_TRAINING_FIELDS])
def test_a_bad_training_field_is_refused_before_anything_is_written(tmp_path, fields, message):
    """check_run, the first thing train.py's set-up does: the field, its value and the value it needs."""
    workdir = tmp_path / "w"
    assert refused(lambda: check_run(config_with(tmp_path, **fields), str(workdir))) == message
    assert not workdir.exists()


def test_a_bad_workdir_is_named_with_the_fix(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    config = tiny_config(tmp_path)
    for workdir, message in [
        (str(a_file), f"--workdir {str(a_file)!r} is a file, not a folder; choose another --workdir"),
        (str(a_file / "run"), f"--workdir {str(a_file / 'run')!r} cannot be created: {a_file} is a file"),
        ("", "--workdir is empty; name a folder for the run, e.g. --workdir runs/my_run"),
    ]:
        assert refused(lambda: check_run(config, workdir)) == message


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs a folder nobody can write: /proc")
def test_a_workdir_nobody_can_write_is_named_with_the_fix(tmp_path):
    message = refused(lambda: check_run(tiny_config(tmp_path), "/proc/no-such-run"))
    assert message.startswith("--workdir '/proc/no-such-run' cannot be written (")
    assert message.endswith(" in /proc); choose a folder you can write to")


def test_a_bpe_larger_than_the_corpus_gives_is_refused_before_compiling(tmp_path):
    """#31: a 12-word corpus gives a ~300-token BPE; vocab_size=4096 trained a 4096-way head whose ids above
    ~300 no text encodes to (and that sample.py's decode dropped)."""
    corpus = tmp_path / "twelve_words.txt"
    corpus.write_text("one two three four five six seven eight nine ten eleven twelve\n")
    workdir = str(tmp_path / "w")
    config = config_with(tmp_path, **{"data.path": str(corpus), "data.tokenizer": "bpe", "model.vocab_size": 4096,
                                      "data.vocab_size": 4096})
    message = refused(lambda: run_tokenizer(check_run(config, workdir), workdir))
    size = int(re.fullmatch(r"the corpus gives a BPE of only (\d+) tokens, not vocab_size=4096 \(it holds no more "
                            r"pairs to merge\), so ids \1 to 4095 would never occur: set --config.data.vocab_size="
                            r"\1 --config.model.vocab_size=\1, or train on more text", message)[1])
    assert 256 < size < 4096
    assert not os.path.exists(workdir)


def test_a_tokenizer_left_in_the_workdir_is_checked_against_the_config(tmp_path):
    """A run that died before its first checkpoint left a byte tokenizer; a BPE config is refused
    with the difference named, not trained with the wrong tokenizer."""
    workdir = tmp_path / "w"
    save_tokenizer(ByteTokenizer(), workdir / "tokenizer")
    (workdir / "config.json").write_text(json.dumps({"data": {"tokenizer": "bytes", "vocab_size": 256, "path": ""}}))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("To be, or not to be, that is the question.\n" * 300)
    config = config_with(tmp_path, **{"data.path": str(corpus), "data.tokenizer": "bpe", "model.vocab_size": 300})
    assert refused(lambda: run_tokenizer(check_run(config, str(workdir)), str(workdir))) == (
        f"{workdir / 'tokenizer'} was made for other data (data.tokenizer: 'bytes' there, 'bpe' now; "
        f"data.vocab_size: 256 there, 300 now; data.path: '' there, {str(corpus)!r} now); delete that folder "
        "(the run saved no checkpoint) or choose another --workdir")


def test_a_damaged_tokenizer_left_in_the_workdir_names_the_fix_and_a_cut_short_one_is_made_again(tmp_path):
    """#31: a run with no checkpoint left workdir/tokenizer. Damaged (a truncated tokenizer.json): one
    line naming the folder and the fix, not the tokenizers library's traceback. Cut short by a kill (the
    kind file, written last, missing): made again from the config, as if it were not there."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("To be, or not to be, that is the question.\n" * 300)
    config = config_with(tmp_path, **{"data.path": str(corpus), "data.tokenizer": "bpe", "model.vocab_size": 270,
                                      "data.vocab_size": 270})
    workdir = tmp_path / "w"
    made = run_tokenizer(check_run(config, str(workdir)), str(workdir))
    save_tokenizer(made, workdir / "tokenizer")
    saved = config.to_dict()
    saved["data"]["path"] = str(corpus)
    (workdir / "config.json").write_text(json.dumps(saved))
    hf_file = workdir / "tokenizer" / "tokenizer.json"
    text = hf_file.read_text()
    hf_file.write_text(text[: len(text) // 2])  # truncated
    message = refused(lambda: run_tokenizer(check_run(config, str(workdir)), str(workdir)))
    assert message.startswith(f"{workdir / 'tokenizer'} is damaged ({hf_file} is not a valid Hugging Face tokenizer.json")
    assert message.endswith("the run saved no checkpoint, so nothing was trained with it: delete that folder and "
                            "rerun the same command to make it again")

    (workdir / "tokenizer" / "tokenizer_kind.json").unlink()  # a kill between the two files of save_tokenizer
    again = run_tokenizer(check_run(config, str(workdir)), str(workdir))
    assert again.encode("To be, or not") == made.encode("To be, or not") and again.vocab_size == made.vocab_size


def test_a_warm_up_as_long_as_the_run_warns_and_a_longer_one_runs_cut_short_with_a_warning(tmp_path, capsys):
    """#31: warmup_steps=100 with train.steps=4 warned "never decays" and trained with a 3-step warm-up.
    As long as the run: a warning from check_run, and the optimizer is made; longer (issue 51: a smoke
    run of any config): one warning line and the declared warm-up, cut short, never clamped; longer
    than an explicit optim.decay_steps: refused."""
    def set_up(warmup_steps: int, **more):  # setup.set_up's first steps: check_run, make_optimizer
        config = check_run(config_with(tmp_path, **{"train.steps": 2, "optim.warmup_steps": warmup_steps, **more}),
                           str(tmp_path / "w")).config
        return make_optimizer(config.optim, config.train.steps)[1]

    set_up(2)
    assert capsys.readouterr().err == (
        "warning: the learning rate warms up for optim.warmup_steps=2 steps but decays over 2: it never decays; "
        "lower optim.warmup_steps or raise train.steps\n")
    schedule = set_up(100)
    assert capsys.readouterr().err == ("warning: train.steps=2 ends inside the warm-up of optim.warmup_steps=100: the "
                                       "learning rate rises to 2% of its peak and never decays (a short run)\n")
    peak = config_with(tmp_path).optim.learning_rate
    assert [float(schedule(s)) for s in (0, 1)] == pytest.approx([0.0, peak / 100])  # the declared ramp, not clamped
    assert refused(lambda: set_up(100, **{"train.steps": 200, "optim.decay_steps": 50})) == (
        "optim.warmup_steps=100 is longer than optim.decay_steps=50 (train.steps=200): the warm-up would end early; "
        "set --config.optim.warmup_steps=50 or fewer, or --config.optim.decay_steps=100 or more")
    assert not (tmp_path / "w").exists()


# ----------------------------------------------------------------------------- through train.py


@pytest.mark.slow
@pytest.mark.parametrize("override, code, message", [
    # absl's own error for an ill-typed value (its first line): the flag and why its value does not parse
    ("--config.train.steps=abc", 2, "error: flag --config.train.steps=abc: invalid literal for int()"),
    ("--config.train.batch_size=0", 1, "error: train.batch_size=0 must be a positive integer (sequences per step)"),
], ids=["ill-typed-override", "bad-field"])
def test_the_command_line_prints_a_bad_config_as_one_line(tmp_path, override, code, message):
    """train.py's exit code and one 'error:' line for a bad command line (2) and a bad config (1);
    the workdir is not created."""
    out = run(tmp_path / "w", override)
    assert_one_line_error(out, message, code=code)
    assert not (tmp_path / "w").exists()


@pytest.mark.slow
def test_the_default_config_is_found_from_any_folder(tmp_path):
    """No --config from another folder: the default config is found (the typo is then reported);
    the default named by its absolute path is parsed once, not "defined twice"."""
    cmd = [sys.executable, os.path.join(ROOT, "train.py"), "--workdir", str(tmp_path / "w"), "--config.train.stpes=1"]
    for extra in ([], ["--config", DEFAULT_CONFIG]):
        out = subprocess.run([*cmd, *extra], capture_output=True, text=True, cwd=str(tmp_path), timeout=120)
        assert_one_line_error(out, "unknown config field config.train.stpes; did you mean config.train.steps?", code=2)


@pytest.mark.slow
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


@pytest.mark.slow
def test_resuming_on_other_data_is_refused_naming_the_field(tmp_path):
    """A BPE trained on one corpus is not reused for another: the resume (check_run, against the
    checkpoint of a 2-step run) names data.path, both values and the fix."""
    small, other = tmp_path / "small.txt", tmp_path / "other.txt"
    small.write_text("To be, or not to be, that is the question.\n" * 300)
    other.write_text("Now is the winter of our discontent.\n" * 300)
    bpe = {"data.tokenizer": "bpe", "model.vocab_size": 270}  # both texts give more
    workdir = tmp_path / "w"
    quiet_train(config_with(tmp_path, **{"train.steps": 2, "data.path": str(small), **bpe}), workdir)
    config = config_with(tmp_path, **{"train.steps": 4, "data.path": str(other), **bpe})
    assert refused(lambda: check_run(config, str(workdir)), CheckpointError) == (
        f"the checkpoints in {workdir} were trained on other data (data.path: checkpoint {str(small)!r}, config "
        f"{str(other)!r}); resume with the same data fields, or start a new --workdir")
    # Needle documents from the same corpus are other data too (they take bytes and a longer window).
    bytes_workdir = tmp_path / "bytes"
    quiet_train(config_with(tmp_path, **{"train.steps": 2, "data.path": str(small)}), bytes_workdir)
    needle = config_with(tmp_path, **{"train.steps": 4, "data.path": str(small), "train.seq_len": 64,
                                      "data.task": "needle", "data.needle.min_length": 57,
                                      "data.needle.max_length": 58})
    assert refused(lambda: check_run(needle, str(bytes_workdir)), CheckpointError) == (
        f"the checkpoints in {bytes_workdir} were trained on other data (data.task: checkpoint 'text', config "
        "'needle'); resume with the same data fields, or start a new --workdir")
    # ... and needle documents with more facts than the checkpoint's are other data again.
    one_fact = {"data.path": str(small), "model.max_seq_len": 128, "train.seq_len": 96, "data.task": "needle",
                "data.needle.min_length": 57, "data.needle.max_length": 58}
    needle_workdir = tmp_path / "needle"
    quiet_train(config_with(tmp_path, **{**one_fact, "train.steps": 2}), needle_workdir)
    recall = config_with(tmp_path, **{**one_fact, "train.steps": 4, "data.needle.facts": 2,
                                      "data.needle.min_length": 90, "data.needle.max_length": 90})
    assert refused(lambda: check_run(recall, str(needle_workdir)), CheckpointError) == (
        f"the checkpoints in {needle_workdir} were trained on other data (data.needle.facts: checkpoint 1, config 2; "
        "data.needle.max_length: checkpoint 58, config 90; data.needle.min_length: checkpoint 57, config 90); "
        "resume with the same data fields, or start a new --workdir")
    cloze = config_with(tmp_path, **{**one_fact, "train.steps": 4, "data.needle.question": "cloze"})
    assert refused(lambda: check_run(cloze, str(needle_workdir)), CheckpointError) == (
        f"the checkpoints in {needle_workdir} were trained on other data (data.needle.question: checkpoint "
        "'question', config 'cloze'); resume with the same data fields, or start a new --workdir")


@pytest.mark.slow
def test_steps_below_the_checkpoint_is_refused_and_equal_does_nothing(finished_run, tmp_path, capsys):
    """After 4 steps: train.steps=2 is refused by check_run with the fix; train.steps=4 trains
    nothing and rewrites nothing."""
    workdir = finished_run
    config_json = (workdir / "config.json").read_text()
    assert refused(lambda: check_run(tiny_config(tmp_path, steps=2), str(workdir))) == (
        f"train.steps=2 is below the checkpoint's step 4 in {workdir}; set train.steps >= 4, or start a new --workdir")
    capsys.readouterr()
    assert train(tiny_config(tmp_path, steps=4), str(workdir), progress=False) == {}
    assert f"the run in {workdir} is already complete at step 4 (train.steps=4)" in capsys.readouterr().out
    assert (workdir / "config.json").read_text() == config_json


@pytest.mark.slow
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


@pytest.mark.slow
def test_extending_a_finished_run_warns_unless_the_schedule_is_kept(finished_run, tmp_path):
    """Raising train.steps re-spans the cosine (the learning rate jumps back up): a warning says so
    and names optim.decay_steps, which extends the finished schedule at its final rate."""
    workdir, kept = finished_run, shutil.copytree(finished_run, tmp_path / "kept")
    base = ("--config.train.eval_every=4", "--config.train.checkpoint_every=4", "--config.train.sample_tokens=0",
            "--config.optim.warmup_steps=1", "--config.train.log_every=1")
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


@pytest.mark.slow
def test_resuming_accepts_execution_changes_and_converts_the_layer_stack(tmp_path, capsys):
    """dtype, remat, dropout, attention_impl and scan_layers change how the parameters are computed,
    not what they are: a resume with them changed goes on (saying so), and a scan_layers change gives
    the losses of an unbroken run. In this process: the command line adds nothing here."""
    straight, changed = tmp_path / "a", tmp_path / "b"

    def train_to(workdir, steps: int, **fields) -> str:  # what the run printed
        config = config_with(tmp_path, **{"train.steps": steps, "train.eval_every": 4,
                                          "train.checkpoint_every": 4, **fields})
        capsys.readouterr()
        train(config, str(workdir), progress=False)
        return capsys.readouterr().out

    train_to(straight, 8)
    train_to(changed, 8, **{"train.run_steps": 4})
    out = train_to(changed, 8, **{"model.scan_layers": False, "model.remat": True, "model.attention_impl": "xla"})
    assert "resuming with other execution settings: attention_impl: 'reference' -> 'xla'" in out
    assert "scan_layers: True -> False" in out
    a, b = losses(straight), losses(changed)
    assert sorted(b) == list(range(1, 9))
    assert all(abs(a[s] - b[s]) < 1e-4 * abs(a[s]) for s in a), (a, b)
    out = train_to(changed, 9, **{"model.dtype": "bfloat16", "model.dropout": 0.1})
    assert "dtype: 'float32' -> 'bfloat16'" in out
    assert "d_model: checkpoint 64, config 32" in refused(lambda: train_to(changed, 10, **{"model.d_model": 32}),
                                                          CheckpointError)


@pytest.mark.slow
def test_a_damaged_checkpoint_gives_one_clear_error(finished_run):
    """The error names the damaged folder, without 'Event loop is closed' tracebacks around it."""
    workdir = finished_run
    for root, _, files in os.walk(workdir / "checkpoints" / "4" / "state"):
        for name in files:
            if os.sep + "d" in root:  # the array data, not the metadata
                with open(os.path.join(root, name), "r+b") as f:
                    f.truncate(8)
    for _ in range(3):  # the noise came from a race: try a few times
        out = run(workdir, *QUICK[1:], "--config.train.steps=6", "--config.optim.decay_steps=4")  # no schedule warning
        assert_one_line_error(out, "is damaged", str(workdir / "checkpoints" / "4"))
        out = sample("--workdir", str(workdir), "--max_new_tokens", "3")
        assert out.returncode == 1 and "Event loop" not in out.stderr and "is damaged" in out.stderr


@pytest.mark.slow
def test_a_mesh_that_does_not_divide_the_model_is_one_line_naming_the_field(tmp_path):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=3")
    out = run(tmp_path / "w", *QUICK, "--config.mesh.tensor=3", env=env)  # vocab 256, 4 heads
    assert_one_line_error(out, "model.vocab_size", "mesh.rules.vocab", "mesh.tensor")
    out = run(tmp_path / "w", *QUICK, "--config.mesh.tensor=3", "--config.mesh.rules.vocab=", env=env)
    assert_one_line_error(out, "model.num_heads", "mesh.rules.heads")
    assert not (tmp_path / "w").exists()


@pytest.mark.slow
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


def test_the_config_is_checked_once_and_nothing_is_written_back_into_it(tmp_path):
    """check_run builds the one ModelConfig ('auto' chosen for this backend) and the form the run
    saves; the ConfigDict keeps the user's 'auto' and gets no record of the choice."""
    config = tiny_config(tmp_path)
    checked = check_run(config, str(tmp_path / "w"))
    assert checked.config.model.dtype == "auto" and "auto" not in checked.config
    assert checked.cfg.dtype != "auto" and checked.record["model"]["dtype"] == checked.cfg.dtype
    assert checked.record["auto"]["fields"] == ["dtype", "attention_impl"]
    assert not (tmp_path / "w").exists()
