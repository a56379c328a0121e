"""Bad input at every entry point (issue 51): the scripts, the files a run or a Hugging Face folder holds,
and the public functions the README shows end in one clear line, or are handled right; no script writes
a committed file before its inputs are checked. In-process: the command line adds nothing to these."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys

import jax
import numpy as np
import pytest

import transformer
from tests.helpers.decoder import make_cfg, random_params
from transformer.model.config import ModelConfig
from transformer.model.decoder import Decoder

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def one_line_exit(capsys, main, argv: list[str], monkeypatch, code: int | None = None) -> str:
    """Runs a script's main() with `argv`; requires a SystemExit (non-zero, or `code`) and one line on stderr."""
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exit_:
        main()
    err = capsys.readouterr().err
    assert exit_.value.code not in (0, None) and (code is None or exit_.value.code == code), (exit_.value.code, err)
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.fixture(scope="module")
def tiny():
    cfg = make_cfg("mha", "rope")
    return cfg, random_params(Decoder(cfg))


# ----------------------------------------------------------------------------- data loss and silent wrong results


def test_recall_sweep_checks_every_run_before_it_rewrites_the_curves_file(tmp_path, monkeypatch, capsys):
    from scripts import recall_sweep

    curves = tmp_path / "recall.json"
    curves.write_text('{"a_seed0": [[1, 2.0, 0.5]]}\n')
    monkeypatch.setattr(recall_sweep, "CURVES", str(curves))
    for name in ("a-seed0", "boom"):  # sweep.py's seeds, and a run with none
        (tmp_path / "w" / name).mkdir(parents=True)
        (tmp_path / "w" / name / "metrics.jsonl").write_text(
            json.dumps({"step": 5, "val_loss": 1.0, "val_exact_match": 0.5}) + "\n")
    err = one_line_exit(capsys, recall_sweep.main, ["recall_sweep.py", str(tmp_path / "w")], monkeypatch)
    assert "'boom' is not named <variant>-seed<s>" in err
    assert curves.read_text() == '{"a_seed0": [[1, 2.0, 0.5]]}\n'  # untouched
    (tmp_path / "w" / "boom" / "metrics.jsonl").unlink()
    monkeypatch.setattr(sys, "argv", ["recall_sweep.py", str(tmp_path / "w"), "--figure", str(tmp_path / "f.png")])
    recall_sweep.main()  # '-seed<s>' (sweep.py's naming) is read as well as '_seed<s>'
    assert json.loads(curves.read_text()) == {"a-seed0": [[5, 1.0, 0.5]]}


def test_an_integer_safetensors_tensor_is_refused_by_name(tiny, tmp_path):
    from safetensors.numpy import load_file, save_file

    from transformer.hf import from_hf, to_hf

    cfg, params = tiny
    to_hf(cfg, params, tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    name = sorted(tensors)[0]
    tensors[name] = np.clip(tensors[name] * 100, -127, 127).astype(np.int8)
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=f"tensor {name} in .* is I8, not a float: a quantised model"):
        from_hf(tmp_path)


def test_explore_refuses_token_ids_outside_the_vocabulary_and_prompts_past_the_context(tiny):
    from transformer.analysis.explore import explore

    cfg, params = tiny
    with pytest.raises(ValueError, match="token id 999 .* outside the vocabulary of vocab_size=64"):
        explore(params, [[999, 1000]], cfg=cfg)
    with pytest.raises(ValueError, match="the prompt has 17 tokens.*max_seq_len=16"):
        explore(params, [[1] * 17], cfg=cfg)


@pytest.mark.parametrize("argv, message", [
    (["--times", "1"], "--times 1: at least 2"), (["--times", "0"], "--times 0: at least 2"),
    (["--rows", "1"], "--rows 1: at least 2"), (["--sinks", "0,a"], "--sinks '0,a': a comma-separated list"),
])
def test_streaming_refuses_what_would_print_nan_before_loading_anything(argv, message, monkeypatch, capsys):
    from scripts import streaming

    err = one_line_exit(capsys, streaming.main, ["streaming.py", "--sweep_dir", "/nonexistent", *argv], monkeypatch, 2)
    assert message in err


