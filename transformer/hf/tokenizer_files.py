"""The tokenizer files `to_hf` writes next to an exported model: tokenizer.json (for bytes: a byte-level
BPE without merges whose ids are the byte values), tokenizer_config.json and tokenizer_kind.json."""

from __future__ import annotations

import os

import tokenizers

from transformer.data.atomic_files import save_json
from transformer.model.config import ModelConfig
from transformer.data.tokenizer import HF_FILE, BPETokenizer, ByteTokenizer, Tokenizer, save_tokenizer


def check_tokenizer(cfg: ModelConfig, tokenizer: Tokenizer) -> None:
    """Raises unless `tokenizer` is one this code writes, with no more ids than the model has."""
    if not isinstance(tokenizer, (ByteTokenizer, BPETokenizer)):
        raise TypeError(f"to_hf got a tokenizer of type {type(tokenizer).__name__}; pass the ByteTokenizer or "
                        "BPETokenizer the model was trained with (e.g. load_tokenizer(workdir + '/tokenizer'))")
    if tokenizer.vocab_size > cfg.vocab_size:
        raise ValueError(f"the tokenizer has {tokenizer.vocab_size} ids but the model's vocab_size is "
                         f"{cfg.vocab_size}: it is not the tokenizer this model was trained with; pass that one")


def write_tokenizer(cfg: ModelConfig, tokenizer: Tokenizer, directory: str | os.PathLike) -> None:
    """tokenizer.json, tokenizer_config.json and tokenizer_kind.json into `directory`."""
    if isinstance(tokenizer, ByteTokenizer):
        # save_tokenizer writes only the kind file for bytes; transformers needs a tokenizer.json.
        byte_level_identity().save(os.path.join(directory, HF_FILE))
    save_json(os.path.join(directory, "tokenizer_config.json"), {
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": cfg.max_seq_len,
        "clean_up_tokenization_spaces": False})
    save_tokenizer(tokenizer, directory)  # BPE: tokenizer.json; then the kind file, last


def byte_level_identity() -> tokenizers.Tokenizer:
    """A Hugging Face tokenizer equal to ByteTokenizer (id = byte value) by ByteLevel's GPT-2 byte table."""
    printable = {*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    others = iter(range(0x100, 0x200))
    chars = [chr(b) if b in printable else chr(next(others)) for b in range(256)]
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(vocab={c: b for b, c in enumerate(chars)}, merges=[]))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    return tok
