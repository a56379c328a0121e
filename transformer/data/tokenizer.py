"""Tokenizers: text <-> token ids [N], by UTF-8 bytes (`ByteTokenizer`) or a byte-level BPE trained here
or any Hugging Face tokenizer.json (`BPETokenizer`). Saved as JSON, no pickle: tokenizer.json (BPE
only) and, last, tokenizer_kind.json; a folder holding only a tokenizer.json loads as BPE.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

from transformer.data.atomic_files import write_atomically

KIND_FILE = "tokenizer_kind.json"
HF_FILE = "tokenizer.json"
KINDS = ("bytes", "bpe")


class ByteTokenizer:
    """One token per UTF-8 byte: ids are the byte values 0..255."""

    vocab_size: int = 256
    fingerprint: str = "bytes"  # in cache keys: equal fingerprints encode alike

    def encode(self, text: str) -> list[int]:
        """Text -> ids [N], N = number of UTF-8 bytes of `text`."""
        return list(_utf8(text))

    def encode_array(self, text: str) -> np.ndarray:
        """`encode` as int32 [N], without a Python list in between (large documents)."""
        return np.frombuffer(_utf8(text), dtype=np.uint8).astype(np.int32)

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """Ids [N] -> text; a character cut in two (by sampling or slicing) becomes U+FFFD."""
        return _known_ids(ids, self).astype(np.uint8).tobytes().decode("utf-8", errors="replace")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab_size={self.vocab_size})"


class BPETokenizer:
    """A Hugging Face `tokenizers.Tokenizer`; `encode` adds no special tokens, `decode` keeps them."""

    def __init__(self, hf_tokenizer: tokenizers.Tokenizer):
        self.hf = hf_tokenizer
        self._unk_id = _unknown_token_id(hf_tokenizer)

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int) -> BPETokenizer:
        """A byte-level BPE of up to `vocab_size` tokens (256 bytes + merges) trained on `texts`."""
        if vocab_size < 256:
            raise ValueError(f"vocab_size={vocab_size} is too small for a byte-level BPE: its base alphabet alone "
                             "is the 256 byte values. Use vocab_size >= 256 (e.g. 4096), or the 'bytes' tokenizer.")
        tok = tokenizers.Tokenizer(models.BPE())
        # add_prefix_space=False keeps decode(encode(text)) == text exactly.
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        # All 256 bytes are in the vocabulary even if the texts lack some: nothing is unknown.
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                      special_tokens=[], show_progress=False)
        tok.train_from_iterator(texts, trainer)
        return cls(tok)

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> BPETokenizer:
        """Loads a Hugging Face `tokenizer.json` (any model type: BPE, WordPiece, Unigram, ...)."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"No tokenizer file at {path}. Pass the path of a Hugging Face tokenizer.json "
                                    "(written by save_tokenizer or shipped with a Hugging Face model).")
        try:
            return cls(tokenizers.Tokenizer.from_file(str(path)))
        except Exception as e:  # the Rust side raises a bare Exception on malformed JSON
            raise ValueError(f"{path} is not a valid Hugging Face tokenizer.json: {e}") from e

    @property
    def vocab_size(self) -> int:
        """Number of token ids, added / special tokens included."""
        return self.hf.get_vocab_size(with_added_tokens=True)

    @functools.cached_property
    def fingerprint(self) -> str:
        """SHA-256 of the tokenizer's JSON (in cache keys)."""
        return hashlib.sha256(self.hf.to_str().encode()).hexdigest()

    def encode(self, text: str) -> list[int]:
        """Text -> ids [N]; ValueError where the output holds the unknown token (imported tokenizers)."""
        try:
            encoding = self.hf.encode(text, add_special_tokens=False)
        except TypeError:  # HF raises "TextInputSequence must be str" for lone surrogates
            _utf8(text)  # raises the clear error
            raise
        if self._unk_id is not None and self._unk_id in encoding.ids:
            unknown = sorted({text[a:b] for i, (a, b) in zip(encoding.ids, encoding.offsets) if i == self._unk_id})
            raise ValueError(f"The tokenizer cannot represent {unknown[:10]!r} (encoded as its unknown token, id "
                             f"{self._unk_id}). Remove or replace these characters, or use a byte-level tokenizer "
                             "('bytes', or a BPE trained here), which encodes every string.")
        return encoding.ids

    def encode_array(self, text: str) -> np.ndarray:
        """`encode` as an int32 array [N]."""
        return np.asarray(self.encode(text), dtype=np.int32)

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """Ids [N] -> text (Hugging Face's decode would drop an unknown id without a word)."""
        return self.hf.decode(_known_ids(ids, self).tolist(), skip_special_tokens=False)

    __repr__ = ByteTokenizer.__repr__


Tokenizer = ByteTokenizer | BPETokenizer