@pytest.mark.parametrize("field, message", [
    (dict(norm_eps=math.nan), "norm_eps=nan must be positive and finite"),
    (dict(rope_theta=math.inf), "rope_theta=inf must be positive and finite"),
])
def test_model_fields_that_would_compute_nonsense_are_refused(field, message):
    with pytest.raises(ValueError, match=message):
        make_cfg("mha", "rope", **field)


def test_a_window_longer_than_the_context_sizes_no_ring_past_the_context():
    from transformer.model.kv_cache import describe_cache_size, init_cache

    long, whole = (make_cfg("mha", "rope", attention_window=w, global_every=2) for w in (1000, 16))
    assert long.layer_windows() == whole.layer_windows() == (16, None)
    assert describe_cache_size(long) == describe_cache_size(whole)
    assert jax.tree.map(np.shape, init_cache(long, 1, 8, "float32")) == jax.tree.map(np.shape, init_cache(whole, 1, 8, "float32"))


# ----------------------------------------------------------------------------- tracebacks


MODEL = dict(vocab_size=64, max_seq_len=16, d_model=32, num_layers=1, num_heads=2)


def saved_run(workdir, step: int = 3):
    """A checkpoint of a tiny byte-level model at `step`, its state's step that one, as a run saves it."""
    from transformer import training
    from transformer.data.tokenizer import ByteTokenizer
    from transformer.run.checkpoint import Checkpointer
    from transformer.training.optimizer import make_optimizer
    from transformer.training.sharding import make_mesh

    tx, _ = make_optimizer(dict(learning_rate=1e-3, warmup_steps=1, min_lr_ratio=0.1, b1=0.9, b2=0.99, eps=1e-8,
                                weight_decay=0.1, decay_embeddings=False, grad_clip=1.0), 10)
    state = training.create_state(ModelConfig(**MODEL), tx, 0, make_mesh(devices=jax.devices()[:1]))
    state = state.replace(step=jax.numpy.asarray(step, jax.numpy.int32))
    ckpt = Checkpointer(str(workdir))
    ckpt.save(step, state, {"model": MODEL}, ByteTokenizer(), val_loss=1.0)
    ckpt.wait()
    return state


@pytest.mark.parametrize("record", ['[["data/a.txt", "ab', "[1, 2]", '{"a": 1}', "\x00\xff"])
def test_a_damaged_corpus_record_is_named_with_its_fix_not_blamed_on_the_corpus(tmp_path, record):
    from transformer.run.checkpoint import CheckpointError
    from transformer.run.workdir import check_corpus_kept

    (tmp_path / "corpus.json").write_bytes(record.encode("latin1"))
    with pytest.raises(CheckpointError) as error:
        check_corpus_kept(str(tmp_path), [["data/a.txt", "ab"]])
    message = str(error.value)
    assert f"{tmp_path / 'corpus.json'} is damaged" in message and "delete" in message and "\n" not in message
    assert "the corpus changed" not in message


def test_metrics_lines_without_a_step_are_skipped_and_a_run_resumes_past_them(tmp_path, monkeypatch, capsys):
    from scripts import plot_metrics
    from transformer.run.metrics import MetricWriter, read_metrics

    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1, "loss": 2.0}\n{"note": "lr changed"}\n42\n\xff\xfe\x00junk\n{"step": 2, "loss": 1.5}\n')
    assert read_metrics(str(path)) == [{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.5}]
    MetricWriter(str(tmp_path), start_step=1).close()  # a resume keeps the rows up to its step
    assert read_metrics(str(path)) == [{"step": 1, "loss": 2.0}]
    path.write_bytes(bytes(range(256)) * 4)  # a binary file
    with pytest.raises(SystemExit, match="holds no training rows"):
        plot_metrics.plot(str(path), str(tmp_path / "x.png"))


def test_a_renamed_checkpoint_folder_is_named_not_blamed_on_another_run(tmp_path):
    from transformer.run.checkpoint import CheckpointError, Checkpointer

    state = saved_run(tmp_path, step=4)
    os.rename(tmp_path / "checkpoints" / "4", tmp_path / "checkpoints" / "40")
    with pytest.raises(CheckpointError, match=r"checkpoints/40 holds the state of step 4: it was renamed; rename it back"):
        Checkpointer(str(tmp_path)).restore_state(state, MODEL)


