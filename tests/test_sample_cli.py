"""sample.py on a tiny checkpoint written with transformer.run.checkpoint: its printed samples
against a decode that shares nothing with the sampler (a full forward pass per token, no KV cache),
and its errors, in this process through the functions sample.py calls (two through the command line)."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers.decoder import random_params
from transformer.sampling.text import read_prompt
from transformer.data.tokenizer import ByteTokenizer, save_tokenizer
from transformer.load import load_model
from transformer.model.config import ModelConfig
from transformer.model.decoder import Decoder
from transformer.sampling.sampler import check_seed
from transformer.sampling.text import print_samples, stream_text
from transformer.run import checkpoint
from transformer.run.checkpoint import CheckpointError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CFG = ModelConfig(vocab_size=256, max_seq_len=64, d_model=32, num_layers=2, num_heads=4)


@pytest.fixture(scope="module")
def params():
    """The weights of a tiny byte-level model, drawn at std 0.25 (tests/helpers/decoder.py): far from
    the initialiser's near-uniform first logits, so a wrong cache slot or key changes the samples."""
    return random_params(Decoder(CFG))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, params) -> str:
    """A run folder holding one checkpoint (step 1) of those weights."""
    workdir = str(tmp_path_factory.mktemp("run"))
    ckpt = checkpoint.Checkpointer(workdir)
    ckpt.save(1, {"step": 1, "params": params}, {"model": CFG.to_dict()}, ByteTokenizer(), val_loss=0.0)
    ckpt.wait()
    ckpt.close()
    return workdir


def sample(*args: str) -> subprocess.CompletedProcess:
    """Runs sample.py; stdout and stderr as text, decoded without newline translation (random
    weights print raw carriage returns)."""
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "sample.py"), *args], capture_output=True, cwd=ROOT, timeout=300
    )
    return subprocess.CompletedProcess(out.args, out.returncode, out.stdout.decode(), out.stderr.decode())


def full_forward_decode(cfg: ModelConfig, params, prompt: list[int], n: int, draw) -> list[int]:
    """`n` tokens after `prompt`, token i = draw(logits [V], i) of the last position of a forward pass
    over the whole sequence so far: no KV cache, no prefill, no scan. The sequence sits at the start
    of a zero-padded window of max_seq_len tokens (one compile); the causal mask keeps the padding
    after it out of its logits."""
    forward = jax.jit(lambda p, window: Decoder(cfg).apply({"params": p}, window)[0][0])  # [T, V]
    tokens = list(prompt)
    for i in range(n):
        window = np.zeros((1, cfg.max_seq_len), np.int32)
        window[0, : len(tokens)] = tokens
        tokens.append(int(draw(forward(params, window)[len(tokens) - 1], i)))
    return tokens[len(prompt):]


def greedy(logits, i) -> int:
    """The argmax, asserted clear of a tie (a cached decode may differ from a full pass by ~1e-6)."""
    second, first = np.sort(np.asarray(logits))[-2:]
    assert first - second > 1e-4, (i, first, second)
    return int(np.argmax(logits))


def sampled(seed: int, row: int, temperature: float, top_k: int):
    """The draw the sampler documents (transformer/sampling/sampler.py): row b's i-th token is a
    categorical draw, with key fold_in(fold_in(key(seed), b), i), from the logits divided by the
    temperature with all but the top_k largest masked."""
    row_key = jax.random.fold_in(jax.random.key(seed), row)

    def draw(logits, i) -> int:
        z = logits / temperature
        z = jnp.where(z >= jnp.sort(z)[-top_k], z, -jnp.inf)
        return int(jax.random.categorical(jax.random.fold_in(row_key, i), z))

    return draw


def printed(prompt: str, rows: list[list[int]]) -> str:
    """What sample.py prints on stdout for these new tokens of each sample."""
    return "".join(f"--- sample {i + 1} of {len(rows)} ---\n{prompt}{ByteTokenizer().decode(r)}\n"
                   for i, r in enumerate(rows))


