"""Tests for transformer/data/corpus.py: the bundled plays, Markdown to play text, which files a corpus reads."""

import pytest

from transformer.data.corpus import corpus_files, load_texts, markdown_to_play, shakespeare_plays, skipped_files


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
