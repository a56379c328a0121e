"""Tests for transformer/sharding.py: the device mesh, and sharded training equal to one device's."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from transformer.sharding import make_mesh

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_mesh_errors_name_the_fix():
    with pytest.raises(ValueError, match="mesh.fsdp=3"):
        make_mesh(fsdp=3, devices=jax.devices()[:1] * 2)
    with pytest.raises(ValueError, match="mesh.data=-1"):
        make_mesh(data=2, devices=jax.devices()[:1])


@pytest.mark.slow
def test_sharded_training_equals_one_device():
    """8 simulated CPU devices (own process): data-parallel and FSDP losses equal the 1-device run's."""
    env = dict(os.environ, PYTHONPATH=ROOT, XLA_FLAGS="--xla_force_host_platform_device_count=8")
    out = subprocess.run([sys.executable, os.path.join(ROOT, "tests/helpers/sharded_losses.py")],
                         capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    # Equal up to float32 reduction order (the gradient all-reduce sums in another order).
    np.testing.assert_allclose(result["dp8"], result["1"], rtol=2e-5)
    np.testing.assert_allclose(result["dp4_fsdp2"], result["1"], rtol=2e-5)
    assert result["1"][-1] < result["1"][0]
    assert any("fsdp" in s for s in result["fsdp_specs"]), result["fsdp_specs"]