def test_a_garbled_tokenizer_in_a_checkpoint_is_damage_with_the_way_back(tmp_path):
    from transformer.run.checkpoint import CheckpointError, restore_for_inference

    saved_run(tmp_path)
    (tmp_path / "checkpoints" / "3" / "tokenizer" / "metadata").write_text('{"kind":"bpe","tokenizer_json":"{garbage"}')
    with pytest.raises(CheckpointError, match=r"checkpoint step 3 .* is damaged .*move it aside"):
        restore_for_inference(str(tmp_path))


@pytest.fixture
def hf_folder(tmp_path):
    from transformer.data.tokenizer import ByteTokenizer
    from transformer.hf import to_hf

    cfg = make_cfg("mha", "learned", vocab_size=256)
    to_hf(cfg, random_params(Decoder(cfg)), tmp_path, tokenizer=ByteTokenizer())
    return tmp_path


@pytest.mark.parametrize("file, text, message", [
    ("config.json", "[1, 2, 3]", "config.json is no model config (a JSON list, not an object)"),
    ("config.json", '{"n_embd": ', "config.json is no model config (Expecting value"),
    ("tokenizer_kind.json", "{garbled", "the tokenizer files (tokenizer_kind.json, tokenizer.json) cannot be read"),
    ("tokenizer_kind.json", "[1]", "the tokenizer files (tokenizer_kind.json, tokenizer.json) cannot be read"),
])
def test_a_garbled_hugging_face_file_is_named(hf_folder, file, text, message):
    from transformer.load import load_model

    (hf_folder / file).write_text(text)
    with pytest.raises(ValueError) as error:
        load_model(None, str(hf_folder), None)
    assert message in str(error.value) and "\n" not in str(error.value), error.value


def test_a_hugging_face_config_that_leaves_out_a_width_says_the_default_was_taken(hf_folder):
    from transformer.hf import from_hf

    config = json.loads((hf_folder / "config.json").read_text())
    del config["n_embd"]
    (hf_folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="config leaves out n_embd, .*: defaults taken.*do not belong to this config.json"):
        from_hf(hf_folder)


def test_out_of_memory_is_one_line_naming_the_fields_that_shrink_a_step():
    from transformer.cli import out_of_memory
    from transformer.run.config_files import load_config

    config = load_config(os.path.join(ROOT, "configs", "tiny.py"))
    error = out_of_memory(RuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 52634183096 bytes.\nmore"),
                                config)
    assert "\n" not in str(error) and f"train.batch_size={config.train.batch_size}" in str(error)
    assert "--config.train.grad_accum" in str(error) and "--config.model.remat=True" in str(error)
    with pytest.raises(RuntimeError, match="INTERNAL"):
        out_of_memory(RuntimeError("INTERNAL: something else"), config)


def test_eval_tables_names_a_missing_run_and_a_text_model(tmp_path, monkeypatch, capsys):
    from scripts import eval_tables

    err = one_line_exit(capsys, eval_tables.main, ["eval_tables.py", str(tmp_path / "nope")], monkeypatch)
    assert "does not exist" in err
    saved_run(tmp_path / "text")
    err = one_line_exit(capsys, eval_tables.main, ["eval_tables.py", str(tmp_path / "text")], monkeypatch)
    assert "holds a tokens model (model.inputs='tokens'), not a table classifier" in err


@pytest.mark.parametrize("shape, name", [
    ((2, 5, 7), "blocks.0.resid_post"),  # D = 7, not 32
    ((2, 5), "blocks.0.resid_post"),  # no D axis
    ((2, 1, 32), "blocks.0.resid_post"),  # T = 1: would patch every position with one value
    ((3, 2, 5, 32), "blocks.*.resid_post"),  # L = 3 is checked when run; here: D fits, so the edit is made
])
def test_a_patch_source_of_the_wrong_shape_is_refused_when_the_edit_is_made(tiny, shape, name):
    from transformer.model import edits

    cfg, _ = tiny
    if shape[0] == 3:
        assert edits.patch(cfg, name, np.zeros(shape)).name == name
        return
    with pytest.raises(ValueError, match=r"patch of 'blocks.0.resid_post': a source of shape .* is not the point's \[B, T, D\]"):
        edits.patch(cfg, name, np.zeros(shape))


