"""Tokenizers: raw UTF-8 bytes, or byte-level BPE trained here or imported from Hugging Face.

A tokenizer turns text into token ids [N], a Python list[int] (`encode`, as Hugging Face's
tokenizers return them; `encode_array` gives them as an int32 array for bulk use), and back
(`decode`, which refuses ids the tokenizer does not have rather than drop them). Two kinds:

- `ByteTokenizer`: one token per UTF-8 byte, vocabulary 256, nothing to train. Every string encodes
  and loss per token is loss per byte.
- `BPETokenizer`: a Hugging Face `tokenizers.Tokenizer`. `BPETokenizer.train` builds a byte-level
  BPE (GPT-2 style: bytes are the base alphabet, so every string encodes and nothing is unknown);
  `BPETokenizer.from_file` loads any Hugging Face `tokenizer.json`, e.g. that of an imported model.

Both are saved as JSON only (never pickle) by `save_tokenizer` and read back by `load_tokenizer`:

    directory/tokenizer_kind.json   {"kind": "bytes"} or {"kind": "bpe"}
    directory/tokenizer.json        the Hugging Face tokenizer (BPE only)

A directory holding only a Hugging Face `tokenizer.json` (a downloaded model) loads as BPE.
"""

from __future__ import annotations

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
    # Names the tokenizer in cache keys: two tokenizers with equal fingerprints encode alike.
    fingerprint: str = "bytes"

    def encode(self, text: str) -> list[int]:
        """Text -> ids [N], N = number of UTF-8 bytes of `text`."""
        return list(_utf8(text))

    def encode_array(self, text: str) -> np.ndarray:
        """`encode` as an int32 array [N], without a Python list in between (large documents)."""
        return np.frombuffer(_utf8(text), dtype=np.uint8).astype(np.int32)

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """Ids [N] -> text. Byte sequences that are not valid UTF-8 (a character cut in two by
        sampling or slicing) become U+FFFD instead of raising; an id outside [0, 255] raises."""
        ids = _known_ids(ids, self)
        return ids.astype(np.uint8).tobytes().decode("utf-8", errors="replace")

    def __repr__(self) -> str:
        return "ByteTokenizer(vocab_size=256)"


