"""Tests for transformer/data.py: the bundled corpus, text loading, the token cache, batches."""

import time

import numpy as np
import pytest

from transformer.data import (
    Prefetcher,
    batch_at,
    corpus_files,
    eval_batches,
    load_corpus,
    load_texts,
    markdown_to_play,
    shakespeare_plays,
    skipped_files,
)
from transformer.tokenizer import BPETokenizer, ByteTokenizer


@pytest.fixture(scope="module")
def plays() -> dict[str, str]:
    return shakespeare_plays()


def test_bundled_corpus_has_38_plays(plays):
    assert len(plays) == 38
    assert "tragedies/hamlet" in plays and "comedies/twelfth-night" in plays
    markdown_bytes = sum(f.stat().st_size for f in corpus_files(None))
    assert 5.0e6 < markdown_bytes < 5.6e6
    plain_bytes = sum(len(text.encode("utf-8")) for text in plays.values())
    assert 4.5e6 < plain_bytes < markdown_bytes  # the Markdown marks are gone


def test_markdown_to_play_on_a_snippet():
    md = (
        "# Hamlet\n"
        "\n"
        "## ACT I\n"
        "\n"
        "### SCENE I. Elsinore. A platform before the castle.\n"
        "\n"
        "_FRANCISCO at his post. Enter to him BERNARDO_\n"
        "\n"
        "**BERNARDO**  \n"
        "Who's there?\n"
        "\n"
        "\n"
        "**FIRST CITIZEN**  \n"
        "For this relief much thanks: 'tis bitter cold,  \n"
        "_\\[Aside]_ And I am *sick* at heart.\\--\n"
        "\n"
        "*Exit.*\n"
    )
    assert markdown_to_play(md) == (
        "Hamlet\n"
        "\n"
        "ACT I\n"
        "\n"
        "SCENE I. Elsinore. A platform before the castle.\n"
        "\n"
        "FRANCISCO at his post. Enter to him BERNARDO\n"
        "\n"
        "BERNARDO:\n"
        "Who's there?\n"
        "\n"
        "FIRST CITIZEN:\n"
        "For this relief much thanks: 'tis bitter cold,\n"
        "[Aside] And I am sick at heart.--\n"
        "\n"
        "Exit.\n"
    )


def test_real_plays_have_no_markdown_left(plays):
    for name, text in plays.items():
        for mark in ("**", "#", "_", "\\", "  \n"):
            assert mark not in text, f"{mark!r} left in {name}"
    assert plays["tragedies/hamlet"].startswith("Hamlet\n\nACT I\n\n")
    assert "\nBERNARDO:\nWho's there?\n\nFRANCISCO:\n" in plays["tragedies/hamlet"]


def test_load_texts_default_is_the_plays_in_name_order(plays):
    assert load_texts(None) == [plays[name] for name in sorted(plays)]


def test_load_texts_file_folder_and_glob(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "b.txt").write_text("bee")
    (tmp_path / "a.md").write_text("# ay")  # user Markdown is read as is
    (tmp_path / "sub" / "c.txt").write_text("sea")
    (tmp_path / "skip.bin").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    assert load_texts(tmp_path / "b.txt") == ["bee"]
    assert load_texts(tmp_path) == ["# ay", "bee", "sea"]
    assert load_texts(str(tmp_path / "**" / "*.txt")) == ["bee", "sea"]
    with pytest.raises(FileNotFoundError, match="nothing-here"):
        load_texts(tmp_path / "nothing-here")
    with pytest.raises(FileNotFoundError, match=r"\*\.rst"):
        load_texts(str(tmp_path / "*.rst"))