def test_an_edit_made_for_another_length_is_refused_when_run(tiny):
    from transformer.analysis.capture import capture
    from transformer.model import edits

    cfg, params = tiny
    source = capture(params, cfg, np.ones((2, 5), np.int32), ["blocks.0.resid_post"])[2]["blocks.0.resid_post"]
    edit = edits.patch(cfg, "blocks.0.resid_post", source)
    for call in (lambda: edits.run(params, cfg, np.ones((2, 7), np.int32), [edit]),
                 lambda: capture(params, cfg, np.ones((2, 7), np.int32), ["embed"], edits=[edit])):
        with pytest.raises(ValueError, match=r"'blocks.\*.resid_post' covers 5 positions but this call has 7 tokens"):
            call()
    assert edits.run(params, cfg, np.ones((2, 5), np.int32), [edit])[0].shape == (2, 5, cfg.vocab_size)


@pytest.mark.parametrize("batch, length, message", [
    (1, -4, "max_len=-4 must be a whole number >= 1"), (0, 4, "batch_size=0 must be"),
    (1, 2.5, "max_len=2.5 must be"), (1, 17, "at most the model's context max_seq_len=16"),
])
def test_init_cache_refuses_sizes_that_are_no_counts(tiny, batch, length, message):
    from transformer.model.kv_cache import init_cache

    with pytest.raises(ValueError, match=message):
        init_cache(tiny[0], batch, length, dtype="float32")


# ----------------------------------------------------------------------------- misleading messages


def test_prompt_bytes_that_are_not_utf8_are_named_as_a_command_line_problem(tmp_path, monkeypatch, capsys):
    import io

    from transformer import explore as explore_cli
    from transformer.sampling.text import read_prompt

    bad = b"RO\xffMEO".decode("utf-8", "surrogateescape")  # what Python makes of such an argument
    with pytest.raises(ValueError, match=r"--prompt holds bytes that are not UTF-8 text \(at character 2\)"):
        read_prompt(bad, None)
    err = one_line_exit(capsys, explore_cli.main, ["explore", "--prompt", bad, "--workdir", str(tmp_path),
                                                    "--out", str(tmp_path / "x.html")], monkeypatch)
    assert "--prompt holds bytes that are not UTF-8" in err
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO("ROMEO: é".encode())))
    assert read_prompt(None, "-") == "ROMEO: é"  # '-': standard input


def test_a_prompt_past_the_context_of_a_learned_position_model_is_told_to_shorten_it():
    from transformer.sampling.sampler import generate

    learned, rope = make_cfg("mha", "learned", max_seq_len=64), make_cfg("mha", "rope", max_seq_len=64)
    for cfg, prompt, fix in ((learned, [1] * 69, "; shorten it below 64 tokens"),
                             (rope, [1] * 64, "; shorten it below 64 tokens"),
                             (learned, [1] * 60, "; ask for at most 4 new tokens, or pass sinks=S (sample.py --sinks) "
                              "to continue past the context with a rolling cache (relative positions only, not 'learned')"),
                             (rope, [1] * 60, "; ask for at most 4 new tokens, or pass sinks=S (sample.py --sinks) "
                              "to continue past the context with a rolling cache")):
        with pytest.raises(ValueError) as error:
            generate({}, cfg, [prompt], jax.random.key(0), 5)
        assert str(error.value).endswith(fix) and "at most 0" not in str(error.value), error.value


