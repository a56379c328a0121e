"""A readable JAX/Flax decoder-only transformer: train it, sample from it, look inside it.

The public names below load on first use (PEP 562): importing a subpackage loads nothing else.
"""

import importlib

_PUBLIC = {
    "config_from_file": "transformer.load", "load_run": "transformer.load", "model_config": "transformer.load",
    "validation_tokens": "transformer.load", "generate_text": "transformer.sampling.text",
    "loss": "transformer.analysis.capture", "capture": "transformer.analysis.capture",
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
