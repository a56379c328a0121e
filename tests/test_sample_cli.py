"""sample.py end to end, in subprocesses, on a tiny checkpoint written with transformer.training.checkpoint."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer import sampling
from transformer.model.config import ModelConfig
from transformer.model.decoder import Decoder
from transformer.data.tokenizer import ByteTokenizer

checkpoint = pytest.importorskip("transformer.training.checkpoint", reason="checkpoint module not yet available")

pytestmark = pytest.mark.slow
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CFG = ModelConfig(vocab_size=256, max_seq_len=64, d_model=32, num_layers=2, num_heads=4)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> str:
    """A run folder holding one checkpoint (step 1) of a tiny byte-level model with random weights."""
    workdir = str(tmp_path_factory.mktemp("run"))
    params = Decoder(CFG).init(jax.random.key(0), jnp.zeros((1, 1), jnp.int32))["params"]
    ckpt = checkpoint.Checkpointer(workdir)
    ckpt.save(1, {"step": 1, "params": params}, {"model": CFG.to_dict()}, ByteTokenizer(), val_loss=0.0)
    ckpt.wait()
    return workdir


def sample(*args: str) -> subprocess.CompletedProcess:
    """Runs sample.py; stdout and stderr as text, decoded without newline translation (random
    weights print raw carriage returns)."""
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "sample.py"), *args], capture_output=True, cwd=ROOT, timeout=300
    )
    return subprocess.CompletedProcess(out.args, out.returncode, out.stdout.decode(), out.stderr.decode())


def test_samples_are_printed_and_match_generate(workdir):
    out = sample("--workdir", workdir, "--prompt", "ROMEO:", "--num_samples", "2",
                 "--max_new_tokens", "20", "--temperature", "0.8", "--top_k", "40", "--seed", "3",
                 "--chunk_size", "7")
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("--- sample") == 2
    # Each sample is row i of a batch with the same seed: recompute it in-process and compare.
    cfg, params, tokenizer = checkpoint.restore_for_inference(workdir)
    prompt = tokenizer.encode("ROMEO:")
    expected = sampling.generate(
        params, cfg, [prompt, prompt], jax.random.key(3), 20, temperature=0.8, top_k=40
    ).tokens
    for i, row in enumerate(expected):
        text = "ROMEO:" + tokenizer.decode(row)
        assert f"--- sample {i + 1} of 2 ---\n{text}\n" in out.stdout


def test_prompt_file_and_a_context_longer_than_the_model(workdir, tmp_path):
    prompt_file = tmp_path / "prompt.txt"
    prompt_file.write_text("To be, or not to be")
    out = sample("--workdir", workdir, "--prompt_file", str(prompt_file), "--max_new_tokens", "300")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "--- sample 1 of 1 ---\nTo be, or not to be" in out.stdout
    assert "generating 45 tokens, not 300" in out.stderr  # 64 - 19 prompt bytes


def test_greedy_is_reproducible(workdir):
    args = ("--workdir", workdir, "--prompt", "A", "--max_new_tokens", "10", "--temperature", "0")
    first, second = sample(*args), sample(*args)
    assert first.returncode == 0, first.stderr[-3000:]
    assert first.stdout == second.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["--workdir", "/nonexistent/run"], "does not exist"),
        (["--workdir", "{empty}"], "no checkpoints"),
        (["--workdir", "{run}", "--prompt", ""], "the prompt is empty"),
        (["--workdir", "{run}", "--prompt", "x" * 64], "the prompt has 64 tokens"),
        (["--workdir", "{run}", "--step", "7"], "no checkpoint at step 7"),
        ([], "give exactly one of --workdir"),
        (["--workdir", "{run}", "--seed", "99999999999999999999"], "the seed must be a whole number in [0, 2**63 - 1"),
        (["--workdir", "{run}", "--seed", "-1"], "the seed must be a whole number in [0, 2**63 - 1"),
    ],
)
def test_errors_are_clean_messages(workdir, tmp_path, args, message):
    args = [a.format(empty=tmp_path, run=workdir) for a in args]
    out = sample(*args)
    assert out.returncode != 0
    assert message in out.stderr
    assert "Traceback" not in out.stderr


def test_text_streaming_holds_back_split_characters():
    from transformer.sampling.text import stream_text

    ids = ByteTokenizer().encode("né!")  # 'é' is two bytes: split across two chunks
    chunks = [np.array([ids[:2]]), np.array([ids[2:3]]), np.array([ids[3:]])]
    assert list(stream_text(ByteTokenizer(), chunks)) == ["n", "é", "!"]


def test_hf_dir_samples_a_hugging_face_model(tmp_path):
    """--hf_dir: a tiny random GPT-2 saved by transformers, with a byte tokenizer beside it."""
    pytest.importorskip("transformer.hf", reason="Hugging Face import module not yet available")
    transformers = pytest.importorskip("transformers")
    from transformer.hf import from_hf
    from transformer.data.tokenizer import save_tokenizer

    config = transformers.GPT2Config(vocab_size=256, n_positions=64, n_embd=32, n_layer=2, n_head=4)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path)
    save_tokenizer(ByteTokenizer(), tmp_path)
    out = sample("--hf_dir", str(tmp_path), "--prompt", "Hi", "--max_new_tokens", "12", "--temperature", "0")
    assert out.returncode == 0, out.stderr[-3000:]
    cfg, params = from_hf(str(tmp_path))
    prompt = ByteTokenizer().encode("Hi")
    expected = sampling.generate(params, cfg, [prompt], jax.random.key(0), 12, temperature=0).tokens[0]
    assert out.stdout == f"--- sample 1 of 1 ---\nHi{ByteTokenizer().decode(expected)}\n"


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--temperature", "nan", "temperature must be >= 0 and finite (0 = greedy), got nan"),
        ("--temperature", "inf", "temperature must be >= 0 and finite (0 = greedy), got inf"),
        ("--top_p", "nan", "top_p must be in (0, 1], got nan; use None or 1.0 to keep every token"),
    ],
    ids=["temperature-nan", "temperature-inf", "top_p-nan"],
)
def test_non_finite_sampling_options_fail_with_one_error_line(workdir, flag, value, message):
    """A NaN temperature once printed NUL bytes (all-NaN logits draw token 0) and exited 0."""
    out = sample("--workdir", workdir, "--prompt", "A", "--max_new_tokens", "5", flag, value)
    assert out.returncode == 1, out.stderr[-3000:]
    assert out.stdout == ""  # stopped before sampling
    assert [line for line in out.stderr.splitlines() if line.startswith("error:")] == [f"error: {message}"]
    assert "Traceback" not in out.stderr
