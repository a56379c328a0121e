"""Devices: the (data, fsdp, tensor[, expert]) mesh and the rules that map logical axis names onto it.

    mesh = make_mesh(data=-1, fsdp=1, tensor=1)         # axes ('data', 'fsdp', 'tensor'); expert=n > 1 adds 'expert'
    rules = make_rules(cfg, mesh, config.mesh.rules)    # logical name -> mesh axes, checked against cfg
    sharded_jit(fn, mesh, rules, in_shardings)          # jax.jit under the axis rules: every compiled step

Parameters get logical axes from `PARAM_AXES`, activations where they are computed
(`nn.with_logical_constraint`). DEFAULT_RULES: FSDP over embed, Megatron's split over tensor (one
all-reduce after attention, one after the MLP), a mixture's experts over `expert` (each device holds and
runs E / n experts for every token, then the outputs are summed across it). Rules apply in `LOGICAL_AXES` order, a mesh axis serving
one dimension per array. Key/value heads the tensor size does not divide are replicated, as MLA's latent is.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from transformer.model.config import ModelConfig
from transformer.model.param_tree import param_shapes, path_names

MESH_AXES = ("data", "fsdp", "tensor", "expert")  # 'expert' only in a mesh with expert > 1
# Logical axis names, in the order the rules are applied.
LOGICAL_AXES = ("batch", "layers", "vocab", "heads", "kv_heads", "mlp", "embed", "length", "head_dim",
                "latent", "norm", "experts")
# The default rules, as the config holds them: mesh axes joined by commas, "" = replicated.
DEFAULT_RULES = {
    "batch": "data,fsdp", "layers": "", "vocab": "tensor", "heads": "tensor", "kv_heads": "tensor",
    "mlp": "tensor", "embed": "fsdp", "length": "", "head_dim": "", "latent": "", "norm": "",
    "experts": "expert",
}
# The config field that sets each logical axis's size (named when a size does not divide).
SIZE_FIELD = {
    "vocab": "model.vocab_size", "heads": "model.num_heads", "kv_heads": "model.num_kv_heads",
    "mlp": "model.mlp_dim", "embed": "model.d_model", "length": "model.max_seq_len",
    "head_dim": "model.head_dim (or v_head_dim, rope_head_dim)", "latent": "model.kv_latent_dim (or q_latent_dim)",
    "norm": "model.d_model (or a latent width, or head_dim with qk_norm)", "layers": "model.num_layers",
    "experts": "model.num_experts",
}
Rules = tuple[tuple[str, Any], ...]  # flax's form: ((logical name, mesh axes or None), ...)

# Logical axes of every parameter by (module, parameter) name, for one layer (a scanned stack adds
# 'layers' first). Weight matrices are [out, in].
_DENSE_IN = {"kernel": ("mlp", "embed"), "bias": ("mlp",)}  # D -> F, split by output
PARAM_AXES = {
    ("embed", "embedding"): ("vocab", "embed"),  # E [V, D]
    ("pos_embed",): ("length", "embed"),  # P [T_max, D]
    ("head", "kernel"): ("vocab", "embed"),  # W [V, D]
    ("q", "kernel"): ("heads", "head_dim", "embed"), ("q", "bias"): ("heads", "head_dim"),  # [H, K, D]
    ("k", "kernel"): ("kv_heads", "head_dim", "embed"), ("k", "bias"): ("kv_heads", "head_dim"),  # [G, K, D]
    ("v", "kernel"): ("kv_heads", "head_dim", "embed"), ("v", "bias"): ("kv_heads", "head_dim"),
    ("o", "kernel"): ("embed", "heads", "head_dim"), ("o", "bias"): ("embed",),  # W_o [D, H, Kv]
    **{(name, p): axes for name in ("fc_in", "gate", "up") for p, axes in _DENSE_IN.items()},  # [F, D]
    ("fc_out", "kernel"): ("embed", "mlp"), ("fc_out", "bias"): ("embed",),  # [D, F]
    ("q_down", "kernel"): ("latent", "embed"), ("q_down", "bias"): ("latent",),  # MLA W_DQ [Cq, D]
    ("q_up", "kernel"): ("heads", "head_dim", "latent"),  # MLA W_UQ [H, K + Kr, Cq]
    ("kv_down", "kernel"): ("latent", "embed"), ("kv_down", "bias"): ("latent",),  # W_DKV [C + Kr, D]
    ("attn", "k_up"): ("heads", "head_dim", "latent"),  # W_UK [H, K, C]
    ("attn", "v_up"): ("heads", "head_dim", "latent"),  # W_UV [H, Kv, C]
    ("attn", "sink"): ("heads",), ("cross", "sink"): ("heads",),  # the sink logit per head [H] (attention_sink)
    ("registers",): ("length", "embed"),  # register tokens [R, D] (num_registers)
    # a table model's row embedding W [D, F + C] (model/table.py): its few inputs replicated, like a norm's
    ("row_embed", "kernel"): ("embed", "norm"), ("row_embed", "bias"): ("embed",),
    # a mixture of experts (model/moe.py): the router [E, D], each expert's W_gate, W_up [E, F, D], W_out [D, E, F]
    ("router", "kernel"): ("experts", "embed"), ("expert_out", "kernel"): ("embed", "experts", "mlp"),
    **{(name, "kernel"): ("experts", "mlp", "embed") for name in ("expert_gate", "expert_up")},
    # a ViT (model/image.py): the patch embedding W [D, P P C] (its inputs replicated) and the [CLS] token [D]
    ("patch_embed", "kernel"): ("embed", "norm"), ("patch_embed", "bias"): ("embed",), ("cls",): ("embed",),
}
# Of every *_norm module: [D], [latent width] or [K], replicated ("norm").
NORM_PARAMS = ("scale", "bias")


def make_mesh(data: int = -1, fsdp: int = 1, tensor: int = 1, devices: list | None = None, expert: int = 1) -> Mesh:
    """A device mesh with axes ('data', 'fsdp', 'tensor'), and 'expert' when expert > 1; data=-1 takes
    all remaining devices."""
    devices = jax.devices() if devices is None else devices
    n = len(devices)
    for name, size in (("fsdp", fsdp), ("tensor", tensor), ("expert", expert)):
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"mesh.{name}={size!r} must be a positive integer")
    if n % (fsdp * tensor * expert):
        raise ValueError(f"mesh.fsdp={fsdp} x mesh.tensor={tensor} x mesh.expert={expert} must divide the {n} "
                         "available devices")
    if data == -1:
        data = n // (fsdp * tensor * expert)
    if data * fsdp * tensor * expert != n:
        raise ValueError(f"mesh.data={data} x mesh.fsdp={fsdp} x mesh.tensor={tensor} x mesh.expert={expert} = "
                         f"{data * fsdp * tensor * expert} devices, but {n} are available; set mesh.data=-1 to use them all")
    shape = (data, fsdp, tensor) + ((expert,) if expert > 1 else ())
    return Mesh(np.asarray(devices).reshape(shape), MESH_AXES[:len(shape)])


def parse_rules(rules: Mapping[str, str] | Rules | None = None, mesh: Mesh | None = None) -> Rules:
    """Config rules {logical name: 'axis,axis' or ''} (or rules already parsed) -> flax's ((name, axes or
    None), ...), in LOGICAL_AXES order; names left out keep DEFAULT_RULES'. With `mesh`, the mesh axes
    it lacks (a mesh without 'expert') are left out."""
    rules = dict(rules or {})
    unknown = sorted(set(rules) - set(LOGICAL_AXES))
    if unknown:
        raise ValueError(f"mesh.rules has unknown logical axes {unknown}; the logical axes are {list(LOGICAL_AXES)}")
    parsed = []
    for name in LOGICAL_AXES:
        value = rules.get(name, DEFAULT_RULES[name])
        axes = tuple(a.strip() for a in value.split(",") if a.strip()) if isinstance(value, str) else tuple(value or ())
        if bad := [a for a in axes if a not in MESH_AXES]:
            raise ValueError(f"mesh.rules.{name}={value!r} names {bad}, not mesh axes; use some of {list(MESH_AXES)} "
                             "joined by commas, or '' to replicate")
        axes = tuple(a for a in axes if mesh is None or a in mesh.shape)
        parsed.append((name, axes[0] if len(axes) == 1 else (axes or None)))
    return tuple(parsed)


def make_rules(cfg: ModelConfig, mesh: Mesh, rules: Mapping[str, str] | None = None) -> Rules:
    """`rules` (config.mesh.rules) for this model on this mesh: key/value heads that the kv_heads
    axes do not divide are replicated; any other size that does not divide is an error naming the field."""
    parsed = dict(parse_rules(rules, mesh))
    size = lambda name: _mesh_size(mesh, parsed[name])  # noqa: E731
    if cfg.attention == "mha" and cfg.num_kv_heads % size("kv_heads"):
        parsed["kv_heads"] = None
    for path, x in jax.tree_util.tree_leaves_with_path(param_shapes(cfg)):
        names = path_names(path)
        for name, dim in zip(param_axes(names, x.ndim), x.shape, strict=True):
            if dim % size(name):
                raise ValueError(f"{SIZE_FIELD[name]}: the '{name}' axis of parameter {'/'.join(names)} has size "
                                 f"{dim}, not divisible by the {size(name)} devices of mesh axes {parsed[name]} "
                                 f"(mesh.rules.{name}); choose sizes that divide, or a smaller "
                                 f"mesh.{_first_axis(parsed[name])}")
    return tuple(parsed.items())


def param_axes(path: tuple[str, ...], ndim: int) -> tuple[str, ...]:
    """The logical axes of the parameter at `path` (('layers', 'attn', 'q', 'kernel'), ...) with
    `ndim` dimensions; KeyError for a parameter the table does not know."""
    if path[-1] in ("pos_embed", "registers", "cls"):  # top-level arrays, no module of their own
        axes = PARAM_AXES[(path[-1],)]
    elif len(path) >= 2 and path[-2].endswith("norm") and path[-1] in NORM_PARAMS:
        axes = ("norm",)
    else:
        axes = PARAM_AXES.get(tuple(path[-2:]))
        if axes is None:
            raise KeyError(f"no logical axes for parameter {'/'.join(path)}; add it to sharding.PARAM_AXES")
    if "layers" in path:  # nn.scan's stack: a leading L axis
        axes = ("layers", *axes)
    if len(axes) != ndim:
        raise KeyError(f"parameter {'/'.join(path)} has {ndim} dimensions but PARAM_AXES names {axes}")
    return axes


def state_sharding(state: Any, mesh: Mesh, rules: Rules | None = None) -> Any:
    """NamedShardings for a pytree holding parameters (params, a TrainState): each parameter-shaped
    array as the rules place its logical axes, the rest (step counts, PRNG keys) replicated."""
    rules = parse_rules(rules, mesh)

    def place(path, x) -> NamedSharding:
        names = path_names(path)
        try:
            spec = nn.logical_to_mesh_axes(param_axes(names, np.ndim(x)), rules)
        except KeyError:
            if "params" in names:  # a parameter the table misses: an error, not a silent replica
                raise
            spec = P()
        return NamedSharding(mesh, spec)

    return jax.tree_util.tree_map_with_path(place, state)


def batch_sharding(mesh: Mesh, rules: Rules | None = None) -> NamedSharding:
    """[B, T] batches: rows split over the mesh axes of the 'batch' rule (default data and fsdp)."""
    return NamedSharding(mesh, nn.logical_to_mesh_axes(("batch", "length"), parse_rules(rules, mesh)))


@contextlib.contextmanager
def axis_rules(mesh: Mesh, rules: Rules | None = None) -> Iterator[None]:
    """While active, `nn.with_logical_constraint` places activations by `rules` on `mesh`."""
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), nn.logical_axis_rules(parse_rules(rules, mesh)):
        yield


def sharded_jit(fn: Callable, mesh: Mesh, rules: Rules, in_shardings: Any, out_shardings: Any = None,
                donate_argnums: tuple[int, ...] = ()) -> Callable:
    """`fn` under jax.jit with these shardings, traced under the axis rules: every compiled function
    of a run (train and eval steps, metrics), compiled by the caller: `.lower(*args).compile()`."""
    return jax.jit(axis_rules(mesh, rules)(fn), in_shardings=in_shardings, out_shardings=out_shardings,
                   donate_argnums=donate_argnums)


def _mesh_size(mesh: Mesh, axes: Any) -> int:
    axes = () if axes is None else (axes,) if isinstance(axes, str) else axes
    return int(np.prod([mesh.shape[a] for a in axes]))


def _first_axis(axes: Any) -> str:
    return axes if isinstance(axes, str) else axes[0]
