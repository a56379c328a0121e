"""Tests for transformer/training/sharding.py: the mesh, the logical axes and their rules, and sharded training,
checkpointing and decoding on 8 simulated CPU devices equal to one device's (and across 2 processes)."""

import functools
import json
import os
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from tests.helpers.cli import ROOT, losses, train_cmd
from tests.helpers.decoder import ATTENTION, POSITION, make_cfg
from transformer.training.sharding import make_mesh, make_rules, param_axes, parse_rules, state_sharding
from transformer.training.steps import init_params

# float32 on different meshes sums in a different order: the gradient all-reduce over data and fsdp,
# the partial sums of W_o and the MLP's output projection over tensor, the softmax over a split
# vocabulary. The losses (~4.2) then differ by an ulp or two of float32 (1 ulp = 4.8e-7 at 4.2,
# 1.1e-7 relative; measured: at most 2.3e-7 relative over 3 steps, every variant and mesh). 1e-6
# allows ~8 ulps; a missing or doubled partial sum moves the first loss by far more (a step of
# training moves it by 1e-3).
RTOL = 1e-6


def test_mesh_errors_name_the_fix():
    with pytest.raises(ValueError, match="mesh.fsdp=3"):
        make_mesh(fsdp=3, devices=jax.devices()[:1] * 2)
    with pytest.raises(ValueError, match="mesh.tensor=2"):
        make_mesh(tensor=2, devices=jax.devices()[:1] * 3)
    with pytest.raises(ValueError, match="mesh.data=-1"):
        make_mesh(data=2, devices=jax.devices()[:1])
    mesh = make_mesh(devices=jax.devices()[:1])
    assert dict(mesh.shape) == {"data": 1, "fsdp": 1, "tensor": 1}


def test_rules_parse_and_reject_unknown_names():
    rules = dict(parse_rules({"vocab": "", "embed": "fsdp,tensor"}))
    assert rules["batch"] == ("data", "fsdp") and rules["vocab"] is None and rules["embed"] == ("fsdp", "tensor")
    assert rules["heads"] == "tensor"  # the default for a name left out
    with pytest.raises(ValueError, match="unknown logical axes \\['hedas'\\]"):
        parse_rules({"hedas": "tensor"})
    with pytest.raises(ValueError, match="mesh.rules.heads='model'"):
        parse_rules({"heads": "model"})


# Every attention variant with every position scheme (MLA with RoPE: mla_q_rope, its decoupled rotary part).
VARIANTS = [(a, p) for a in sorted(ATTENTION) for p in sorted(POSITION) if a != "mla_q_rope" or p == "rope"
            if a != "mla" or p != "rope"]


@pytest.mark.parametrize("attention, position", VARIANTS)
@pytest.mark.parametrize("scan_layers", [True, False])
def test_every_parameter_of_every_variant_has_logical_axes(attention, position, scan_layers):
    cfg = make_cfg(attention, position, scan_layers=scan_layers)
    variants = [cfg, cfg.replace(prenorm=False), cfg.replace(mlp_dim=0)]  # pre-, post-norm, attention-only
    if cfg.attention == "mha":  # the qk-norm gains q_norm, k_norm [K] (MLA refuses qk_norm)
        variants.append(cfg.replace(qk_norm=True))
    for variant in variants:
        shapes = jax.eval_shape(init_params, variant, jax.random.key(0))
        for path, x in jax.tree_util.tree_leaves_with_path(shapes):
            names = tuple(k.key for k in path)
            axes = param_axes(names, x.ndim)  # raises for a parameter the table misses
            assert ("layers" in axes) == (scan_layers and "layers" in names)


