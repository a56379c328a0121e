"""Tests for transformer/data/tokenizer.py: round trips, training, saving and loading, errors."""

import json

import numpy as np
import pytest
import tokenizers
from hypothesis import given, settings
from hypothesis import strategies as st

from transformer.data.corpus import shakespeare_plays
from transformer.data.tokenizer import (
    BPETokenizer,
    ByteTokenizer,
    load_tokenizer,
    make_tokenizer,
    save_tokenizer,
)

VOCAB_SIZE = 512


@pytest.fixture(scope="module")
def bpe() -> BPETokenizer:
    """A small BPE trained on the first 200 KB of Hamlet (well under a second)."""
    return BPETokenizer.train([shakespeare_plays()["tragedies/hamlet"][:200_000]], VOCAB_SIZE)


def test_bytes_round_trip_with_non_ascii():
    tok = ByteTokenizer()
    text = "Who's there? — héllo, 世界 🎭\n\tend"
    ids = tok.encode(text)
    assert ids == list(text.encode("utf-8"))
    assert tok.decode(ids) == text
    assert tok.vocab_size == 256


def test_bytes_decode_replaces_cut_characters_and_rejects_foreign_ids():
    tok = ByteTokenizer()
    assert tok.decode(tok.encode("é")[:1]) == "\ufffd"
    with pytest.raises(ValueError, match="outside"):
        tok.decode([300])


@settings(max_examples=60, deadline=None)
@given(text=st.text(max_size=200))
def test_bpe_round_trips_any_text(bpe, text):
    ids = bpe.encode(text)
    assert all(0 <= i < bpe.vocab_size for i in ids)
    assert bpe.decode(ids) == text


@settings(max_examples=30, deadline=None)
@given(text=st.text(max_size=100))
def test_bytes_round_trips_any_text(text):
    tok = ByteTokenizer()
    assert tok.decode(tok.encode(text)) == text


def test_bpe_reaches_vocab_size_and_compresses(bpe):
    assert bpe.vocab_size == VOCAB_SIZE
    text = shakespeare_plays()["tragedies/macbeth"][:20_000]  # not seen in training
    assert len(bpe.encode(text)) < 0.6 * len(text.encode("utf-8"))


def test_lone_surrogate_is_a_clear_value_error(bpe):
    for tok in (ByteTokenizer(), bpe):
        with pytest.raises(ValueError, match="surrogate"):
            tok.encode("a\ud800b")


@pytest.mark.parametrize("kind", ["bytes", "bpe"])
def test_save_load_round_trip(tmp_path, bpe, kind):
    tok = bpe if kind == "bpe" else ByteTokenizer()
    save_tokenizer(tok, tmp_path / "tok")
    assert json.loads((tmp_path / "tok" / "tokenizer_kind.json").read_text()) == {"kind": kind}
    loaded = load_tokenizer(tmp_path / "tok")
    assert type(loaded) is type(tok)
    assert loaded.vocab_size == tok.vocab_size
    assert loaded.fingerprint == tok.fingerprint  # so the token cache is reused after a reload
    text = "To be, or not to be: that is the question. ¿Qué? 🎭"
    np.testing.assert_array_equal(loaded.encode(text), tok.encode(text))
    assert list((tmp_path / "tok").glob(".*tmp")) == []  # no temporary files left behind


def test_bare_hugging_face_tokenizer_json_loads_as_bpe(tmp_path, bpe):
    bpe.hf.save(str(tmp_path / "tokenizer.json"))  # as shipped with a Hugging Face model
    loaded = load_tokenizer(tmp_path)
    assert isinstance(loaded, BPETokenizer)
    np.testing.assert_array_equal(loaded.encode("Hamlet"), bpe.encode("Hamlet"))


def test_load_missing_directory_or_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        load_tokenizer(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="tokenizer_kind.json"):
        load_tokenizer(tmp_path)  # exists, but empty
    with pytest.raises(FileNotFoundError, match="missing.json"):
        BPETokenizer.from_file(tmp_path / "missing.json")


def test_make_tokenizer():
    assert isinstance(make_tokenizer("bytes"), ByteTokenizer)
    tok = make_tokenizer("bpe", ["abc abd abe " * 200], vocab_size=260)
    assert isinstance(tok, BPETokenizer) and tok.vocab_size == 260
    with pytest.raises(ValueError, match=r"\['bytes', 'bpe'\]"):
        make_tokenizer("sentencepiece", [], 100)
    with pytest.raises(ValueError, match="vocab_size"):
        make_tokenizer("bpe", ["abc"], vocab_size=100)


def test_a_bpe_larger_than_its_texts_give_is_refused_naming_the_size():
    """#31: a 12-word corpus gives ~300 tokens; a 4096-token BPE of it left the ids above unused."""
    texts = ["one two three four five six seven eight nine ten eleven twelve\n"]
    reached = BPETokenizer.train(texts, 4096).vocab_size  # training stops when no pair is left to merge
    assert 256 < reached < 4096
    with pytest.raises(ValueError, match=rf"only {reached} tokens, not vocab_size=4096.*"
                                         rf"--config.data.vocab_size={reached} --config.model.vocab_size={reached}"):
        make_tokenizer("bpe", texts, vocab_size=4096)
    assert make_tokenizer("bpe", texts, vocab_size=reached).vocab_size == reached


@pytest.mark.parametrize("kind", ["bytes", "bpe"])
def test_decode_refuses_ids_the_tokenizer_does_not_have(bpe, kind):
    """A model head larger than its tokenizer can draw such ids: they are named, not dropped."""
    tok = bpe if kind == "bpe" else ByteTokenizer()
    n = tok.vocab_size
    assert tok.decode(tok.encode("ab")) == "ab"
    for ids in ([97, n], [n + 7], [-1, 98]):
        with pytest.raises(ValueError, match=rf"decode got ids .* outside \[0, {n - 1}\]"):
            tok.decode(ids)
    with pytest.raises(ValueError, match=str(n)):
        tok.decode(np.array([97, n]))


@pytest.mark.parametrize("kind", ["bytes", "bpe"])
def test_encode_returns_a_list_of_ints_and_encode_array_the_same_as_int32(bpe, kind):
    """#31: encode gave a NumPy array, so ids + ids added elementwise; Hugging Face users expect a list."""
    tok = bpe if kind == "bpe" else ByteTokenizer()
    ids = tok.encode("To be, or not")
    assert type(ids) is list and all(type(i) is int for i in ids)
    assert len(ids + ids) == 2 * len(ids)  # concatenated, not added elementwise
    array = tok.encode_array("To be, or not")
    assert array.dtype == np.int32 and array.tolist() == ids


def test_unknown_token_raises_naming_the_characters():
    """A non-byte-level tokenizer (as in some Hugging Face models) has an unknown token."""
    vocab = {"to": 0, "be": 1, "[UNK]": 2}
    hf = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    hf.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok = BPETokenizer(hf)
    assert tok.encode("to be") == [0, 1]
    with pytest.raises(ValueError, match="'or'"):
        tok.encode("to be or")