@pytest.mark.parametrize("saved, clip, says", [
    (False, 1.0, "(no checkpoint was saved yet). Lower optim.learning_rate, then rerun"),
    (True, 0.0, "(the checkpoint of step 3 is intact). Lower optim.learning_rate or set optim.grad_clip=1.0, then rerun"),
])
def test_the_divergence_error_says_which_checkpoint_is_kept_and_only_a_fix_not_yet_made(tmp_path, saved, clip, says):
    import types

    from ml_collections import ConfigDict

    from transformer.training.loop import Diverged, check_finite

    if saved:
        saved_run(tmp_path)
    run = types.SimpleNamespace(workdir=str(tmp_path), config=ConfigDict({"optim": {"grad_clip": clip}}))
    check_finite(run, 5, {"loss": 1.0, "param_norm": 2.0})
    with pytest.raises(Diverged) as error:
        check_finite(run, 5, {"loss": float("nan"), "param_norm": 2.0})
    assert str(error.value) == f"the training loss became nan at step 5; stopped without saving {says}"


@pytest.mark.slow
def test_sample_py_checks_its_options_before_loading_and_stops_on_ctrl_c_keeping_the_text(finished_run):
    import signal
    import subprocess

    from tests.helpers.cli import sample

    out = sample("--workdir", str(finished_run / "nope"), "--top_p", "2")
    assert (out.returncode, out.stderr) == (1, "error: --top_p 2.0 must be in (0, 1]; 1 (the default) keeps every token\n")
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "sample.py"), "--workdir", str(finished_run),
                             "--num_samples", "100000", "--max_new_tokens", "8"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT)
    first = proc.stdout.readline()  # the first sample has begun
    proc.send_signal(signal.SIGINT)
    rest, err = proc.communicate(timeout=120)
    assert first.startswith("--- sample 1 of 100000 ---") and proc.returncode == 130
    assert "Traceback" not in err and err.endswith("SIGINT: stopped; the text above is what was generated\n"), err


# ----------------------------------------------------------------------------- what a new researcher met


def test_text_in_text_out_is_generate_on_the_encoded_prompt_and_an_int_seed_is_a_key(tiny):
    import transformer
    from transformer.data.tokenizer import ByteTokenizer
    from transformer.sampling.sampler import generate, seed_key

    cfg, params = make_cfg("mha", "rope", vocab_size=256), random_params(Decoder(make_cfg("mha", "rope", vocab_size=256)))
    tok = ByteTokenizer()
    text = transformer.generate_text((cfg, params, tok), "RO", max_new_tokens=5, seed=3, temperature=0.8)
    by_key = generate(params, cfg, [tok.encode("RO")], seed_key(3), 5, temperature=0.8, vocab_limit=256)
    by_int = generate(params, cfg, [tok.encode("RO")], 3, 5, temperature=0.8, vocab_limit=256)
    np.testing.assert_array_equal(by_key.tokens, by_int.tokens)
    assert text == tok.decode(by_key.tokens[0].tolist())
    long = transformer.generate_text((cfg, params, tok), "RO", max_new_tokens=500, seed=1)  # what the context leaves
    assert long == tok.decode(generate(params, cfg, [tok.encode("RO")], 1, cfg.max_seq_len - 2, vocab_limit=256).tokens[0].tolist())


def test_loss_is_the_mean_next_token_cross_entropy_under_edits_and_takes_a_list_or_one_row(tiny):
    import transformer
    from transformer.analysis.capture import capture
    from transformer.model import edits
    from transformer.training.loss import cross_entropy

    cfg, params = tiny
    tokens = [[5, 9, 1, 33, 7, 2], [12, 3, 40, 1, 1, 8]]
    logits = Decoder(cfg).apply({"params": params}, np.asarray(tokens))[0]
    clean = transformer.loss(params, cfg, tokens)
    assert float(clean) == pytest.approx(float(cross_entropy(logits[:, :-1], np.asarray(tokens)[:, 1:])), rel=1e-6)
    assert float(transformer.loss(params, cfg, tokens[0])) == pytest.approx(float(transformer.loss(params, cfg, [tokens[0]])))
    off = edits.ablate_heads(cfg, np.zeros((cfg.num_layers, cfg.num_heads)))
    assert abs(float(transformer.loss(params, cfg, tokens, [off])) - float(clean)) > 1e-3  # the edit is applied
    one_row = capture(params, cfg, tokens[0], ["blocks.0.resid_post"])[2]["blocks.0.resid_post"]
    np.testing.assert_allclose(one_row, capture(params, cfg, np.asarray(tokens[:1]), ["blocks.0.resid_post"])[2][
        "blocks.0.resid_post"])