def test_sizes_that_do_not_divide_are_errors_naming_the_field():
    mesh = FakeMesh(data=1, fsdp=1, tensor=4)
    base = dict(vocab_size=64, max_seq_len=16, d_model=48, num_layers=1, num_heads=4, mlp_dim=64)
    from transformer.model.config import ModelConfig

    with pytest.raises(ValueError, match="model.num_heads.*mesh.rules.heads"):
        make_rules(ModelConfig(**{**base, "num_heads": 6}), mesh)
    with pytest.raises(ValueError, match="model.mlp_dim"):
        make_rules(ModelConfig(**{**base, "mlp_dim": 66}), mesh)
    with pytest.raises(ValueError, match="model.vocab_size"):
        make_rules(ModelConfig(**{**base, "vocab_size": 66}), mesh)
    with pytest.raises(ValueError, match="model.d_model"):
        make_rules(ModelConfig(**base), FakeMesh(data=1, fsdp=32, tensor=1))
    # Key/value heads that do not divide are replicated (GQA with 2 heads on 4 tensor devices) ...
    gqa = dict(make_rules(ModelConfig(**{**base, "num_kv_heads": 2}), mesh))
    assert gqa["kv_heads"] is None and gqa["heads"] == "tensor"
    assert dict(make_rules(ModelConfig(**base), mesh))["kv_heads"] == "tensor"  # ... and split when they do
    # Replicating the vocabulary (a rule the config may change) lifts its constraint.
    make_rules(ModelConfig(**{**base, "vocab_size": 66}), mesh, {"vocab": ""})


class FakeMesh:
    """The sizes make_rules reads, for meshes larger than this process's devices."""

    def __init__(self, **shape: int):
        self.shape = shape


def test_state_sharding_places_params_and_moments_by_the_rules():
    cfg = make_cfg("gqa", "rope")
    mesh = make_mesh(devices=jax.devices()[:1])
    params = jax.eval_shape(init_params, cfg, jax.random.key(0))
    specs = state_sharding({"params": params, "mu": params}, mesh, make_rules(cfg, mesh))
    q = specs["params"]["layers"]["attn"]["q"]["kernel"].spec  # [L, H, K, D]
    assert q == P(None, "tensor", None, "fsdp") and specs["mu"]["layers"]["attn"]["q"]["kernel"].spec == q
    assert specs["params"]["layers"]["attn"]["o"]["kernel"].spec == P(None, "fsdp", "tensor", None)  # [L, D, H, K]
    assert specs["params"]["layers"]["mlp"]["up"]["kernel"].spec == P(None, "tensor", "fsdp")  # [L, F, D]
    assert specs["params"]["layers"]["mlp"]["fc_out"]["kernel"].spec == P(None, "fsdp", "tensor")  # [L, D, F]
    assert specs["params"]["embed"]["embedding"].spec == P("tensor", "fsdp")  # [V, D]
    assert specs["params"]["final_norm"]["scale"].spec == P(None)


@functools.cache
def sharded_runs(what: str, *args: str) -> dict:
    """tests/helpers/sharded_runs.py `what` (its arguments as JSON), in its own process with 8 simulated
    CPU devices."""
    env = dict(os.environ, PYTHONPATH=ROOT, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, os.path.join(ROOT, "tests/helpers/sharded_runs.py"), what, *args],
                         capture_output=True, text=True, env=env, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


# What the rules say, per mesh (data, fsdp, tensor), for the watched parameters of tests/helpers/sharded_runs.py
# (scanned: leading L axis), with the 2x2x2 shard shapes beside.
SPECS = {
    "layers/attn/q/kernel": [None, "tensor", None, "fsdp"],  # [L, H, K, D]
    "layers/attn/k/kernel": [None, "tensor", None, "fsdp"],  # [L, G, K, D]
    "layers/attn/o/kernel": [None, "fsdp", "tensor", None],  # [L, D, H, K]
    "layers/mlp/fc_in/kernel": [None, "tensor", "fsdp"],  # [L, F, D]
    "layers/mlp/up/kernel": [None, "tensor", "fsdp"],
    "layers/mlp/fc_out/kernel": [None, "fsdp", "tensor"],  # [L, D, F]
    "layers/attn/kv_down/kernel": [None, None, "fsdp"],  # MLA [L, C + Kr, D]: replicated over tensor
    "layers/attn/k_up": [None, "tensor", None, None],  # MLA W_UK [L, H, K, C]
    "embed/embedding": ["tensor", "fsdp"],  # [V, D]
    "head/kernel": ["tensor", "fsdp"],
    "layers/attn_norm/scale": [None, None],
}


