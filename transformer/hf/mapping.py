"""What a model family's module (gpt2.py, llama.py, deepseek.py) gives `from_hf` and `to_hf`.

Each family module defines
    ARCH, MODEL_TYPE   its transformers class name and config.json model_type
    DEFAULTS           transformers' class defaults for the config keys it reads (a config.json
                       may omit a key left at its default)
    import_config(hf)  -> (ModelConfig, Converter): checks the config, maps its fields
    export(cfg, top, layers) -> (config.json dict, {tensor name: array})   (GPT-2 and Llama)

`from_hf` reads one layer at a time (`Converter.layer`), then the rest (`Converter.top`), and
lays the layers out with param_tree.join_layers; `to_hf` hands `export` the layers as a list
(param_tree.split_layers), whatever layout the params have.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from transformer.model.config import ModelConfig
from transformer.hf.model_files import Tensors


@dataclasses.dataclass
class Converter:
    top: Callable[[Tensors, ModelConfig], dict]  # embed, pos_embed, final_norm, head
    layer: Callable[[Tensors, ModelConfig, int], dict]  # one layer's params
    ignore: Callable[[ModelConfig], list]  # regexes (or predicates) of tensors no one reads


def check_export(cfg: ModelConfig, arch: str, required: dict[str, tuple]) -> None:
    """Raises a ValueError naming every config field whose value `arch` cannot represent."""
    wrong = [f"{k}={getattr(cfg, k)!r} (needs {' or '.join(map(repr, v))})"
             for k, v in required.items() if getattr(cfg, k) not in v]
    if wrong:
        raise ValueError(f"cannot export this config as {arch}: " + "; ".join(wrong))