@pytest.mark.parametrize("tokens, shape", [([[0.5, 1.5]], r"\(1, 2\) and dtype float64"), ([], r"\(1, 0\)"),
                                           (np.zeros((1, 2, 3), np.int32), r"\(1, 2, 3\)")])
def test_tokens_that_are_no_ids_say_what_to_pass(tiny, tokens, shape):
    import transformer

    cfg, params = tiny
    for call in (lambda: transformer.loss(params, cfg, tokens), lambda: transformer.capture(params, cfg, tokens, [])):
        with pytest.raises(ValueError, match=r"tokens must be integer token ids \[B, T\] .* got shape " + shape):
            call()


def test_load_run_prints_no_library_warning(tmp_path, capfd, caplog):
    import transformer

    saved_run(tmp_path)
    capfd.readouterr()
    transformer.load_run(str(tmp_path))
    assert "WARNING" not in capfd.readouterr().err and not [r for r in caplog.records if r.levelname == "WARNING"]


def test_make_notebook_runs_one_notebook_headless():
    import subprocess

    out = subprocess.run(["make", "-n", "-W", "pyproject.toml", "notebook", "NB=kv_cache"], capture_output=True,
                         text=True, cwd=ROOT)
    assert "nbconvert --to notebook --execute --inplace notebooks/kv_cache.ipynb" in out.stdout, out.stderr
    out = subprocess.run(["make", "-n", "notebook"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode != 0 and "NB is not set: make notebook NB=NAME" in out.stderr


@pytest.mark.slow
def test_validation_tokens_are_the_tail_of_the_runs_corpus_and_a_redirected_bar_is_short_lines(finished_run, capsys):
    import transformer
    from tests.helpers.runs import tiny_config
    from transformer.experiments.catalog import train

    tok = transformer.load_run(str(finished_run))[2]
    val = transformer.validation_tokens(str(finished_run))
    assert val.ndim == 1 and len(val) > 1000
    corpus = json.loads((finished_run / "config.json").read_text())["data"]["path"]
    if corpus and os.path.isfile(corpus):
        assert open(corpus, encoding="utf-8").read().endswith(tok.decode(val[-200:].tolist()))
    train(tiny_config(finished_run.parent, steps=6, every=2), str(finished_run))  # stdout is no terminal here
    out = capsys.readouterr().out
    assert "%|" in out and max(len(line) for line in out.split("\n")) < 300  # a line per refresh, not one of all


@pytest.mark.slow
def test_the_package_builds_without_setuptools_warnings(tmp_path):
    import subprocess

    files = subprocess.run(["git", "ls-files"], capture_output=True, text=True, cwd=ROOT).stdout.split()
    for name in files:
        if name == "pyproject.toml" or name.startswith(("transformer/", "configs/", "bench/", "scripts/")):
            os.makedirs(tmp_path / os.path.dirname(name), exist_ok=True)
            with open(os.path.join(ROOT, name), "rb") as src, open(tmp_path / name, "wb") as dst:
                dst.write(src.read())
    out = subprocess.run([sys.executable, "-c", "import setuptools; setuptools.setup()", "-q", "build_py", "-d",
                          str(tmp_path / "out")], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0 and "would be ignored" not in out.stderr and "absent from" not in out.stderr, out.stderr
    assert (tmp_path / "out" / "transformer" / "analysis" / "explorer_page" / "page.html").is_file()


# ----------------------------------------------------------------------------- one table per command line


@pytest.mark.parametrize("argv, message", [
    (["--prompt", "x"], "give exactly one of --workdir (a training run) or --hf_dir"),
    (["--prompt", "x", "--workdir", "/nonexistent/run"], "does not exist"),
    (["--prompt", "x", "--workdir", "W", "--top_k", "0"], "--top_k 0 must be at least 1"),
    (["--prompt", "x", "--workdir", "W", "--step", "-1"], "--step -1: checkpoint steps are >= 0"),
    (["--prompt", "x", "--workdir", "W", "--out", "/nonexistent/dir/x.html"], "no folder /nonexistent/dir"),
    (["--prompt", "x", "--hf_dir", "HF"], "holds no config.json"),
])
def test_the_explorer_command_line_reports_bad_input_in_one_line(tmp_path, monkeypatch, capsys, argv, message):
    from transformer import explore as explore_cli

    argv = [a.replace("HF", str(tmp_path)).replace("W", str(tmp_path)) if a in ("W", "HF") else a for a in argv]
    if "--out" not in argv:
        argv += ["--out", str(tmp_path / "x.html")]
    assert message in one_line_exit(capsys, explore_cli.main, ["explore", *argv], monkeypatch)


@pytest.mark.parametrize("content, out, message", [
    (None, "x.png", "no metrics file at"), (b"\xff\xfe\x00binary", "x.png", "holds no training rows"),
    (b'{"step": 1, "loss": 2.0}\n', "x.txt", "name the output file with an image extension"),
    (b'{"step": 1, "loss": 2.0}\n', "file/x.png", "File exists"),  # a folder that is a file: the OS's one line
])
def test_plot_metrics_reports_bad_input_in_one_line(tmp_path, monkeypatch, capsys, content, out, message):
    from scripts import plot_metrics

    if content is not None:
        (tmp_path / "metrics.jsonl").write_bytes(content)
    (tmp_path / "file").write_text("")
    monkeypatch.setattr(sys, "argv", ["plot_metrics.py", str(tmp_path / "metrics.jsonl"), str(tmp_path / out)])
    with pytest.raises(SystemExit) as exit_:
        plot_metrics.main()
    err = capsys.readouterr().err + (exit_.value.code if isinstance(exit_.value.code, str) else "")
    assert exit_.value.code != 0 and message in err and err.strip().count("\n") == 0 and "Traceback" not in err, err


@pytest.mark.slow
@pytest.mark.parametrize("args, message", [
    (["--top_p", "0"], "--top_p 0.0 must be in (0, 1]"),
    (["--temperature", "nan"], "temperature must be >= 0 and finite"),
    (["--seed", "-1"], "the seed must be a whole number in [0, 2**63 - 1"),
    (["--prompt", b"RO\xffMEO".decode("utf-8", "surrogateescape")], "--prompt holds bytes that are not UTF-8 text"),
    (["--prompt_file", "/"], "--prompt_file '/' is a folder"),
    (["--hf_dir", "/nonexistent"], "give exactly one of --workdir"),
])
def test_sample_py_reports_bad_input_in_one_line_before_loading(args, message):
    import subprocess

    out = subprocess.run([sys.executable, os.path.join(ROOT, "sample.py"), "--workdir", "/nonexistent/run", *args],
                         capture_output=True, cwd=ROOT, timeout=300)
    err = out.stderr.decode("utf-8", "replace")
    assert out.returncode == 1 and err.startswith("error: ") and err.count("\n") == 1 and message in err, err


def test_the_ablation_loss_grid_is_each_head_switched_off_alone(tiny):
    import transformer
    from transformer.analysis.patching import ablation_losses
    from transformer.model import edits

    cfg, params = tiny
    tokens = [5, 9, 1, 33, 7, 2, 61, 12]
    grid = np.asarray(ablation_losses(params, cfg, tokens))
    assert grid.shape == (cfg.num_layers, cfg.num_heads) and np.abs(grid).max() > 1e-4
    clean = float(transformer.loss(params, cfg, tokens))
    for l, h in ((0, 0), (1, 3)):
        mask = np.ones((cfg.num_layers, cfg.num_heads)); mask[l, h] = 0
        alone = float(transformer.loss(params, cfg, tokens, [edits.ablate_heads(cfg, mask)]))
        assert grid[l, h] == pytest.approx(alone - clean, abs=1e-5)


def test_a_train_step_larger_than_the_device_is_refused_before_it_runs_and_writes_nothing(tmp_path, monkeypatch):
    """Case 22 before allocating: the compiled step's own memory need against the device's."""
    from configs import tiny
    from transformer.experiments.catalog import data_task, eval_metrics
    from transformer.training import setup

    config = tiny.get_config()
    config.train.update(batch_size=512, sample_tokens=0)
    config.data.cache_dir = str(tmp_path / "tokens")
    monkeypatch.setattr(setup, "device_bytes", lambda: 2**20)  # a device of 1 MiB
    workdir = tmp_path / "run"
    with pytest.raises(ValueError, match=r"^out of memory on cpu \(the train step needs [\d.]+ GiB, the device holds "
                                         r"0.0 GiB\): a step of train.batch_size=512 .*--config.model.remat=True$"):
        setup.set_up(config, str(workdir), data_task(config), eval_metrics(config))
    assert not workdir.exists()
    monkeypatch.setattr(setup, "device_bytes", lambda: 2**40)  # a device of 1 TiB: the same run sets up
    assert setup.set_up(config, str(workdir), data_task(config), eval_metrics(config)).steps.train is not None


RUN = os.path.join(ROOT, "tests", "data", "before_redesign_run")  # a committed run: one checkpoint, step 20


@pytest.mark.parametrize("call, error, message", [
    (lambda d: transformer.load_run(os.path.join(d, "nope")), FileNotFoundError, r"'.*nope' does not exist; pass the --workdir"),
    (lambda d: transformer.load_run(__file__), FileNotFoundError, r"test_entry_points.py' is a file; pass the --workdir"),
    (lambda d: transformer.load_run(d), Exception, r"no checkpoints in '.*' \(expected a folder .*/checkpoints\); train first"),
    (lambda d: transformer.load_run(RUN, step=999), Exception, r"no checkpoint at step 999 in .*; available: \[20\]"),
    (lambda d: transformer.load_run(os.path.join(RUN, "checkpoints", "20"), step=10), ValueError, r"checkpoint of step 20, not step 10"),
    (lambda d: transformer.load_run(123), TypeError, r"takes a run's folder and an int step, not 123, None"),
    (lambda d: transformer.load_run(RUN, step="20"), TypeError, r"an int step, not '.*', '20'"),
    (lambda d: transformer.validation_tokens(d), Exception, r"no checkpoints in '.*'; train first|no checkpoints in '.*' \(expected"),
    (lambda d: transformer.config_from_file(os.path.join(d, "nope.py")), FileNotFoundError, r"no config file '.*nope.py'; pass a path"),
    (lambda d: transformer.config_from_file(os.path.join(ROOT, "configs", "tiny.py"), num_heads=3), ValueError,
     r"d_model=64 is not divisible by num_heads=3; choose num_heads dividing d_model"),
    (lambda d: transformer.config_from_file(os.path.join(ROOT, "configs", "tiny.py"), num_headz=3), ValueError,
     r"unknown model config field\(s\) \['num_headz'\]"),
], ids=["missing", "a file", "no checkpoints", "no such step", "two steps", "not a path", "step not an int",
        "validation of no run", "no config file", "a bad field value", "an unknown field"])
def test_the_loading_functions_refuse_bad_values_in_one_line(tmp_path, call, error, message):
    """The public loaders the README shows (load_run, validation_tokens, config_from_file), fed bad values."""
    with pytest.raises(error, match=message) as raised:
        call(str(tmp_path))
    assert "\n" not in str(raised.value)


@pytest.mark.slow
@pytest.mark.parametrize("args, message", [
    (["--sweep", "nope.py", "--workdir", "W"], r"^error: .*nope.py"),
    (["--sweep", "BROKEN", "--workdir", "W"], r"^error: .*broken.py"),
    (["--sweep", "configs/sweeps/tiny.py", "--workdir", "W", "--jobs", "0"], r"^error: --jobs=0: give the number"),
    (["--sweep", "configs/sweeps/tiny.py", "--workdir", "W", "--run", "nope"], r"^error: .* has no run named 'nope'"),
], ids=["no sweep file", "a syntax error", "no jobs", "no such run"])
def test_the_sweep_command_line_refuses_bad_values_in_one_line_and_exits_2(tmp_path, args, message):
    broken = tmp_path / "broken.py"
    broken.write_text("def get_config(:\n")
    args = [str(broken) if a == "BROKEN" else str(tmp_path / "runs") if a == "W" else a for a in args]
    done = subprocess.run([sys.executable, os.path.join(ROOT, "sweep.py"), *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert re.match(message, done.stderr.strip()), done.stderr