@pytest.mark.slow
def test_samples_match_a_full_forward_decode_with_the_documented_keys(workdir, params):
    """Two samples at temperature 0.8, top-k 40, seed 3, streamed in chunks of 7: each is the
    full-forward decode of the saved weights with its row's keys (so a sample is reproducible from
    --seed alone)."""
    out = sample("--workdir", workdir, "--prompt", "ROMEO:", "--num_samples", "2",
                 "--max_new_tokens", "20", "--temperature", "0.8", "--top_k", "40", "--seed", "3",
                 "--chunk_size", "7")
    assert out.returncode == 0, out.stderr[-3000:]
    prompt = ByteTokenizer().encode("ROMEO:")
    rows = [full_forward_decode(CFG, params, prompt, 20, sampled(3, b, 0.8, 40)) for b in range(2)]
    assert rows[0] != rows[1]  # each row draws with its own key
    assert out.stdout == printed("ROMEO:", rows)


def test_greedy_from_a_prompt_file_past_the_context_is_the_argmax_decode(workdir, params, tmp_path):
    """--prompt_file with more new tokens than the context leaves: a note, then the 64 - 19 = 45
    tokens a full-forward argmax decode gives."""
    prompt_file = tmp_path / "prompt.txt"
    prompt_file.write_text("To be, or not to be")
    out = sample("--workdir", workdir, "--prompt_file", str(prompt_file), "--max_new_tokens", "300",
                 "--temperature", "0")
    assert out.returncode == 0, out.stderr[-3000:]
    assert ("note: generating 45 tokens, not 300: the prompt has 19 tokens and the model's context is 64"
            in out.stderr)
    expected = full_forward_decode(CFG, params, ByteTokenizer().encode("To be, or not to be"), 45, greedy)
    assert out.stdout == printed("To be, or not to be", [expected])


def test_text_streaming_holds_back_split_characters():
    ids = ByteTokenizer().encode("né!")  # 'é' is two bytes: split across two chunks
    chunks = [np.array([ids[:2]]), np.array([ids[2:3]]), np.array([ids[3:]])]
    assert list(stream_text(ByteTokenizer(), chunks)) == ["n", "é", "!"]


@pytest.mark.slow
def test_hf_dir_samples_a_hugging_face_model(tmp_path):
    """--hf_dir: a tiny random GPT-2 saved by transformers, with a byte tokenizer beside it, samples
    greedily what a full-forward decode of the imported weights gives."""
    transformers = pytest.importorskip("transformers")
    from transformer.hf import from_hf  # the Hugging Face conversions: only this test needs them

    config = transformers.GPT2Config(vocab_size=256, n_positions=64, n_embd=32, n_layer=2, n_head=4)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path)
    save_tokenizer(ByteTokenizer(), tmp_path)
    out = sample("--hf_dir", str(tmp_path), "--prompt", "Hi", "--max_new_tokens", "12", "--temperature", "0")
    assert out.returncode == 0, out.stderr[-3000:]
    cfg, params = from_hf(str(tmp_path))
    expected = full_forward_decode(cfg, params, ByteTokenizer().encode("Hi"), 12, greedy)
    assert out.stdout == printed("Hi", [expected])


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize("workdir_flag, hf_dir, step, error, message", [
    ("/nonexistent/run", None, None, FileNotFoundError,
     "workdir '/nonexistent/run' does not exist; pass the --workdir of a training run (e.g. runs/shakespeare "
     "after `make train`)"),
    ("{empty}", None, None, CheckpointError,
     "no checkpoints in '{empty}' (expected a folder {empty}/checkpoints); train first (python train.py "
     "--workdir ...) or pass the workdir of a trained run"),
    ("{run}", None, 7, CheckpointError, "no checkpoint at step 7 in {run}/checkpoints; available: [1]"),
    (None, None, None, ValueError,
     "give exactly one of --workdir (a training run) or --hf_dir (a Hugging Face model)"),
    ("{run}", "{empty}", None, ValueError,
     "give exactly one of --workdir (a training run) or --hf_dir (a Hugging Face model)"),
], ids=["no-such-workdir", "no-checkpoints", "no-such-step", "neither", "both"])
def test_a_model_that_cannot_be_loaded_is_named_with_the_fix(workdir, tmp_path, workdir_flag, hf_dir, step, error,
                                                             message):
    """load_model, sample.py's loading: an error of a type sample.py reports in one line, naming the fix."""
    fill = lambda arg: arg if arg is None else arg.format(run=workdir, empty=tmp_path)  # noqa: E731
    with pytest.raises(error) as raised:
        load_model(fill(workdir_flag), fill(hf_dir), step)
    assert str(raised.value) == fill(message)


