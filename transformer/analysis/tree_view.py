"""Pytrees you can open: `show_tree(params, "parameters")` shows every array as one foldable line,
`float32[4, 128, 512]  262,144 = 1.0 MiB  cpu:0` (sharded: its PartitionSpec and mesh), under the totals.
treescope (the `notebooks` extra) is imported only when a view is rendered.
"""

from __future__ import annotations

import dataclasses
import html
from typing import Any

import jax
import numpy as np


@dataclasses.dataclass(frozen=True)
class ArrayLeaf:
    shape: tuple[int, ...]
    dtype: str
    size: int
    nbytes: int
    sharding: str

    def __str__(self) -> str:
        shape = ", ".join(map(str, self.shape))
        return f"{self.dtype}[{shape}]  {self.size:,} = {human_bytes(self.nbytes)}  {self.sharding}"

    def __treescope_repr__(self, path: str | None, subtree_renderer: Any) -> Any:
        from treescope import rendering_parts

        return rendering_parts.build_one_line_tree_node(rendering_parts.text(str(self)), path)


def tree_summary(tree: Any) -> Any:
    """`tree` with every array (jax, NumPy, or a jax.ShapeDtypeStruct) replaced by its ArrayLeaf."""
    return jax.tree.map(array_leaf, tree, is_leaf=lambda x: isinstance(x, jax.ShapeDtypeStruct))


def array_leaf(x: Any) -> ArrayLeaf | Any:
    """One array's ArrayLeaf; anything else (a Python number, None) is returned as it is."""
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        return x
    dtype = np.dtype(x.dtype)
    size = int(np.prod(x.shape, dtype=np.int64))
    return ArrayLeaf(tuple(x.shape), dtype.name, size, size * dtype.itemsize, placement(x))


def placement(x: Any) -> str:
    """Where an array lies: 'numpy (host)', one device ('cpu:0'), or a PartitionSpec over a mesh."""
    if isinstance(x, np.ndarray | np.generic):
        return "numpy (host)"
    sharding = getattr(x, "sharding", None)
    if sharding is None:
        return "abstract (no data)"
    if isinstance(sharding, jax.sharding.NamedSharding):
        mesh = ", ".join(f"{name}={n}" for name, n in sharding.mesh.shape.items())
        return f"{sharding.spec} over mesh ({mesh})"
    devices = sorted(sharding.device_set, key=lambda d: d.id)
    if len(devices) == 1:
        return f"{devices[0].platform}:{devices[0].id}"
    return f"{type(sharding).__name__} over {len(devices)} devices"


def human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


@dataclasses.dataclass(repr=False)
class TreeView:
    """A titled summary of a pytree; `_repr_html_` renders it with treescope in Jupyter."""

    title: str
    summary: Any  # the tree with ArrayLeaf leaves

    def totals(self) -> tuple[int, int, int]:
        """(arrays, elements, bytes) over the whole tree."""
        leaves = [x for x in jax.tree.leaves(self.summary) if isinstance(x, ArrayLeaf)]
        return len(leaves), sum(x.size for x in leaves), sum(x.nbytes for x in leaves)

    def header(self) -> str:
        arrays, elements, nbytes = self.totals()
        return f"{self.title}: {arrays} arrays, {elements:,} numbers, {human_bytes(nbytes)}"

    def _repr_html_(self) -> str:
        return f"<div><b>{html.escape(self.header())}</b></div>" + _treescope().render_to_html(self.summary)

    def __repr__(self) -> str:  # the text a terminal (or a notebook without HTML) shows
        return self.header() + "\n" + _treescope().render_to_text(self.summary)


def show_tree(tree: Any, title: str = "tree") -> TreeView:
    """A foldable view of `tree`: display it in Jupyter, or print it for text."""
    return TreeView(title, tree_summary(tree))


def _treescope():
    try:
        import treescope
    except ImportError:
        raise ImportError("show_tree renders with treescope: pip install treescope "
                          "(in the project's `notebooks` extra: pip install -e '.[notebooks]')") from None
    return treescope
