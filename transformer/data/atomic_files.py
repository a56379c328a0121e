"""Atomic file writes: a file is either its old self or complete, never half-written.

    with atomic_path(path) as tmp:       # write anything to tmp, a file name next to path ...
        tmp.write_bytes(data)            # ... which becomes `path` only if the block succeeds
    write_atomically(path, text)         # text -> path
    save_json(path, obj)                 # JSON (indented) -> path

The trick is write-then-rename: the new contents go to a hidden temporary file in the same folder,
and `os.replace` swaps it in, which the file system does in one step. A run killed mid-write leaves
the previous file (or none), and the temporary file is deleted when the block fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary file name next to `path` (`.NAME.<random>.tmp`), moved onto `path` when the
    block ends without an error and deleted otherwise. Nothing is created until the block writes."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_atomically(path: str | os.PathLike, text: str) -> None:
    """Writes `text` to `path` as UTF-8, atomically (see `atomic_path`)."""
    with atomic_path(path) as tmp, open(tmp, "x", encoding="utf-8") as f:
        f.write(text)


def save_json(path: str | os.PathLike, obj: Any) -> None:
    """Writes `obj` as indented JSON to `path`, atomically (see `atomic_path`)."""
    write_atomically(path, json.dumps(obj, indent=2))
