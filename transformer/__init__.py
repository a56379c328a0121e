"""A readable JAX/Flax decoder-only transformer: train it, sample from it, look inside it."""

from transformer.cache import KVCache, LatentCache, init_cache, kv_cache_bytes_per_token
from transformer.config import ModelConfig
from transformer.model import Decoder, count_params

__all__ = [
    "Decoder", "KVCache", "LatentCache", "ModelConfig", "count_params", "init_cache", "kv_cache_bytes_per_token",
]
