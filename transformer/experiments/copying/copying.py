"""A synthetic corpus that only copying predicts: random strings, each said twice.

    write_copying_corpus("runs/copying.txt")   # then train with --config.data.path=runs/copying.txt

Each line is n random printable characters (n uniform in [min_length, max_length]) twice: the first
copy costs ln 94 nats a byte, the repeat is free to an induction head (and to no fixed offset).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from transformer.data.atomic_files import write_atomically

ALPHABET = np.array([chr(c) for c in range(33, 127)])  # printable ASCII without the space: 94 characters


def copying_text(num_bytes: int, seed: int = 0, min_length: int = 8, max_length: int = 40) -> str:
    """At least `num_bytes` bytes of lines s + s + newline, s drawn from ALPHABET with `seed`."""
    if not 1 <= min_length <= max_length:
        raise ValueError(f"copying lines need 1 <= min_length <= max_length, got {min_length} and {max_length}")
    rng = np.random.default_rng(seed)
    lines, size = [], 0
    while size < num_bytes:
        s = "".join(rng.choice(ALPHABET, rng.integers(min_length, max_length + 1)))
        lines.append(s + s + "\n")
        size += len(lines[-1])
    return "".join(lines)


def write_copying_corpus(path: str, num_bytes: int = 2_000_000, seed: int = 0, min_length: int = 8,
                         max_length: int = 40) -> str:
    """Writes `copying_text(...)` to `path` (atomically; kept if it already holds that text) -> path."""
    text = copying_text(num_bytes, seed, min_length, max_length)
    if os.path.isfile(path) and Path(path).read_text(encoding="utf-8") == text:
        return path
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_atomically(path, text)
    return path
