"""Hugging Face model files: a model's config and tensors read from a `save_pretrained` folder (with
`safetensors` and NumPy only) or a `transformers` model object; an exported model written."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
from collections.abc import Callable
from typing import Any

import numpy as np

from transformer.data.atomic_files import save_json


class Tensors:
    """Named tensors read lazily as float32 NumPy arrays; one left unused is an error, not a different model.
    `get` also finds a name without its first component ('model.'), as old checkpoints store them."""

    def __init__(self, names: list[str], read: Callable[[str], np.ndarray], where: str):
        self.names = set(names)
        self.read = read
        self.where = where
        self.used: set[str] = set()

    def get(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        stored = name if name in self.names else name.split(".", 1)[-1]
        if stored not in self.names:
            raise ValueError(f"tensor {name} is missing from {self.where}")
        self.used.add(stored)
        array = self.read(stored)
        if tuple(array.shape) != tuple(shape):
            raise ValueError(f"tensor {stored} in {self.where} has shape {tuple(array.shape)}, but the config "
                             f"implies {tuple(shape)}; the weights do not belong to this config.json")
        return array

    def check_all_used(self, ignore: list) -> None:
        """Raises if a tensor was neither read nor matched by `ignore` (regexes or predicates)."""
        tests = [p if callable(p) else re.compile(p).fullmatch for p in ignore]
        full = lambda n: [n] + [f"{p}.{n}" for p in ("transformer", "model")]  # noqa: E731
        left = sorted(n for n in self.names - self.used if not any(t(m) for t in tests for m in full(n)))
        if left:
            shown = ", ".join(left[:8]) + (f" and {len(left) - 8} more" if len(left) > 8 else "")
            raise ValueError(f"{self.where} holds tensors the importer does not use ({shown}): the model uses a "
                             "feature this code does not implement, so it would not compute the same function")


def open_source(source: Any) -> tuple[dict, str | None, Callable[[], Tensors]]:
    """(config dict, architecture name or None, a function opening the tensors) of a folder or a model."""
    if isinstance(source, (str, os.PathLike)):
        return _open_directory(os.fspath(source))
    if hasattr(source, "state_dict") and hasattr(source, "config"):
        arch = type(source).__name__

        def open_tensors():
            import torch

            state = source.state_dict()
            with contextlib.suppress(ImportError):  # transformers 5 fuses some tensors (experts) in memory: as saved
                from transformers.core_model_loading import revert_weight_conversion

                state = revert_weight_conversion(source, state)
            read = lambda name: state[name].detach().to(device="cpu", dtype=torch.float32).numpy()  # noqa: E731
            return Tensors(list(state), read, f"the {arch} model's state_dict")

        return source.config.to_dict(), arch, open_tensors
    raise TypeError("from_hf takes a local model folder or a transformers model object, got "
                    f"{type(source).__name__}")


def _open_directory(directory: str) -> tuple[dict, str | None, Callable[[], Tensors]]:
    config_path = os.path.join(directory, "config.json")
    if os.path.isdir(os.path.join(directory, "checkpoints")):
        _refuse_training_run(directory, "it holds checkpoints/")
    if not os.path.isfile(config_path):
        raise FileNotFoundError(f"{directory} holds no config.json; pass a folder written by save_pretrained "
                                "(config.json and *.safetensors), e.g. a model downloaded with huggingface-cli")
    try:
        with open(config_path, encoding="utf-8") as f:
            hf = json.load(f)
        if not isinstance(hf, dict):
            raise ValueError(f"a JSON {type(hf).__name__}, not an object")
    except ValueError as e:  # not JSON, not UTF-8, not an object
        raise ValueError(f"{config_path} is no model config ({e}): download or export the model again") from None
    if {"model", "train"} <= set(hf):  # a run's config, not a Hugging Face one
        _refuse_training_run(directory, "its config.json has 'model' and 'train' sections")
    return hf, (hf.get("architectures") or [None])[0], lambda: _directory_tensors(directory)


def _refuse_training_run(directory: str, sign: str) -> None:
    raise ValueError(f"{directory} is not a Hugging Face model folder ({sign}): this is a training run: use "
                     "--workdir (sample.py, python -m transformer.explore), or transformer.load_run in Python")


def _directory_tensors(directory: str) -> Tensors:
    index_path = os.path.join(directory, "model.safetensors.index.json")
    if os.path.isfile(index_path):
        with open(index_path) as f:
            weight_map = json.load(f)["weight_map"]
    else:
        files = sorted(n for n in os.listdir(directory) if n.endswith(".safetensors"))
        if not files:
            raise FileNotFoundError(f"{directory} holds no *.safetensors weights (PyTorch .bin files are not "
                                    "read); convert them with save_pretrained(..., safe_serialization=True)")
        weight_map = {name: file for file in files
                      for name in _safe_open(os.path.join(directory, file), "numpy").keys()}
    handle = functools.cache(lambda file, framework: _safe_open(os.path.join(directory, file), framework))

    def read(name: str) -> np.ndarray:
        file = weight_map[name]
        dtype = handle(file, "numpy").get_slice(name).get_dtype()
        if not dtype.startswith(("F", "BF")):  # int8, uint8, bool: quantised weights read as numbers are garbage
            raise ValueError(f"tensor {name} in {os.path.join(directory, file)} is {dtype}, not a float: a quantised "
                             "model without quantization_config; export it unquantised (float32/bfloat16/float16)")
        if dtype == "BF16":
            # NumPy has no bfloat16: read it as a JAX array (ml_dtypes), then widen.
            return np.asarray(handle(file, "flax").get_tensor(name), np.float32)
        return np.asarray(handle(file, "numpy").get_tensor(name), np.float32)

    return Tensors(list(weight_map), read, directory)


def _safe_open(path: str, framework: str):
    from safetensors import SafetensorError, safe_open

    try:
        return safe_open(path, framework=framework)
    except SafetensorError as e:
        raise ValueError(f"{path} is damaged or truncated ({e}): download or export the model again") from None


def write_model(directory: str | os.PathLike, hf_config: dict, tensors: dict[str, np.ndarray]) -> None:
    """Writes config.json and model.safetensors (float32, contiguous) into `directory` (created)."""
    from safetensors.numpy import save_file

    os.makedirs(directory, exist_ok=True)
    tensors = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in tensors.items()}
    save_file(tensors, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
    save_json(os.path.join(directory, "config.json"), hf_config)
