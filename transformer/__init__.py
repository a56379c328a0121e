"""A readable JAX/Flax decoder-only transformer: train it, sample from it, look inside it.

The package by layer (docs/design.md, "Layering"): model/ and data/ at the bottom; hf/, run/,
training/ and sampling/ above them; analysis/ above those; experiments/ above analysis; load.py,
explore.py and cli.py on top. The public names below load on first use (PEP 562), so importing
a subpackage (transformer.model.ops) loads nothing else.
"""

import importlib

_PUBLIC = {
    "config_from_file": "transformer.load", "load_run": "transformer.load", "model_config": "transformer.load",
    "ModelConfig": "transformer.model.config",
    "Decoder": "transformer.model.decoder", "count_params": "transformer.model.decoder",
    "KVCache": "transformer.model.kv_cache", "LatentCache": "transformer.model.kv_cache",
    "init_cache": "transformer.model.kv_cache", "kv_cache_bytes_per_token": "transformer.model.kv_cache",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'transformer' has no attribute {name!r}")
    return getattr(importlib.import_module(_PUBLIC[name]), name)
