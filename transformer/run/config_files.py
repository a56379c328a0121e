"""Config files (a configs/*.py file's get_config()) and their fields by dotted name ('train.steps'):
the one place a config or sweep file is loaded by its path."""

from __future__ import annotations

import difflib
import importlib.util
import os
from collections.abc import Mapping
from typing import Any

from ml_collections import ConfigDict


def load_config_file(path: str) -> Any:
    """The file's get_config() (a ConfigDict for a config, a dict for a sweep file)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no config file {path!r}; pass a path such as configs/gpt2.py")
    name = os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(f"config_file_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def load_config(path: str) -> ConfigDict:
    """A config file's get_config(), which must be an ml_collections ConfigDict (`check_config`)."""
    return check_config(load_config_file(path), path)


def check_config(config: Any, path: str) -> ConfigDict:
    """`config` (what the file at `path` built) if it is a ConfigDict, else a ValueError naming the file."""
    if not isinstance(config, ConfigDict):
        raise ValueError(f"config file {path}: get_config() returned {type(config).__name__}, not an "
                         "ml_collections ConfigDict; build it with configs/common.base_config")
    return config


def leaf_fields(config: ConfigDict, prefix: str = "") -> list[str]:
    """Every field's dotted name ('train.steps', 'model.d_model', ...)."""
    names = []
    for key, value in config.items():
        if isinstance(value, ConfigDict):
            names += leaf_fields(value, f"{prefix}{key}.")
        else:
            names.append(f"{prefix}{key}")
    return names


def closest_field(name: str, fields: list[str]) -> str | None:
    """The valid field most like `name`: a sibling in its section (train.stpes -> train.steps), else
    the closest full name."""
    section, _, leaf = name.rpartition(".")
    siblings = [f.rpartition(".")[2] for f in fields if f.rpartition(".")[0] == section]
    if siblings:
        close = difflib.get_close_matches(leaf, siblings, n=1, cutoff=0.6)
        return f"{section}.{close[0]}" if close else None
    close = difflib.get_close_matches(name, fields, n=1, cutoff=0.6)
    return close[0] if close else None


def set_fields(config: ConfigDict, changes: Mapping[str, Any], where: str,
               error: type[Exception] = ValueError) -> None:
    """Sets each dotted field of `changes`; an unknown or ill-typed one raises `error` naming `where`,
    the field and the closest valid one."""
    fields = leaf_fields(config)
    for name, value in changes.items():
        if name not in fields:
            close = closest_field(name, fields)
            raise error(f"{where}: unknown config field {name}" +
                        (f"; did you mean {close}?" if close else "; configs/common.py lists the fields"))
        *sections, leaf = name.split(".")
        node = config
        for section in sections:
            node = node[section]
        try:
            node[leaf] = value
        except (TypeError, ValueError) as e:
            raise error(f"{where}: {name}={value!r} does not fit the field ({str(e).splitlines()[0]})") from None


def flat(tree: Mapping, prefix: str = "") -> dict:
    """{'train': {'steps': 3}} -> {'train.steps': 3}."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out