# The meshes each variant trains on (each mesh is a compile of its own): MHA on each axis alone and on
# two mixes; GQA where its 4 key/value heads are split (tensor 2 and 4) and replicated (tensor 8); MLA,
# whose latent is replicated over tensor, on the two mixes.
MESHES = {"mha": ["8x1x1", "1x8x1", "1x1x8", "2x2x2", "1x2x4"], "gqa": ["1x1x8", "2x2x2", "1x2x4"],
          "mla": ["2x2x2", "1x2x4"]}


def sharded_losses() -> dict:
    return sharded_runs("losses", json.dumps(MESHES))


@pytest.mark.slow
def test_sharded_training_equals_one_device():
    """MHA, GQA and MLA on the meshes of MESHES: the losses of 3 steps equal one device's, and
    parameters and AdamW moments are laid out as the rules say."""
    result = sharded_losses()
    for variant, meshes in MESHES.items():
        one = np.array(result[f"{variant}/1"]["losses"])
        for mesh in meshes:
            run = result[f"{variant}/{mesh}"]
            np.testing.assert_allclose(run["losses"], one, rtol=RTOL, err_msg=f"{variant} on {mesh}")
            data, fsdp, tensor = map(int, mesh.split("x"))
            for name, leaf in run["layout"].items():
                want = [a if (a == "fsdp" and fsdp > 1) or (a == "tensor" and tensor > 1) else None
                        for a in SPECS[name]]
                if name == "layers/attn/k/kernel" and variant == "gqa" and tensor == 8:
                    want[1] = None  # 4 key/value heads on 8 tensor devices: replicated
                got = [None if (a == "fsdp" and fsdp == 1) or (a == "tensor" and tensor == 1) else a
                       for a in leaf["spec"]]
                assert got == want, (variant, mesh, name, leaf["spec"])
                assert leaf["moments"] == [leaf["spec"]] * 2, (variant, mesh, name)  # AdamW mu, nu as the params
                sizes = {"fsdp": fsdp, "tensor": tensor, None: 1}
                assert leaf["shard"] == [n // sizes[a] for n, a in zip(leaf["shape"], want)], (variant, mesh, name)
    # GQA's 4 key/value heads: split over tensor 2 and 4, replicated over tensor 8 (they do not divide).
    k = {mesh: result[f"gqa/{mesh}"]["layout"]["layers/attn/k/kernel"]["spec"] for mesh in ("2x2x2", "1x2x4", "1x1x8")}
    assert k == {"2x2x2": [None, "tensor", None, "fsdp"], "1x2x4": [None, "tensor", None, "fsdp"],
                 "1x1x8": [None, None, None, "fsdp"]}


@pytest.mark.slow
def test_sharded_muon_training_equals_one_device():
    """optim.name='muon' (GQA) on meshes 1x8x1 and 2x2x2: the losses of 3 steps equal one device's,
    and W_q's Muon momentum is laid out as W_q (split over fsdp and tensor, whole per device: none)."""
    meshes = ["1x8x1", "2x2x2"]
    result = sharded_runs("muon", json.dumps(meshes))
    for mesh in meshes:
        np.testing.assert_allclose(result[mesh]["losses"], result["1"]["losses"], rtol=RTOL, err_msg=mesh)
        assert result[mesh]["q_momentum_spec"] == result[mesh]["q_spec"], mesh
    assert result["2x2x2"]["q_spec"] == [None, "tensor", None, "fsdp"]  # [L, H, K, D]


@pytest.mark.slow
def test_tensor_parallel_forward_all_reduces_twice_per_layer():
    """Megatron-style on 1x1x8: the compiled forward (eval step) all-reduces the residual stream
    [B, T, D] = [16, 16, 64] once after attention and once after the MLP of each layer, once after
    the embedding lookup (the table is split over the vocabulary), and [B, T] once in the loss over
    the split vocabulary; nothing else."""
    result = sharded_losses()
    stream, loss = "f32[16,16,64]", "f32[16,16]"
    for variant in ("mha", "gqa", "mla"):  # the scanned layer's body appears once in the program
        assert sorted(result[f"{variant}/all_reduces"]) == [stream] * 3 + [loss], variant
    assert sorted(result["mha/all_reduces/unscanned"]) == [stream] * (2 * 2 + 1) + [loss]  # L = 2 layers


@pytest.mark.slow
def test_checkpoints_move_between_meshes():
    """Saved on 2x2x2 and resumed on 1 device, and the reverse: restored straight into the target's
    shardings, and the losses continue as an unbroken run on the second mesh."""
    for move, run in sharded_runs("checkpoint").items():
        assert run["restored_into_target_shardings"], move
        np.testing.assert_allclose(run["resumed"], run["unbroken"], rtol=RTOL, err_msg=move)
        q = run["restored_layout"]["layers/attn/q/kernel"]  # [L, H, K, D]: heads over tensor, D over fsdp
        assert q["shard"] == ([2, 4, 8, 32] if move.endswith("2x2x2") else q["shape"]), move


@pytest.mark.slow
def test_sharded_decoding_equals_one_device():
    """generate with tensor-split parameters and a cache split by key/value heads and batch: the same
    greedy tokens as on one device."""
    for variant, run in sharded_runs("decode").items():
        assert run["sharded"] == run["one"], variant
        assert any(len(set(row)) > 1 for row in run["one"])  # not one token repeated: the context matters
    gqa, mla = sharded_runs("decode")["gqa"], sharded_runs("decode")["mla"]
    assert gqa["cache_spec"] == [["data", "fsdp"], "tensor", None, None]  # [B, G, S, K]
    assert gqa["cache_shard"] == [gqa["cache_shape"][0] // 4, gqa["cache_shape"][1] // 2, *gqa["cache_shape"][2:]]
    assert mla["cache_spec"] == [["data", "fsdp"], None, None]  # the latent: by batch only
    assert gqa["q_spec"][1] == "tensor" and mla["q_spec"][1] == "tensor"  # heads split


# The multi-host run of the README ("Several hosts"): these arguments, on 2 processes of 4 devices.
MULTIHOST_ARGS = ("--config.train.steps=3", "--config.train.batch_size=16", "--config.train.seq_len=16",
                  "--config.train.log_every=1", "--config.train.eval_every=3", "--config.train.checkpoint_every=3",
                  "--config.train.sample_tokens=8", "--config.mesh.fsdp=2", "--config.mesh.tensor=2")


@pytest.mark.slow
def test_two_processes_train_as_one_with_eight_devices(tmp_path):
    """2 processes x 4 simulated CPU devices over one 2x2x2 mesh (JAX's distributed runtime, a local
    coordinator, gloo collectives) train and save a checkpoint; the losses equal one process's with 8."""
    one = tmp_path / "one"
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    out = subprocess.run(train_cmd(one, *MULTIHOST_ARGS), capture_output=True, text=True, env=env, cwd=ROOT,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]

    two = tmp_path / "two"
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    procs = [
        subprocess.Popen(train_cmd(two, *MULTIHOST_ARGS), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         cwd=ROOT, env=dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
                                            JAX_PLATFORMS="cpu",
                                            JAX_COORDINATOR_ADDRESS=f"localhost:{port}", JAX_NUM_PROCESSES="2",
                                            JAX_PROCESS_ID=str(i)))
        for i in range(2)
    ]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (stdout, stderr) in zip(procs, outs):
        assert p.returncode == 0, stderr[-3000:]
    assert "8 device(s), mesh {'data': 2, 'fsdp': 2, 'tensor': 2}" in outs[0][0]
    assert "no sample in a multi-host run" in outs[0][0] and "--- sample ---" in out.stdout
    assert sorted(os.listdir(two / "checkpoints")) == ["3"]
    np.testing.assert_allclose(list(losses(two).values()), list(losses(one).values()), rtol=RTOL)
    assert list(losses(two)) == [1, 2, 3]
    with open(os.path.join(ROOT, "README.md")) as f:  # the README gives these exact commands
        assert " ".join(MULTIHOST_ARGS) in f.read()
