"""The copying corpus: lines of a random string said twice, the same for the same seed."""

import os

import pytest

from transformer.experiments.copying.copying import ALPHABET, copying_text, write_copying_corpus


def test_every_line_is_a_string_of_the_alphabet_repeated():
    text = copying_text(5_000, seed=3, min_length=4, max_length=9)
    assert len(text) >= 5_000 and text.endswith("\n")
    lines = text[:-1].split("\n")
    lengths = set()
    for line in lines:
        n = len(line) // 2
        assert len(line) == 2 * n and line[:n] == line[n:], line
        assert set(line) <= set(ALPHABET)
        lengths.add(n)
    assert lengths == set(range(4, 10))  # every length drawn, none outside the range
    assert len(set(lines)) > 0.99 * len(lines)  # random strings, not a few repeated


def test_the_same_seed_gives_the_same_text_and_another_another():
    assert copying_text(2_000, seed=1) == copying_text(2_000, seed=1)
    assert copying_text(2_000, seed=1) != copying_text(2_000, seed=2)


def test_written_once_and_kept(tmp_path):
    path = str(tmp_path / "sub" / "copying.txt")
    assert write_copying_corpus(path, num_bytes=1_000) == path
    with open(path) as f:
        assert f.read() == copying_text(1_000)
    before = os.stat(path).st_mtime_ns
    write_copying_corpus(path, num_bytes=1_000)
    assert os.stat(path).st_mtime_ns == before  # the same text: not rewritten
    write_copying_corpus(path, num_bytes=1_000, seed=5)
    with open(path) as f:
        assert f.read() == copying_text(1_000, seed=5)


def test_bad_lengths_are_refused():
    with pytest.raises(ValueError, match="min_length <= max_length"):
        copying_text(100, min_length=10, max_length=5)
