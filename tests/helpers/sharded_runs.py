"""Run in its own process with 8 simulated CPU devices (XLA_FLAGS is set before JAX is imported):
training, checkpointing and decoding of tiny models on several meshes, for tests/test_sharding.py.

    python tests/helpers/sharded_runs.py losses '{"mha": ["2x2x2"]}'  # each variant on its meshes: losses, shardings
    python tests/helpers/sharded_runs.py checkpoint   # save on one mesh, resume on another
    python tests/helpers/sharded_runs.py decode       # greedy tokens on 1 device and on 2x2x2
    python tests/helpers/sharded_runs.py muon '["2x2x2"]'  # optim.name='muon': losses and Muon's momentum layout

Prints one JSON line; the test asserts on it.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile

# 8 devices; LLVM at optimisation level 0 compiles these tiny steps faster (compiling dominates).
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
                           " --xla_backend_optimization_level=0")
os.environ["JAX_PLATFORMS"] = "cpu"  # simulated CPU devices, also on a machine with an accelerator

import jax  # noqa: E402
import numpy as np  # noqa: E402

from transformer import training  # noqa: E402
from transformer.run.checkpoint import Checkpointer  # noqa: E402
from transformer.model.config import ModelConfig  # noqa: E402
from transformer.training.optimizer import make_optimizer  # noqa: E402
from transformer.sampling.sampler import SamplingOptions, generate, prefill, row_keys  # noqa: E402
from transformer.training.sharding import axis_rules, batch_sharding, make_mesh, make_rules, state_sharding  # noqa: E402
from transformer.data.tokenizer import make_tokenizer  # noqa: E402

OPTIM = dict(learning_rate=3e-3, warmup_steps=2, min_lr_ratio=0.1, b1=0.9, b2=0.99, eps=1e-8,
             weight_decay=0.1, decay_embeddings=False, grad_clip=1.0)
# Sizes every mesh below divides: 8 query heads, d_model 64, MLP 128, vocabulary 64.
BASE = dict(vocab_size=64, max_seq_len=16, d_model=64, num_layers=2, num_heads=8, mlp_dim=128)
VARIANTS = {
    "mha": {},
    # 4 key/value heads: split by tensor 2 and 4, replicated (they do not divide) by tensor 8.
    "gqa": dict(num_kv_heads=4, position="rope", norm="rmsnorm", activation="swiglu", tie_embeddings=False),
    "mla": dict(attention="mla", kv_latent_dim=16, q_latent_dim=24, position="rope", rope_head_dim=4),
}
MESHES = {"8x1x1": (8, 1, 1), "1x8x1": (1, 8, 1), "1x1x8": (1, 1, 8), "2x2x2": (2, 2, 2), "1x2x4": (1, 2, 4)}
# Parameters whose sharding the test checks, by path under params (scanned layers: leading L axis).
WATCHED = ("embed/embedding", "layers/attn/q/kernel", "layers/attn/k/kernel", "layers/attn/o/kernel",
           "layers/attn/kv_down/kernel", "layers/attn/k_up", "layers/mlp/fc_in/kernel", "layers/mlp/up/kernel",
           "layers/mlp/fc_out/kernel", "layers/attn_norm/scale", "head/kernel")
BATCH, SEQ = 16, 16


def mesh_of(name: str):
    if name == "1":
        return make_mesh(devices=jax.devices()[:1])
    data, fsdp, tensor = MESHES[name]
    return make_mesh(data, fsdp, tensor)


def batch(step: int) -> tuple[np.ndarray, np.ndarray]:
    """The [B, T] inputs and targets of step `step` (the same on every mesh)."""
    x = np.random.default_rng(step).integers(0, BASE["vocab_size"], (BATCH, SEQ)).astype(np.int32)
    return x, np.roll(x, -1, 1)


def run_steps(cfg, mesh, state, tx, schedule, start: int, steps: int):
    """`steps` train steps from `start` on `mesh`: (state, losses)."""
    rules = make_rules(cfg, mesh)
    step = training.make_train_step(cfg, tx, schedule, mesh, state, rules=rules)
    put = lambda a: jax.device_put(a, batch_sharding(mesh, rules))  # noqa: E731
    losses = []
    for s in range(start, start + steps):
        x, y = batch(s)
        state, metrics = step(state, put(x), put(y))
        losses.append(float(metrics["loss"]))
    return state, losses


def fresh(cfg, mesh, steps: int, optim: dict = OPTIM):
    tx, schedule = make_optimizer(optim, steps)
    return training.create_state(cfg, tx, 0, mesh), tx, schedule


def layout(state) -> dict:
    """For each watched parameter: its PartitionSpec, its AdamW moments' specs, one device's shard shape."""
    adam = next(s for s in jax.tree.leaves(state.opt_state, is_leaf=lambda s: hasattr(s, "mu")) if hasattr(s, "mu"))
    out = {}
    for path, x in jax.tree_util.tree_leaves_with_path(state.params):
        name = "/".join(str(k.key) for k in path)
        if name not in WATCHED:
            continue
        moments = [_at(adam.mu, path), _at(adam.nu, path)]
        out[name] = {"spec": _spec(x), "moments": [_spec(m) for m in moments],
                     "shard": list(x.addressable_shards[0].data.shape), "shape": list(x.shape)}
    return out


def _at(tree, path):
    for k in path:
        tree = tree[k.key]
    return tree


def _spec(x) -> list:
    """A PartitionSpec as JSON: one entry per dimension, None / axis name / list of names."""
    spec = list(x.sharding.spec) + [None] * (x.ndim - len(x.sharding.spec))
    return [list(s) if isinstance(s, tuple) else s for s in spec]


def forward_all_reduces(cfg) -> list[str]:
    """The shapes of the all-reduces in the compiled eval step (forward and loss) on the 1x1x8 mesh;
    the scanned layer's body appears once in the program."""
    mesh = mesh_of("1x1x8")
    state = jax.eval_shape(lambda: fresh(cfg, mesh, OPTIM["warmup_steps"])[0])  # no shorter than the warm-up
    batch = jax.ShapeDtypeStruct((BATCH, SEQ), np.int32, sharding=batch_sharding(mesh, make_rules(cfg, mesh)))
    hlo = training.make_eval_step(cfg, mesh, state).lower(state.params, batch, batch).compile().as_text()
    return re.findall(r"= (\w+\[[\d,]*\])\S* all-reduce(?:-start)?\(", hlo)


