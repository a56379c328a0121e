"""Data that cannot go stale: the token cache is keyed by the corpus files' contents, so a rewrite
that keeps the size and restores the modification time (`touch -r`, `cp -p`, `rsync -t`, tar) is
noticed; and a run resumed on a changed corpus is refused, naming what changed."""

from __future__ import annotations

import os

import numpy as np
import pytest

from tests.helpers.runs import quiet_train, tiny_config
from transformer.data.corpus import file_digests, load_corpus
from transformer.data.tokenizer import ByteTokenizer
from transformer.run.checkpoint import CheckpointError

TEXT = "To be, or not to be, that is the question. " * 40


def rewrite_keeping_size_and_mtime(path, text):
    """New bytes of the same length, the modification time set back as `touch -r` would."""
    st = os.stat(path)
    assert len(text.encode()) == st.st_size
    with open(path, "w") as f:
        f.write(text)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_the_token_cache_notices_a_rewrite_with_the_same_size_and_mtime(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT)
    first = load_corpus(str(corpus), ByteTokenizer(), tmp_path / "cache")
    rewrite_keeping_size_and_mtime(corpus, TEXT.upper())
    second = load_corpus(str(corpus), ByteTokenizer(), tmp_path / "cache")
    assert bytes(np.asarray(second.train[:6], np.uint8)) == b"TO BE,"
    assert bytes(np.asarray(first.train[:6], np.uint8)) == b"To be,"
    assert len(list((tmp_path / "cache").glob("*.npy"))) == 2  # a second stream, the first one kept


def test_an_untouched_file_is_not_read_again(tmp_path, monkeypatch):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT)
    first = file_digests([corpus], tmp_path / "cache")
    monkeypatch.setattr("hashlib.file_digest", lambda *a: pytest.fail("an untouched file was hashed again"))
    assert file_digests([corpus], tmp_path / "cache") == first


@pytest.mark.slow
def test_a_resume_on_a_changed_corpus_is_refused_naming_the_change(tmp_path):
    folder = tmp_path / "texts"
    folder.mkdir()
    for name in ("a.txt", "b.txt", "c.txt"):
        (folder / name).write_text(TEXT)
    config = tiny_config(tmp_path, steps=2)
    config.data.path = str(folder)
    quiet_train(config, tmp_path / "run")
    (folder / "b.txt").unlink()
    rewrite_keeping_size_and_mtime(folder / "c.txt", TEXT.upper())
    config.train.steps = 4
    with pytest.raises(CheckpointError, match=rf"the corpus changed .*\(removed {folder / 'b.txt'}; changed "
                                              rf"{folder / 'c.txt'}\)"):
        quiet_train(config, tmp_path / "run")
    (folder / "b.txt").write_text(TEXT)  # restored, content and all: the run resumes
    (folder / "c.txt").write_text(TEXT)
    assert quiet_train(config, tmp_path / "run")["step"] == 4
