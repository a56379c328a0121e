"""Text in and out of the sampler: sample.py's prompt and samples, printed as they are generated, and
the short sample a training run prints when it ends."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from transformer.model.config import ModelConfig
from transformer.sampling.sampler import SamplingOptions, encode_prompt, generate, generate_stream, row_keys, seed_key


def stream_text(tokenizer: Any, chunks: Iterable[np.ndarray]) -> Iterator[str]:
    """The text of token chunks [1, n], as pieces to print one after another: all tokens so far decoded
    at each chunk (merges come out right), a trailing U+FFFD (a character not all here) held back."""
    ids: list[int] = []
    shown = 0
    for chunk in chunks:
        ids.extend(chunk[0].tolist())
        text = tokenizer.decode(ids)
        complete = len(text.rstrip("\ufffd"))
        if complete > shown:
            yield text[shown:complete]
            shown = complete
    text = tokenizer.decode(ids)
    if len(text) > shown:
        yield text[shown:]


def print_samples(cfg: ModelConfig, params: Any, tokenizer: Any, prompt: str, num_samples: int, max_new_tokens: int,
                  seed: int, chunk_size: int, sinks: int | None = None, **sampling: Any) -> None:
    """Prints `num_samples` continuations of the prompt as generated, sample i as row i of a batch drawn
    with key `seed`. sampling: SamplingOptions' fields; sinks: `generate`'s (None: stop at the context)."""
    ids = encode_prompt(cfg, tokenizer, prompt)
    sampling = {"vocab_limit": tokenizer.vocab_size, **sampling}  # never an id the tokenizer cannot decode
    SamplingOptions(**sampling)  # a bad option fails here, before anything is printed
    keys = row_keys(seed_key(seed), num_samples)  # and so does a bad seed
    # The model cannot see past its context: generate fewer tokens rather than fail.
    n = max_new_tokens if sinks is not None else min(max_new_tokens, cfg.max_seq_len - len(ids))
    if n < max_new_tokens:
        print(f"note: generating {n} tokens, not {max_new_tokens}: the prompt has {len(ids)} tokens and the "
              f"model's context is {cfg.max_seq_len}", file=sys.stderr)
    for i in range(num_samples):
        print(f"--- sample {i + 1} of {num_samples} ---")
        print(prompt, end="", flush=True)
        chunks = generate_stream(params, cfg, [ids], keys[i : i + 1], n, chunk_size=chunk_size, sinks=sinks, **sampling)
        for piece in stream_text(tokenizer, chunks):
            print(piece, end="", flush=True)
        print()


def generate_text(model: tuple, prompt: str = "\n", max_new_tokens: int = 100, seed: int = 0, **sampling: Any) -> str:
    """The text `model` = (cfg, params, tokenizer), as load_run returns it, adds to `prompt`: up to
    `max_new_tokens` tokens, as many as the context leaves. sampling: `generate`'s (temperature, edits, ...)."""
    cfg, params, tokenizer = model
    ids = encode_prompt(cfg, tokenizer, prompt)
    out = generate(params, cfg, [ids], seed_key(seed), min(max_new_tokens, cfg.max_seq_len - len(ids)),
                   **{"vocab_limit": tokenizer.vocab_size, **sampling})
    return tokenizer.decode(out.tokens[0][: int(out.lengths[0])].tolist())


def read_prompt(prompt: str | None, prompt_file: str | None) -> str:
    """The prompt: `prompt_file`'s UTF-8 text ('-': standard input) if given, else `prompt` (default "\\n")."""
    if prompt_file is None:
        return "\n" if prompt is None else command_line_text(prompt, "--prompt")
    if prompt is not None:
        raise ValueError("give either --prompt or --prompt_file, not both")
    if prompt_file != "-" and not os.path.exists(prompt_file) or os.path.isdir(prompt_file):  # /dev/stdin exists
        what = "a folder" if os.path.isdir(prompt_file) else "not a file"
        raise ValueError(f"--prompt_file {prompt_file!r} is {what}; pass a UTF-8 text file")
    try:
        if prompt_file == "-":
            return sys.stdin.buffer.read().decode("utf-8")
        with open(prompt_file, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError as e:
        raise ValueError(f"--prompt_file {prompt_file!r} is not UTF-8 text ({e.reason} at byte {e.start}); "
                         "convert it, e.g. iconv -f latin1 -t utf-8") from None


def command_line_text(text: str, flag: str) -> str:
    """`text`, or a ValueError naming `flag` when its bytes are not UTF-8 (Python gives lone surrogates)."""
    bad = next((i for i, c in enumerate(text) if "\ud800" <= c <= "\udfff"), None)
    if bad is not None:
        raise ValueError(f"{flag} holds bytes that are not UTF-8 text (at character {bad}); pass UTF-8, e.g. "
                         "convert it with iconv -t utf-8, or put it in a file for --prompt_file")
    return text
