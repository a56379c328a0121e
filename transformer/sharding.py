"""Devices: the 2-D device mesh and where parameters, optimizer state and batches live on it.

    mesh = make_mesh(data=-1, fsdp=1)        # axes ('data', 'fsdp'), data x fsdp devices
    state_sharding(state, mesh)              # a NamedSharding per array of the state pytree
    batch_sharding(mesh)                     # [B, T] batches: rows split over every device

Parameters and optimizer state are replicated for pure data parallelism (fsdp=1), or each array is
split along one axis over the 'fsdp' mesh axis (FSDP). The batch is split over both axes. The
jitted steps take these shardings and XLA inserts the collectives.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

BATCH_AXES = ("data", "fsdp")  # the batch is split over every device


def make_mesh(data: int = -1, fsdp: int = 1, devices: list | None = None) -> Mesh:
    """A 2-D device mesh with axes ('data', 'fsdp'); data=-1 takes all remaining devices."""
    devices = jax.devices() if devices is None else devices
    n = len(devices)
    if fsdp < 1 or n % fsdp:
        raise ValueError(f"mesh.fsdp={fsdp} must divide the {n} available devices")
    if data == -1:
        data = n // fsdp
    if data * fsdp != n:
        raise ValueError(
            f"mesh.data={data} x mesh.fsdp={fsdp} = {data * fsdp} devices, but {n} are available; "
            "set mesh.data=-1 to use them all"
        )
    return Mesh(np.asarray(devices).reshape(data, fsdp), ("data", "fsdp"))


def _leaf_spec(x: Any, fsdp: int) -> P:
    """FSDP placement of one array: split its largest axis that the fsdp size divides."""
    shape = getattr(x, "shape", ())
    if fsdp == 1 or not shape or math.prod(shape) < 2**14:  # small arrays: not worth a collective
        return P()
    for axis in sorted(range(len(shape)), key=lambda a: -shape[a]):
        if shape[axis] % fsdp == 0:
            spec = [None] * len(shape)
            spec[axis] = "fsdp"
            return P(*spec)
    return P()


def state_sharding(state: Any, mesh: Mesh) -> Any:
    """NamedShardings for a state pytree: replicated, or FSDP-split over the 'fsdp' axis."""
    fsdp = mesh.shape["fsdp"]
    return jax.tree.map(lambda x: NamedSharding(mesh, _leaf_spec(x, fsdp)), state)


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """[B, T] batches: rows split over every device of the mesh."""
    return NamedSharding(mesh, P(BATCH_AXES))