def losses(meshes: dict[str, list[str]], steps: int = 3) -> dict:
    """Each variant on one device and on its meshes ({variant: [mesh name]}): losses and layouts; and
    the all-reduces of its forward on 1x1x8."""
    result = {}
    for variant, names in meshes.items():
        cfg = ModelConfig(**BASE, **VARIANTS[variant])
        result[f"{variant}/all_reduces"] = forward_all_reduces(cfg)
        if variant == "mha":  # the L = 2 layers unrolled: each its own collectives
            result["mha/all_reduces/unscanned"] = forward_all_reduces(cfg.replace(scan_layers=False))
        for name in ("1", *names):
            mesh = mesh_of(name)
            state, tx, schedule = fresh(cfg, mesh, steps)
            state, out = run_steps(cfg, mesh, state, tx, schedule, 0, steps)
            result[f"{variant}/{name}"] = {"losses": out, "layout": layout(state)}
    return result


def checkpoint(steps: int = 2) -> dict:
    """Save after `steps` on one mesh, resume on the other for `steps` more; and the unbroken run on
    the second mesh."""
    cfg = ModelConfig(**BASE, **VARIANTS["gqa"])
    result = {}
    for first, second in (("2x2x2", "1"), ("1", "2x2x2")):
        with tempfile.TemporaryDirectory() as workdir:
            state, tx, schedule = fresh(cfg, mesh_of(first), 2 * steps)
            state, before = run_steps(cfg, mesh_of(first), state, tx, schedule, 0, steps)
            ckpt = Checkpointer(workdir)
            ckpt.save(steps, state, {"model": cfg.to_dict()}, make_tokenizer("bytes"), val_loss=0.0)
            ckpt.wait()
            target, _, _ = fresh(cfg, mesh_of(second), 2 * steps)
            restored = ckpt.restore_state(target, cfg.to_dict())
            same_shardings = all(a.sharding == b.sharding for a, b in
                                 zip(jax.tree.leaves(restored), jax.tree.leaves(target), strict=True))
            restored_layout = layout(restored)  # before the steps: they donate the state
            _, after = run_steps(cfg, mesh_of(second), restored, tx, schedule, steps, steps)
        unbroken, tx, schedule = fresh(cfg, mesh_of(second), 2 * steps)
        _, whole = run_steps(cfg, mesh_of(second), unbroken, tx, schedule, 0, 2 * steps)
        result[f"{first}->{second}"] = {"resumed": before + after, "unbroken": whole,
                                        "restored_into_target_shardings": same_shardings,
                                        "restored_layout": restored_layout}
    return result


