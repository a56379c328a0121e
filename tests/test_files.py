"""Tests for transformer/data/atomic_files.py: atomic writes leave a complete file or the old one, never a temporary."""

import json

import pytest

from transformer.data.atomic_files import atomic_path, save_json, write_atomically


def test_write_atomically_replaces_the_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "notes.txt"
    write_atomically(path, "first")
    write_atomically(path, "second ¿é?")
    assert path.read_text(encoding="utf-8") == "second ¿é?"
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_save_json_round_trips(tmp_path):
    save_json(tmp_path / "config.json", {"model": {"d_model": 64}, "steps": [1, 2]})
    assert json.loads((tmp_path / "config.json").read_text()) == {"model": {"d_model": 64}, "steps": [1, 2]}


def test_a_failed_write_keeps_the_old_file_and_removes_the_temporary(tmp_path):
    path = tmp_path / "cache.bin"
    path.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="killed"), atomic_path(path) as tmp:
        tmp.write_bytes(b"half of the new")
        raise RuntimeError("killed mid-write")
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["cache.bin"]
