"""Atomic file writes: the new contents go to a hidden file in the same folder that `os.replace` swaps
in, so a run killed mid-write leaves the previous file (or none), never half of one."""

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
    """A hidden temporary name next to `path` to write; moved onto `path` if the block ends without error."""
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
    write_atomically(path, json.dumps(obj, indent=2))
