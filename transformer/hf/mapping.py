"""One table of Hugging Face tensors per model, read by `from_hf` and written by `to_hf`: import and
export cannot disagree. A family module defines ARCH, MODEL_TYPE, DEFAULTS (transformers' defaults
for the keys it reads), `import_config(hf) -> (ModelConfig, Layout)`, and (not DeepSeek) `layout(cfg)`
and `export(cfg) -> config.json fields`."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np
from flax import traverse_util

from transformer.hf.model_files import Tensors
from transformer.model.config import ModelConfig


@dataclasses.dataclass(frozen=True)
class Tensor:
    """Stored tensor `name` [*shape] holding `parts` {our path: our shape} along axis 0; transposed: stored
    [in, out]; fill: what `to_hf` writes for a missing param; rows: read as stored[rows] (import only);
    expert (j, axis): it is slice j along `axis` of our (one) param, a mixture's expert j."""

    name: str
    shape: tuple[int, ...]
    parts: dict[str, tuple[int, ...]] | str
    transposed: bool = False
    fill: float | None = None
    rows: np.ndarray | None = None
    expert: tuple[int, int] | None = None

    def ours(self) -> dict[str, tuple[int, ...]]:
        return {self.parts: self.shape} if isinstance(self.parts, str) else self.parts


@dataclasses.dataclass
class Layout:
    """A model's tensors: `top`, `layer(i)`, and `ignored` (regexes or predicates of tensors carrying nothing)."""

    top: list[Tensor]
    ignored: list
    layer: Callable[[int], list[Tensor]]


def read(t: Tensors, table: list[Tensor]) -> dict:
    """The params the tensors of `table` hold, as a nested dict (float32 NumPy leaves)."""
    params, experts = {}, {}
    for x in table:
        array = t.get(x.name, x.shape)
        array = array.T if x.transposed else array
        array = array if x.rows is None else array[x.rows]
        ours = x.ours()
        sizes = [math.prod(s) // math.prod(array.shape[1:]) for s in ours.values()]
        for (path, shape), part in zip(ours.items(), np.split(array, np.cumsum(sizes)[:-1])):
            if x.expert is None:
                params[path] = part.reshape(shape)
            else:  # expert j's slice: stacked along its axis once every expert is read
                experts.setdefault((path, x.expert[1]), []).append(part.reshape(shape))
    params |= {path: np.stack(slices, axis) for (path, axis), slices in experts.items()}
    return traverse_util.unflatten_dict(params, sep="/")


def write(params: dict, table: list[Tensor]) -> dict[str, np.ndarray]:
    """{name: stored array} of the tensors of `table`, from `params` (a param it lacks: its fill)."""
    flat, out = traverse_util.flatten_dict(params, sep="/"), {}
    for x in table:
        assert x.rows is None, "the rows of an import-only table cannot be written"
        trailing = (x.shape[::-1] if x.transposed else x.shape)[1:]
        parts = [np.asarray(flat[path]) if path in flat or x.fill is None else np.full(shape, x.fill, np.float32)
                 for path, shape in x.ours().items()]
        parts = parts if x.expert is None else [np.take(parts[0], x.expert[0], x.expert[1])]
        array = np.concatenate([part.reshape(-1, *trailing) for part in parts])
        out[x.name] = array.T if x.transposed else array
    return out


def norm(name: str, ours: str, d: int, bias: bool) -> list[Tensor]:
    """A norm's gain [D] (`name`.weight) and, with `bias`, its bias (`name`.bias)."""
    return [Tensor(f"{name}.weight", (d,), f"{ours}/scale", fill=1.0)] + (
        [Tensor(f"{name}.bias", (d,), f"{ours}/bias", fill=0.0)] if bias else [])


def top(cfg: ModelConfig, embed: str, final_norm: str, bias: bool = False, pos_embed: str | None = None) -> list[Tensor]:
    """The embedding [V, D], positions [T, D], final norm and, untied, the head [V, D]."""
    v, d = cfg.vocab_size, cfg.d_model
    table = [Tensor(embed, (v, d), "embed/embedding")]
    table += [Tensor(pos_embed, (cfg.max_seq_len, d), "pos_embed")] if pos_embed else []
    table += norm(final_norm, "final_norm", d, bias)
    return table + ([] if cfg.tie_embeddings else [Tensor("lm_head.weight", (v, d), "head/kernel")])


def linear(name: str, ours: str, out: tuple[int, ...], inputs: tuple[int, ...], bias: bool,
           transposed: bool = False) -> list[Tensor]:
    """A torch Linear `name` (weight [out, in], bias [out]) as ours (kernel [*out, *inputs], bias [*out])."""
    n_out, n_in = math.prod(out), math.prod(inputs)
    weight = Tensor(f"{name}.weight", (n_in, n_out) if transposed else (n_out, n_in),
                    {f"{ours}/kernel": (*out, *inputs)}, transposed)
    return [weight] + ([Tensor(f"{name}.bias", (n_out,), {f"{ours}/bias": out}, fill=0.0)] if bias else [])


def check_export(cfg: ModelConfig, arch: str, required: dict[str, tuple]) -> None:
    """Raises a ValueError naming every config field whose value `arch` cannot represent."""
    wrong = [f"{k}={getattr(cfg, k)!r} (needs {' or '.join(map(repr, v))})"
             for k, v in required.items() if getattr(cfg, k) not in v]
    if wrong:
        raise ValueError(f"cannot export this config as {arch}: " + "; ".join(wrong))


def export(layout: Layout, top_params: dict, layers: list[dict]) -> dict[str, np.ndarray]:
    """Every stored tensor of the model `top_params` + `layers` (one dict per layer)."""
    tensors = {}
    for i, layer in enumerate(layers):
        tensors.update(write(layer, layout.layer(i)))
    return tensors | write(top_params, layout.top)