class BPETokenizer:
    """A Hugging Face `tokenizers.Tokenizer` behind the same encode/decode interface.

    `encode` adds no special tokens (no BOS/EOS from the tokenizer's post-processor): the corpus is
    one token stream, and callers that want a BOS add it themselves. `decode` keeps special tokens,
    so what the model produced is what you read.
    """

    def __init__(self, hf_tokenizer: tokenizers.Tokenizer):
        self.hf = hf_tokenizer
        self._unk_id = _unknown_token_id(hf_tokenizer)
        self._fingerprint: str | None = None

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int) -> BPETokenizer:
        """Trains a byte-level BPE of `vocab_size` tokens (256 bytes + merges) on `texts`, locally.

        Training stops early, with fewer tokens, only when the texts hold no more pairs to merge
        (`make_tokenizer` refuses such a tokenizer).
        """
        if vocab_size < 256:
            raise ValueError(
                f"vocab_size={vocab_size} is too small for a byte-level BPE: its base alphabet "
                "alone is the 256 byte values. Use vocab_size >= 256 (e.g. 4096), or the 'bytes' "
                "tokenizer."
            )
        tok = tokenizers.Tokenizer(models.BPE())
        # add_prefix_space=False keeps decode(encode(text)) == text exactly.
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            # All 256 bytes are in the vocabulary even if the texts lack some: nothing is unknown.
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            special_tokens=[],
            show_progress=False,
        )
        tok.train_from_iterator(texts, trainer)
        return cls(tok)

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> BPETokenizer:
        """Loads a Hugging Face `tokenizer.json` (any model type: BPE, WordPiece, Unigram, ...)."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(
                f"No tokenizer file at {path}. Pass the path of a Hugging Face tokenizer.json "
                "(written by save_tokenizer or shipped with a Hugging Face model)."
            )
        try:
            return cls(tokenizers.Tokenizer.from_file(str(path)))
        except Exception as e:  # the Rust side raises a bare Exception on malformed JSON
            raise ValueError(f"{path} is not a valid Hugging Face tokenizer.json: {e}") from e

    @property
    def vocab_size(self) -> int:
        """Number of token ids, added/special tokens included: every id is < vocab_size."""
        return self.hf.get_vocab_size(with_added_tokens=True)

    @property
    def fingerprint(self) -> str:
        """SHA-256 of the tokenizer's JSON: equal fingerprints encode alike (used in cache keys)."""
        if self._fingerprint is None:
            self._fingerprint = hashlib.sha256(self.hf.to_str().encode()).hexdigest()
        return self._fingerprint

    def encode(self, text: str) -> list[int]:
        """Text -> ids [N].

        Raises ValueError if the tokenizer cannot represent part of the text, i.e. the output holds
        its unknown token (possible with imported non-byte-level tokenizers only). Characters that
        such a tokenizer silently drops or normalises (lowercasing, NFKC) are not detected.
        """
        try:
            encoding = self.hf.encode(text, add_special_tokens=False)
        except TypeError:  # HF raises "TextInputSequence must be str" for lone surrogates
            _utf8(text)  # raises the clear error
            raise
        ids = encoding.ids
        if self._unk_id is not None and self._unk_id in ids:
            unknown = sorted({text[a:b] for i, (a, b) in zip(encoding.ids, encoding.offsets)
                              if i == self._unk_id})
            raise ValueError(
                f"The tokenizer cannot represent {unknown[:10]!r} (encoded as its unknown token, "
                f"id {self._unk_id}). Remove or replace these characters, or use a byte-level "
                "tokenizer ('bytes', or a BPE trained here), which encodes every string."
            )
        return ids

    def encode_array(self, text: str) -> np.ndarray:
        """`encode` as an int32 array [N]."""
        return np.asarray(self.encode(text), dtype=np.int32)

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """Ids [N] -> text, special tokens kept; an id outside [0, vocab_size) raises (Hugging Face's
        decode would drop it without a word)."""
        return self.hf.decode(_known_ids(ids, self).tolist(), skip_special_tokens=False)

    def __repr__(self) -> str:
        return f"BPETokenizer(vocab_size={self.vocab_size})"


Tokenizer = ByteTokenizer | BPETokenizer


def make_tokenizer(
    kind: str, texts: Iterable[str] = (), vocab_size: int | None = None
) -> Tokenizer:
    """Builds a tokenizer of `kind` ('bytes' or 'bpe'); 'bpe' trains on `texts` to `vocab_size`.

    `texts` and `vocab_size` are ignored for 'bytes' (its vocabulary is always 256). A BPE that
    stops short of `vocab_size` (the texts hold no more pairs to merge) raises ValueError naming the
    size the texts give: a model sized for `vocab_size` would hold ids no text encodes to.
    """
    if kind == "bytes":
        return ByteTokenizer()
    if kind == "bpe":
        if vocab_size is None:
            raise ValueError("make_tokenizer('bpe', ...) needs vocab_size, e.g. vocab_size=4096.")
        tok = BPETokenizer.train(texts, vocab_size)
        if tok.vocab_size < vocab_size:
            n = tok.vocab_size
            raise ValueError(
                f"the corpus gives a BPE of only {n} tokens, not vocab_size={vocab_size} (it holds no more "
                f"pairs to merge), so ids {n} to {vocab_size - 1} would never occur: set "
                f"--config.data.vocab_size={n} --config.model.vocab_size={n}, or train on more text"
            )
        return tok
    raise ValueError(f"Unknown tokenizer kind {kind!r}; choose one of {list(KINDS)}.")