def muon(meshes: list[str], steps: int = 3) -> dict:
    """GQA with optim.name='muon' on one device and on `meshes`: the losses, and the specs of W_q and
    of its Muon momentum."""
    optim = dict(OPTIM, name="muon", muon_learning_rate=0.02, muon_momentum=0.95, muon_weight_decay=0.0)
    cfg = ModelConfig(**BASE, **VARIANTS["gqa"])
    result = {}
    for name in ("1", *meshes):
        state, tx, schedule = fresh(cfg, mesh_of(name), steps, optim)
        state, out = run_steps(cfg, mesh_of(name), state, tx, schedule, 0, steps)
        momentum = state.opt_state[1].inner_states["muon"].inner_state[0].mu
        result[name] = {"losses": out, "q_spec": _spec(state.params["layers"]["attn"]["q"]["kernel"]),
                        "q_momentum_spec": _spec(momentum["layers"]["attn"]["q"]["kernel"])}
    return result


def decode() -> dict:
    """Greedy tokens from random parameters on 1 device, and with the parameters and cache on 2x2x2."""
    result = {}
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10]]  # 4 rows: split over data x fsdp = 4
    for variant in ("gqa", "mla"):
        cfg = ModelConfig(**BASE, **VARIANTS[variant])
        # Weights 8x the initialiser's scale (std 0.16), so greedy tokens depend on the whole context.
        params = jax.tree_util.tree_map_with_path(
            lambda path, p: p * 8 if path[-1].key in ("kernel", "embedding", "k_up", "v_up") else p,
            training.init_params(cfg, jax.random.key(0)),
        )
        one = generate(params, cfg, prompts, jax.random.key(1), max_new_tokens=8, temperature=0.0)
        mesh = mesh_of("2x2x2")
        rules = make_rules(cfg, mesh)
        sharded = jax.device_put(params, state_sharding(params, mesh, rules))
        with axis_rules(mesh, rules):
            out = generate(sharded, cfg, prompts, jax.random.key(1), max_new_tokens=8, temperature=0.0)
            # The prefill generate just ran (same shapes and options: jit's cached trace), to read its cache.
            tokens = np.zeros((4, 16), np.int32)  # prompts right-padded to the 16-slot bucket
            for b, row in enumerate(prompts):
                tokens[b, : len(row)] = row
            lengths = np.array([len(row) for row in prompts], np.int32)
            state = prefill(sharded, cfg, tokens, lengths, row_keys(jax.random.key(1), 4), 16,
                            SamplingOptions(temperature=0.0))
        cache = jax.tree.leaves(state.cache)[0]
        result[variant] = {"one": one.tokens.tolist(), "sharded": out.tokens.tolist(),
                           "cache_spec": _spec(cache), "cache_shard": list(cache.addressable_shards[0].data.shape),
                           "cache_shape": list(cache.shape),
                           "q_spec": _spec(sharded["layers"]["attn"]["q" if variant == "gqa" else "q_up"]["kernel"])}
    return result


if __name__ == "__main__":
    assert jax.device_count() == 8, jax.devices()
    what = {"losses": losses, "checkpoint": checkpoint, "decode": decode, "muon": muon}[sys.argv[1]]
    print(json.dumps(what(*map(json.loads, sys.argv[2:]))))  # the arguments, if any, as JSON