def test_a_folder_contributes_every_utf8_text_file_whatever_its_name(tmp_path):
    files = {
        "train.py": "print('hi')\n",
        "notes.txt": "notes",
        "Makefile": "all:\n\techo ok\n",  # no suffix
        "pkg/__init__.py": "",  # an empty file is text
        "pkg/mod.py": "x = 'é🎭'\n",
        "long.c": "a" * 8191 + "é",  # é straddles the first read's end
        "image.png": b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR",  # NUL bytes: binary
        "latin1.txt": "café".encode("latin-1"),  # not UTF-8
        "late_latin1.txt": b"a" * 20_000 + "café".encode("latin-1"),  # not UTF-8 past the first KB
        ".env": "SECRET=1",  # hidden
        ".git/HEAD": "ref: refs/heads/main\n",  # in a hidden folder
        "pkg/__pycache__/mod.cpython-311.pyc": "looks like text",
    }
    for name, content in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        write = (tmp_path / name).write_bytes if isinstance(content, bytes) else (tmp_path / name).write_text
        write(content)
    text = ["Makefile", "long.c", "notes.txt", "pkg/__init__.py", "pkg/mod.py", "train.py"]
    assert corpus_files(tmp_path) == [tmp_path / n for n in text]
    assert load_texts(tmp_path) == [files[n] for n in text]
    assert skipped_files(tmp_path) == [tmp_path / n for n in ("image.png", "late_latin1.txt", "latin1.txt")]
    assert skipped_files(tmp_path / "notes.txt") == skipped_files(None) == []


def test_a_folder_without_text_is_an_error_naming_it(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"No text file in the folder '.*empty'.*decodes as UTF-8"):
        corpus_files(tmp_path / "empty")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "blob.dat").write_bytes(bytes(range(256)))
    (tmp_path / "bin" / ".hidden.txt").write_text("hidden text does not count")
    with pytest.raises(FileNotFoundError, match=r"'.*bin' \(1 skipped as binary or not UTF-8, e.g. .*blob\.dat\)"):
        load_texts(tmp_path / "bin")