def save_tokenizer(tok: Tokenizer, directory: str | os.PathLike) -> None:
    """Writes `tok` to `directory` as JSON (see the module docstring for the files), atomically."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if isinstance(tok, ByteTokenizer):
        kind = "bytes"
    elif isinstance(tok, BPETokenizer):
        kind = "bpe"
        write_atomically(directory / HF_FILE, tok.hf.to_str(pretty=True))
    else:
        raise TypeError(
            f"save_tokenizer got a {type(tok).__name__}; expected ByteTokenizer or BPETokenizer."
        )
    # The kind file goes last: a directory with a kind file is complete.
    write_atomically(directory / KIND_FILE, json.dumps({"kind": kind}) + "\n")


def is_saved(directory: str | os.PathLike) -> bool:
    """Whether `save_tokenizer` finished writing `directory` (its kind file, written last, is there)."""
    return (Path(directory) / KIND_FILE).is_file()


def load_tokenizer(directory: str | os.PathLike) -> Tokenizer:
    """Reads a tokenizer written by `save_tokenizer`, or a folder holding an HF tokenizer.json."""
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(
            f"No tokenizer directory at {directory}. Pass the directory that save_tokenizer wrote "
            f"(it holds {KIND_FILE}) or one holding a Hugging Face {HF_FILE}."
        )
    kind_file, hf_file = directory / KIND_FILE, directory / HF_FILE
    if kind_file.is_file():
        kind = json.loads(kind_file.read_text()).get("kind")
    elif hf_file.is_file():
        kind = "bpe"  # a Hugging Face model directory
    else:
        raise FileNotFoundError(
            f"{directory} holds neither {KIND_FILE} nor {HF_FILE}. Save a tokenizer there with "
            "save_tokenizer, or point at the directory of a Hugging Face model's tokenizer.json."
        )
    if kind == "bytes":
        return ByteTokenizer()
    if kind == "bpe":
        return BPETokenizer.from_file(hf_file)
    raise ValueError(f"{kind_file} names kind {kind!r}; expected one of {list(KINDS)}.")


def tokenizer_to_json(tok: Tokenizer | None) -> dict:
    """The tokenizer as a JSON-able dict (stored inside each checkpoint); None: a run without text."""
    if tok is None:
        return {"kind": "none"}
    if isinstance(tok, ByteTokenizer):
        return {"kind": "bytes"}
    return {"kind": "bpe", "tokenizer_json": tok.hf.to_str()}


def tokenizer_from_json(obj: dict) -> Tokenizer | None:
    """Inverse of `tokenizer_to_json`."""
    if obj.get("kind") == "none":
        return None
    if obj.get("kind") == "bytes":
        return ByteTokenizer()
    if obj.get("kind") == "bpe":
        return BPETokenizer(tokenizers.Tokenizer.from_str(obj["tokenizer_json"]))
    raise ValueError(f"unknown tokenizer record {str(obj)[:100]!r}; expected kind 'bytes' or 'bpe'")


def _utf8(text: str) -> bytes:
    """UTF-8 bytes of `text`, with a clear error for strings that have none (lone surrogates)."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(
            f"Cannot encode the text: {e.object[e.start:e.end]!r} at position {e.start} is a lone "
            "UTF-16 surrogate, which has no UTF-8 form. Read files with encoding='utf-8' (not "
            "errors='surrogateescape') or replace these characters."
        ) from None


def _known_ids(ids: Sequence[int] | np.ndarray, tok: Tokenizer) -> np.ndarray:
    """Ids [N] as an int64 array, checked to be the tokenizer's, 0 <= id < tok.vocab_size; raises
    ValueError naming the others (e.g. drawn from a model head larger than the tokenizer)."""
    ids = np.asarray(ids, dtype=np.int64)
    foreign = ids[(ids < 0) | (ids >= tok.vocab_size)]
    if foreign.size:
        shown = sorted(set(foreign.tolist()))
        raise ValueError(
            f"{type(tok).__name__}.decode got ids {shown[:8]}{' ...' if len(shown) > 8 else ''} outside "
            f"[0, {tok.vocab_size - 1}]: this tokenizer has no such tokens (a wrong tokenizer for this model, "
            "or a model vocab_size larger than the tokenizer's)"
        )
    return ids


def _unknown_token_id(tok: tokenizers.Tokenizer) -> int | None:
    """The id the model emits for text it cannot represent, or None (e.g. byte-level BPE)."""
    model = json.loads(tok.to_str())["model"]
    if model.get("unk_id") is not None:  # Unigram stores an id
        return int(model["unk_id"])
    if model.get("unk_token") is not None:  # BPE, WordPiece, WordLevel store the token
        return tok.token_to_id(model["unk_token"])
    return None
