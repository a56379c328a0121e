"""The token stream of a corpus: its documents joined by blank lines, tokenized once into
`cache_dir/<key>.npy` and memory-mapped (restarts skip tokenization; a corpus larger than memory
works). The key hashes the corpus files and the tokenizer, so any edit re-tokenizes.

    train, val, bytes_per_token = load_corpus(path, tokenizer, cache_dir, val_fraction=0.1)
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import NamedTuple

import numpy as np

from transformer.data.corpus import corpus_files, read_document
from transformer.data.atomic_files import atomic_path, save_json
from transformer.data.tokenizer import ByteTokenizer, Tokenizer

DOCUMENT_SEPARATOR = "\n\n"  # a blank line between documents
_CACHE_VERSION = 2  # bump when corpus.markdown_to_play or the cache layout changes


class TokenCorpus(NamedTuple):
    """A tokenized corpus split in two; unpacks as (train, val, bytes_per_token)."""

    train: np.ndarray  # [N_train] uint16 or int32, memory-mapped
    val: np.ndarray  # [N_val], the tail of the token stream
    bytes_per_token: float  # UTF-8 bytes per validation token: bits/byte = loss / ln 2 / this


def load_corpus(path: str | os.PathLike | None, tokenizer: Tokenizer, cache_dir: str | os.PathLike,
                val_fraction: float = 0.1) -> TokenCorpus:
    """The corpus at `path` tokenized (cached), split into its head and its last `val_fraction`; each
    document is encoded on its own, so no BPE token spans two."""
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction={val_fraction} must be in (0, 1), e.g. 0.1 for 10% validation.")
    files, bundled, cache_dir = corpus_files(path), path is None, Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    identity = {"version": _CACHE_VERSION, "bundled": bundled, "separator": DOCUMENT_SEPARATOR,
                "corpus": file_digests(files, cache_dir), "tokenizer": tokenizer.fingerprint}
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:32]  # changes with any input
    cache = cache_dir / f"{key}.npy"
    if not cache.exists():
        _tokenize_to_file(files, bundled, tokenizer, cache)
    tokens = np.load(cache, mmap_mode="r")
    num_val = int(len(tokens) * val_fraction)
    if num_val < 1 or num_val >= len(tokens):
        raise ValueError(f"The corpus has {len(tokens)} tokens: val_fraction={val_fraction} leaves {num_val} for "
                         f"validation and {len(tokens) - num_val} for training. Use more text or a different "
                         "val_fraction.")
    train, val = tokens[: len(tokens) - num_val], tokens[len(tokens) - num_val :]
    val_bytes = _cached_val_bytes(cache_dir / f"{key}.val{num_val}.json", val, tokenizer)
    return TokenCorpus(train, val, val_bytes / num_val)


def file_digests(files: list[Path], cache_dir: Path) -> list[list[str]]:
    """[[absolute path, SHA-256], ...] of `files`, memoised by stat in `cache_dir/file_digests.json` (no re-read)."""
    memo_path = cache_dir / "file_digests.json"
    try:
        memo = json.loads(memo_path.read_text())
    except (OSError, ValueError):
        memo = {}  # no memo yet, or a damaged one: hash again
    digests, changed = [], False
    for f in files:
        st = f.stat()
        stamp = [st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns]
        name = str(f.resolve())
        if memo.get(name, {}).get("stamp") != stamp:
            with open(f, "rb") as fh:
                memo[name] = {"stamp": stamp, "sha256": hashlib.file_digest(fh, "sha256").hexdigest()}
            changed = True
        digests.append([name, memo[name]["sha256"]])
    if changed:
        cache_dir.mkdir(parents=True, exist_ok=True)
        save_json(memo_path, memo)
    return digests


def _tokenize_to_file(files: list[Path], bundled: bool, tokenizer: Tokenizer, cache: Path) -> None:
    """Encodes the documents into `cache` (.npy) atomically, by plain writes (a full disk: OSError, not SIGBUS)."""
    dtype = np.dtype(np.uint16 if tokenizer.vocab_size <= 2**16 else np.int32)  # halves disk and page cache
    separator = tokenizer.encode_array(DOCUMENT_SEPARATOR).astype(dtype)
    raw_fd, raw = tempfile.mkstemp(dir=cache.parent, prefix=".tokens.", suffix=".bin")
    try:
        # Pass 1: append raw tokens; the total length is unknown until the end.
        with os.fdopen(raw_fd, "wb") as f:
            for i, file in enumerate(files):
                if i:
                    separator.tofile(f)
                tokenizer.encode_array(read_document(file, bundled)).astype(dtype).tofile(f)
        # Pass 2: a .npy header, then the raw tokens copied after it in chunks.
        num_tokens = os.path.getsize(raw) // dtype.itemsize
        header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": (num_tokens,)}
        with atomic_path(cache) as npy, open(npy, "xb") as out, open(raw, "rb") as tokens:
            np.lib.format.write_array_header_1_0(out, header)
            shutil.copyfileobj(tokens, out, 1 << 24)
    except OSError as e:
        raise OSError(e.errno, e.strerror, e.filename or str(cache)) from e
    finally:
        Path(raw).unlink(missing_ok=True)


def _cached_val_bytes(record: Path, val: np.ndarray, tokenizer: Tokenizer) -> int:
    """UTF-8 bytes of the validation text, decoded once and remembered next to the cache."""
    if isinstance(tokenizer, ByteTokenizer):
        return len(val)  # one byte per token, exactly
    if record.exists():
        return json.loads(record.read_text())["val_bytes"]
    # In chunks to bound memory; a character cut at a chunk edge miscounts by <= 3 bytes per 1M tokens.
    chunk = 1 << 20
    val_bytes = sum(len(tokenizer.decode(val[i : i + chunk]).encode("utf-8")) for i in range(0, len(val), chunk))
    save_json(record, {"val_bytes": val_bytes})
    return val_bytes
