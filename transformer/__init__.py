"""A readable JAX/Flax decoder-only transformer: train it, sample from it, look inside it.

The package by layer (docs/design.md, "Layering"): model/ and data/ at the bottom; hf/ above them;
training/ and sampling/ above hf/; analysis/ above those; load.py (a model in one call), explore.py
(the attention explorer's command line) and cli.py (config-file flags) on top.

Importing the package loads the plug-ins of the training loop: the data tasks 'text' and 'needle'
(data/) and the evaluation metrics of attention shares, induction scores and the needle task's exact match
(analysis/) register themselves.
"""

import transformer.analysis  # noqa: F401  (registers the analysis layer's evaluation metrics)

from transformer.load import config_from_file, load_run, model_config
from transformer.model.config import ModelConfig
from transformer.model.decoder import Decoder, count_params
from transformer.model.kv_cache import KVCache, LatentCache, init_cache, kv_cache_bytes_per_token

__all__ = [
    "Decoder", "KVCache", "LatentCache", "ModelConfig", "config_from_file", "count_params", "init_cache",
    "kv_cache_bytes_per_token", "load_run", "model_config",
]
