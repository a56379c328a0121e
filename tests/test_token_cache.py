"""Tests for transformer/data/corpus.py's token stream: the token stream, its cache on disk, the validation split."""

import time

import numpy as np
import pytest

from transformer.data.corpus import load_texts, shakespeare_plays
from transformer.data.corpus import load_corpus
from transformer.data.tokenizer import BPETokenizer, ByteTokenizer


@pytest.fixture(scope="module")
def plays() -> dict[str, str]:
    return shakespeare_plays()


def test_token_cache_key_follows_the_folder_s_text_files(tmp_path):
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "a.py").write_text("alpha " * 50)
    (folder / "b.bin").write_bytes(b"\x00" * 100)
    first = load_corpus(folder, ByteTokenizer(), tmp_path / "cache", 0.1)
    (folder / "b.bin").write_text("beta " * 50)  # now text: joins the corpus, new key
    second = load_corpus(folder, ByteTokenizer(), tmp_path / "cache", 0.1)
    assert len(list((tmp_path / "cache").glob("*.npy"))) == 2
    assert len(second.train) + len(second.val) == len(first.train) + len(first.val) + len("\n\n") + 250


@pytest.fixture
def small_corpus(tmp_path, plays):
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "1.txt").write_text(plays["tragedies/hamlet"][:30_000])
    (folder / "2.txt").write_text(plays["tragedies/macbeth"][:30_000] + " ¿é? 🎭")
    return folder


def test_corpus_is_the_joined_documents_split_at_the_tail(tmp_path, small_corpus):
    tok = ByteTokenizer()
    train, val, bytes_per_token = load_corpus(small_corpus, tok, tmp_path / "c", val_fraction=0.1)[:3]
    stream = "\n\n".join(load_texts(small_corpus)).encode("utf-8")
    assert train.dtype == np.uint16
    assert len(val) == int(len(stream) * 0.1)
    assert np.concatenate([train, val]).astype(np.uint8).tobytes() == stream
    assert bytes_per_token == 1.0


def test_token_cache_is_reused_and_memory_mapped(tmp_path, small_corpus, monkeypatch):
    tok, cache = ByteTokenizer(), tmp_path / "cache"
    first = load_corpus(small_corpus, tok, cache, 0.1)
    (cache_file,) = cache.glob("*.npy")
    assert list(cache.glob(".*")) == []  # no temporary files left behind

    def fail(text):
        raise AssertionError("re-tokenized although a cache exists")

    monkeypatch.setattr(tok, "encode", fail)
    second = load_corpus(small_corpus, tok, cache, 0.1)
    assert isinstance(second.train, np.memmap) and isinstance(second.val, np.memmap)
    np.testing.assert_array_equal(first.train, second.train)
    np.testing.assert_array_equal(first.val, second.val)
    monkeypatch.undo()

    # Editing a file changes the key: a second cache file appears.
    time.sleep(0.01)
    with open(small_corpus / "1.txt", "a") as f:
        f.write("More.")
    third = load_corpus(small_corpus, tok, cache, 0.1)
    assert len(list(cache.glob("*.npy"))) == 2
    assert len(third.train) + len(third.val) == len(first.train) + len(first.val) + 5


def test_bundled_corpus_tokenizes_with_bytes(tmp_path, plays):
    train, val, bytes_per_token = load_corpus(None, ByteTokenizer(), tmp_path, val_fraction=0.05)[:3]
    assert len(train) + len(val) == len("\n\n".join(load_texts(None)).encode("utf-8"))
    # The validation tokens are the end of the last play.
    assert ByteTokenizer().decode(val[-20:]) == plays[sorted(plays)[-1]][-20:]
    assert bytes_per_token == 1.0


def test_bpe_corpus_has_more_than_one_byte_per_token(tmp_path, small_corpus):
    tok = BPETokenizer.train(load_texts(small_corpus), vocab_size=400)
    train, val, bytes_per_token = load_corpus(small_corpus, tok, tmp_path / "cache", 0.2)[:3]
    assert bytes_per_token == len(tok.decode(val).encode("utf-8")) / len(val)
    assert 1.5 < bytes_per_token < 5
    again = load_corpus(small_corpus, tok, tmp_path / "cache", 0.2)  # read back from the record
    assert again.bytes_per_token == bytes_per_token
    assert tok.decode(np.concatenate([train, val])) == "\n\n".join(load_texts(small_corpus))


def test_load_corpus_rejects_bad_val_fraction(tmp_path, small_corpus):
    with pytest.raises(ValueError, match="val_fraction"):
        load_corpus(small_corpus, ByteTokenizer(), tmp_path, val_fraction=1.0)