def test_a_bad_prompt_file_is_named_with_the_fix(tmp_path):
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("café".encode("latin-1"))
    for prompt, path, message in [
        (None, str(tmp_path), f"--prompt_file {str(tmp_path)!r} is a folder; pass a UTF-8 text file"),
        (None, str(tmp_path / "none.txt"), f"--prompt_file {str(tmp_path / 'none.txt')!r} is not a file; pass a "
                                           "UTF-8 text file"),
        (None, str(latin1), f"--prompt_file {str(latin1)!r} is not UTF-8 text (unexpected end of data at "
                            "byte 3); convert it, e.g. iconv -f latin1 -t utf-8"),
        ("x", str(latin1), "give either --prompt or --prompt_file, not both"),
    ]:
        with pytest.raises(ValueError) as raised:
            read_prompt(prompt, path)
        assert str(raised.value) == message


@pytest.mark.parametrize("seed", [99999999999999999999, -1])
def test_a_seed_jax_cannot_take_is_refused(seed):
    with pytest.raises(ValueError) as raised:
        check_seed(seed)
    assert str(raised.value) == f"the seed must be a whole number in [0, 2**63 - 1 = {2**63 - 1}], got {seed}"


@pytest.mark.parametrize("prompt, options, message", [
    ("", {}, "the prompt is empty; pass --prompt with at least one character"),
    ("x" * 64, {}, "the prompt has 64 tokens but the model's context is max_seq_len=64, leaving no room for new "
                   "tokens; shorten the prompt"),
    ("A", dict(temperature=float("nan")), "temperature must be >= 0 and finite (0 = greedy), got nan"),
    ("A", dict(temperature=float("inf")), "temperature must be >= 0 and finite (0 = greedy), got inf"),
    ("A", dict(top_p=float("nan")), "top_p must be in (0, 1], got nan; use None or 1.0 to keep every token"),
], ids=["empty-prompt", "prompt-fills-the-context", "temperature-nan", "temperature-inf", "top_p-nan"])
def test_a_bad_prompt_or_option_fails_before_anything_is_printed(params, capsys, prompt, options, message):
    """print_samples, sample.py's sampling: a NaN temperature once printed NUL bytes (all-NaN
    logits draw token 0) and exited 0."""
    with pytest.raises(ValueError) as raised:
        print_samples(CFG, params, ByteTokenizer(), prompt, 1, 5, 0, 16, **{"temperature": 0.8, **options})
    assert str(raised.value) == message
    assert capsys.readouterr().out == ""


@pytest.mark.slow
@pytest.mark.parametrize("args, message", [
    (["--workdir", "{run}", "--prompt", "A", "--max_new_tokens", "5", "--temperature", "nan"],
     "temperature must be >= 0 and finite (0 = greedy), got nan"),
    # The prompt is read before anything is loaded: its error comes first.
    (["--workdir", "/nonexistent/run", "--prompt_file", "{folder}"],
     "--prompt_file '{folder}' is a folder; pass a UTF-8 text file"),
], ids=["temperature-nan", "prompt-file-before-workdir"])
def test_the_command_line_prints_an_error_as_one_line(workdir, tmp_path, args, message):
    """Exit 1, nothing on stdout, one 'error:' line on stderr, no traceback."""
    out = sample(*[a.format(run=workdir, folder=tmp_path) for a in args])
    assert out.returncode == 1, out.stderr[-3000:]
    assert out.stdout == ""
    assert [line for line in out.stderr.splitlines() if line.startswith("error:")] == [
        f"error: {message.format(folder=tmp_path)}"]
    assert "Traceback" not in out.stderr