def make_tokenizer(kind: str, texts: Iterable[str] = (), vocab_size: int | None = None) -> Tokenizer:
    """A tokenizer of `kind`: 'bytes', or 'bpe' trained on `texts` to exactly `vocab_size` (no unused ids)."""
    if kind == "bytes":
        return ByteTokenizer()
    if kind == "bpe":
        if vocab_size is None:
            raise ValueError("make_tokenizer('bpe', ...) needs vocab_size, e.g. vocab_size=4096.")
        tok = BPETokenizer.train(texts, vocab_size)
        if tok.vocab_size < vocab_size:
            n = tok.vocab_size
            raise ValueError(f"the corpus gives a BPE of only {n} tokens, not vocab_size={vocab_size} (it holds no "
                             f"more pairs to merge), so ids {n} to {vocab_size - 1} would never occur: set "
                             f"--config.data.vocab_size={n} --config.model.vocab_size={n}, or train on more text")
        return tok
    raise ValueError(f"Unknown tokenizer kind {kind!r}; choose one of {list(KINDS)}.")


def save_tokenizer(tok: Tokenizer, directory: str | os.PathLike) -> None:
    """Writes `tok` to `directory` (the files of the module docstring), atomically."""
    if not isinstance(tok, (ByteTokenizer, BPETokenizer)):
        raise TypeError(f"save_tokenizer got a {type(tok).__name__}; expected ByteTokenizer or BPETokenizer.")
    Path(directory).mkdir(parents=True, exist_ok=True)
    if isinstance(tok, BPETokenizer):
        write_atomically(Path(directory) / HF_FILE, tok.hf.to_str(pretty=True))
    write_atomically(Path(directory) / KIND_FILE, json.dumps({"kind": tokenizer_to_json(tok)["kind"]}) + "\n")


def is_saved(directory: str | os.PathLike) -> bool:
    """Whether `save_tokenizer` finished writing `directory`."""
    return (Path(directory) / KIND_FILE).is_file()


def load_tokenizer(directory: str | os.PathLike) -> Tokenizer:
    """Reads a tokenizer written by `save_tokenizer`, or a folder holding an HF tokenizer.json."""
    kind_file, hf_file = Path(directory) / KIND_FILE, Path(directory) / HF_FILE
    if not kind_file.is_file() and not hf_file.is_file():
        raise FileNotFoundError(f"{directory} is no folder holding {KIND_FILE} or {HF_FILE}. Pass the folder that "
                                "save_tokenizer wrote, or the folder of a Hugging Face model's tokenizer.json.")
    # Without a kind file: a Hugging Face model's folder.
    kind = json.loads(kind_file.read_text()).get("kind") if kind_file.is_file() else "bpe"
    if kind not in KINDS:
        raise ValueError(f"{kind_file} names kind {kind!r}; expected one of {list(KINDS)}.")
    return ByteTokenizer() if kind == "bytes" else BPETokenizer.from_file(hf_file)


def tokenizer_to_json(tok: Tokenizer | None) -> dict:
    """The tokenizer as a JSON-able dict (in each checkpoint); None: a run without text."""
    return {"kind": "none"} if tok is None else {"kind": "bytes"} if isinstance(tok, ByteTokenizer) else {
        "kind": "bpe", "tokenizer_json": tok.hf.to_str()}


def tokenizer_from_json(obj: dict) -> Tokenizer | None:
    kind = obj.get("kind")
    if kind not in ("none", *KINDS):
        raise ValueError(f"unknown tokenizer record {str(obj)[:100]!r}; expected kind 'bytes' or 'bpe'")
    if kind == "none":
        return None
    return ByteTokenizer() if kind == "bytes" else BPETokenizer(tokenizers.Tokenizer.from_str(obj["tokenizer_json"]))


def _utf8(text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"Cannot encode the text: {e.object[e.start:e.end]!r} at position {e.start} is a lone "
                         "UTF-16 surrogate, which has no UTF-8 form. Read files with encoding='utf-8' (not "
                         "errors='surrogateescape') or replace these characters.") from None


def _known_ids(ids: Sequence[int] | np.ndarray, tok: Tokenizer) -> np.ndarray:
    """Ids [N] as int64, checked to be 0 <= id < tok.vocab_size (ValueError naming the others)."""
    ids = np.asarray(ids, dtype=np.int64)
    foreign = ids[(ids < 0) | (ids >= tok.vocab_size)]
    if foreign.size:
        shown = sorted(set(foreign.tolist()))
        raise ValueError(f"{type(tok).__name__}.decode got ids {shown[:8]}{' ...' if len(shown) > 8 else ''} "
                         f"outside [0, {tok.vocab_size - 1}]: this tokenizer has no such tokens (a wrong tokenizer "
                         "for this model, or a model vocab_size larger than the tokenizer's)")
    return ids


def _unknown_token_id(tok: tokenizers.Tokenizer) -> int | None:
    """The id the model emits for text it cannot represent, or None (e.g. byte-level BPE)."""
    model = json.loads(tok.to_str())["model"]
    if model.get("unk_id") is not None:  # Unigram stores an id
        return int(model["unk_id"])
    if model.get("unk_token") is not None:  # BPE, WordPiece, WordLevel store the token
        return tok.token_to_id(model["unk_token"])
    return None