def test_a_single_file_that_is_not_utf8_is_an_error_naming_it(tmp_path):
    (tmp_path / "latin1.txt").write_bytes("café".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1\.txt is not UTF-8 text"):
        load_texts(tmp_path / "latin1.txt")


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
    train, val, bytes_per_token = load_corpus(small_corpus, tok, tmp_path / "c", val_fraction=0.1)
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
    train, val, bytes_per_token = load_corpus(None, ByteTokenizer(), tmp_path, val_fraction=0.05)
    assert len(train) + len(val) == len("\n\n".join(load_texts(None)).encode("utf-8"))
    # The validation tokens are the end of the last play.
    assert ByteTokenizer().decode(val[-20:]) == plays[sorted(plays)[-1]][-20:]
    assert bytes_per_token == 1.0


def test_bpe_corpus_has_more_than_one_byte_per_token(tmp_path, small_corpus):
    tok = BPETokenizer.train(load_texts(small_corpus), vocab_size=400)
    train, val, bytes_per_token = load_corpus(small_corpus, tok, tmp_path / "cache", 0.2)
    assert bytes_per_token == len(tok.decode(val).encode("utf-8")) / len(val)
    assert 1.5 < bytes_per_token < 5
    again = load_corpus(small_corpus, tok, tmp_path / "cache", 0.2)  # read back from the record
    assert again.bytes_per_token == bytes_per_token
    assert tok.decode(np.concatenate([train, val])) == "\n\n".join(load_texts(small_corpus))


def test_load_corpus_rejects_bad_val_fraction(tmp_path, small_corpus):
    with pytest.raises(ValueError, match="val_fraction"):
        load_corpus(small_corpus, ByteTokenizer(), tmp_path, val_fraction=1.0)


TOKENS = np.arange(1000, dtype=np.uint16)  # token i at position i: windows show their start


def test_batch_at_is_a_function_of_seed_and_step():
    kwargs = dict(batch_size=8, seq_len=16)
    x, y = batch_at(TOKENS, seed=0, step=5, **kwargs)
    assert x.shape == y.shape == (8, 16) and x.dtype == y.dtype == np.int32
    np.testing.assert_array_equal(x[:, 1:], y[:, :-1])  # targets are the inputs shifted by one
    np.testing.assert_array_equal(y, x + 1)
    np.testing.assert_array_equal(x, batch_at(TOKENS, seed=0, step=5, **kwargs)[0])
    assert not np.array_equal(x, batch_at(TOKENS, seed=0, step=6, **kwargs)[0])
    assert not np.array_equal(x, batch_at(TOKENS, seed=1, step=5, **kwargs)[0])


def test_batch_at_reaches_both_ends():
    tokens = np.arange(20, dtype=np.uint16)
    starts = {int(batch_at(tokens, seed=0, step=s, batch_size=4, seq_len=16)[0][i, 0])
              for s in range(50) for i in range(4)}
    assert starts == {0, 1, 2, 3}  # last start 3: window 3..19 ends at the last token


def test_host_slices_concatenate_to_the_global_batch():
    kwargs = dict(seed=3, step=7, batch_size=8, seq_len=16)
    whole = batch_at(TOKENS, **kwargs)
    parts = [batch_at(TOKENS, **kwargs, host_index=h, host_count=2) for h in range(2)]
    assert parts[0][0].shape == (4, 16)
    for i in range(2):
        np.testing.assert_array_equal(np.concatenate([p[i] for p in parts]), whole[i])


def test_batch_errors_name_the_numbers():
    with pytest.raises(ValueError, match="batch_size=6 is not divisible by host_count=4"):
        batch_at(TOKENS, seed=0, step=0, batch_size=6, seq_len=8, host_index=0, host_count=4)
    with pytest.raises(ValueError, match="10 tokens, fewer than seq_len \\+ 1 = 17"):
        batch_at(TOKENS[:10], seed=0, step=0, batch_size=2, seq_len=16)


def test_eval_batches_are_fixed_and_spread_over_the_tokens():
    batches = eval_batches(TOKENS, num_batches=3, batch_size=4, seq_len=16)
    assert len(batches) == 3
    again = eval_batches(TOKENS, num_batches=3, batch_size=4, seq_len=16)
    for (x, y), (x2, y2) in zip(batches, again):
        assert x.shape == (4, 16)
        np.testing.assert_array_equal(x, x2)
        np.testing.assert_array_equal(y, x + 1)
    starts = np.concatenate([x[:, 0] for x, _ in batches])
    assert starts[0] == 0 and starts[-1] == len(TOKENS) - 17  # first and last possible windows
    assert np.all(np.abs(np.diff(starts) - np.diff(starts).mean()) <= 1)  # evenly spaced
    halves = [eval_batches(TOKENS, num_batches=3, batch_size=4, seq_len=16, host_index=h,
                           host_count=2) for h in range(2)]
    for b in range(3):
        joined = np.concatenate([halves[0][b][0], halves[1][b][0]])
        np.testing.assert_array_equal(joined, batches[b][0])


def test_prefetcher_yields_in_order_from_start_step():
    with Prefetcher(lambda step: step * 10, start_step=3, depth=2) as batches:
        assert [next(batches) for _ in range(5)] == [30, 40, 50, 60, 70]
    assert not batches._thread.is_alive()
    assert batches._thread.daemon


def test_prefetcher_propagates_exceptions():
    def fn(step):
        if step == 2:
            raise KeyError("bad step")
        return step

    batches = Prefetcher(fn, start_step=0)
    assert next(batches) == 0 and next(batches) == 1
    with pytest.raises(KeyError, match="bad step"):
        next(batches)
    with pytest.raises(KeyError):  # stays failed
        next(batches)
    batches.close()


def test_prefetcher_closes_while_producer_is_blocked():
    batches = Prefetcher(lambda step: step, start_step=0, depth=1)
    time.sleep(0.05)  # the queue fills and the thread waits for room
    batches.close()
    assert not batches._thread.is_alive()
    with pytest.raises(StopIteration):
        next(batches)
