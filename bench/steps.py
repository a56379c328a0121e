"""What the benchmarks time: the library's own steps, set up as train.py and sample.py set them up,
on one device, with random weights and no corpus; and the same architecture in PyTorch.

    run = train_setup(config, scan_layers=True)         # cfg, mesh, state, jitted train step, ...
    run = train_setup(config, abstract=True)            # shapes only: lower and compile, allocate nothing
    cfg = model_config(config.model, max_seq_len=256)   # a config file's model with fields changed
    state = decode_start(cfg, params, batch, prompt_len, cache_len)  # after a prefill of random prompts
    model = torch_gpt2(cfg)                             # Hugging Face GPT2LMHeadModel, random weights
    optimizer = torch_adamw(model, config.optim)        # AdamW with optim.py's decay groups
    loss = torch_train_step(model, optimizer, inputs, targets, grad_clip=1.0)  # one step, as ours

Random weights come from transformer.training.steps.init_params (key 0), as a new run's do.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from ml_collections import ConfigDict

from transformer import sampling, training
from transformer.model.execution import resolve_auto
from transformer.data.batches import IGNORED
from transformer.model.config import ModelConfig
from transformer.model.decoder import count_params
from transformer.training.optimizer import make_optimizer
from transformer.training.sharding import batch_sharding, make_mesh

GREEDY = sampling.SamplingOptions(temperature=0.0)


def model_config(model: ConfigDict, **overrides) -> ModelConfig:
    """A config file's `model` section as a ModelConfig, with `overrides` (ModelConfig fields) changed
    and its 'auto' fields chosen for this backend, as train.py chooses them (float32 on a CPU)."""
    return resolve_auto(ModelConfig.from_dict({**model.to_dict(), **overrides})).cfg


@dataclasses.dataclass
class TrainSetup:
    """One config's train step on a mesh (default one device), built by the library as train.py builds it."""

    cfg: ModelConfig
    mesh: Mesh
    state: Any  # training.TrainState, or its jax.ShapeDtypeStructs when abstract
    step: Any  # training.make_train_step: (state, inputs, targets) -> (state, metrics), state donated
    batch: jax.ShapeDtypeStruct  # the shape, dtype and sharding of one [B, T] batch
    num_params: int
    flops_per_token: float

    def lower(self):
        """The train step traced and lowered for `batch` (call .compile() on it)."""
        return self.step.lower(self.state, self.batch, self.batch)


def train_setup(config: ConfigDict, abstract: bool = False, mesh: Mesh | None = None,
                **model_overrides) -> TrainSetup:
    """The train step of `config` (its model with `model_overrides`), its optimizer and train state.

    abstract: the state is shapes only (jax.eval_shape), for lowering and compiling the step without
    allocating or running anything. mesh: where the step runs (default: one device), with the
    default rules (sharding.make_rules).
    """
    cfg = model_config(config.model, **model_overrides)
    t = config.train
    mesh = make_mesh(devices=jax.devices()[:1]) if mesh is None else mesh
    tx, schedule = make_optimizer(config.optim, t.steps)
    create = lambda: training.create_state(cfg, tx, t.seed, mesh)  # noqa: E731
    state = jax.eval_shape(create) if abstract else create()
    num_params = count_params(state.params)
    return TrainSetup(
        cfg=cfg, mesh=mesh, state=state, step=training.make_train_step(cfg, tx, schedule, mesh, state),
        batch=jax.ShapeDtypeStruct((t.batch_size, t.seq_len), jnp.int32, sharding=batch_sharding(mesh)),
        num_params=num_params, flops_per_token=training.flops_per_token(cfg, num_params, t.seq_len),
    )


def random_params(cfg: ModelConfig) -> dict:
    """Randomly initialised float32 parameters, ready (training.init_params, key 0)."""
    return jax.block_until_ready(training.init_params(cfg, jax.random.key(0)))


def decode_start(cfg: ModelConfig, params: dict, batch: int, prompt_len: int, cache_len: int):
    """The greedy decode state after sampling.prefill of random prompts [batch, prompt_len]."""
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (batch, prompt_len), dtype=np.int32)
    lengths = np.full((batch,), prompt_len, np.int32)
    keys = sampling.row_keys(jax.random.key(0), batch)
    return sampling.prefill(params, cfg, tokens, lengths, keys, cache_len, GREEDY)


# What GPT2LMHeadModel builds; a ModelConfig field with another value has no counterpart there.
GPT2_SHAPE = dict(position="learned", norm="layernorm", norm_scale=True, norm_bias=True, prenorm=True,
                  use_bias=True, attention="mha", attention_sink=False, num_registers=0)


def torch_gpt2(cfg: ModelConfig):
    """This architecture as a Hugging Face GPT2LMHeadModel with random weights (float32, dropout 0,
    its default attention, tied embeddings as cfg has them); the caller sets .train() or .eval().

    Raises ValueError for an architecture GPT-2 cannot express (GPT2_SHAPE, multi-head attention with
    H x d_h = d_model, an MLP with gelu, gelu_tanh or relu).
    """
    from transformers import GPT2Config, GPT2LMHeadModel

    other = {name: getattr(cfg, name) for name, value in GPT2_SHAPE.items() if getattr(cfg, name) != value}
    if cfg.num_kv_heads != cfg.num_heads or cfg.head_dim * cfg.num_heads != cfg.d_model:
        other["num_kv_heads, head_dim"] = (cfg.num_kv_heads, cfg.head_dim)
    if cfg.activation == "swiglu" or cfg.mlp_dim == 0:
        other["activation, mlp_dim"] = (cfg.activation, cfg.mlp_dim)
    if other:
        raise ValueError(f"GPT2LMHeadModel has no counterpart for {other}; the PyTorch GPT-2 needs "
                         f"{GPT2_SHAPE}, num_kv_heads = num_heads, head_dim = d_model / num_heads and an "
                         "MLP with activation gelu, gelu_tanh or relu")

    activation = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu"}[cfg.activation]
    return GPT2LMHeadModel(GPT2Config(
        vocab_size=cfg.vocab_size, n_positions=cfg.max_seq_len, n_embd=cfg.d_model, n_layer=cfg.num_layers,
        n_head=cfg.num_heads, n_inner=cfg.mlp_dim, activation_function=activation,
        layer_norm_epsilon=cfg.norm_eps, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        tie_word_embeddings=cfg.tie_embeddings, bos_token_id=None, eos_token_id=None,
    ))


def torch_adamw(model, optim: Mapping[str, Any]):
    """torch.optim.AdamW over `model`'s parameters with optim's learning_rate, betas, eps and weight
    decay, which (as transformer.training.optimizer.decay_mask) falls on the projection matrices, on the embedding
    tables only with optim.decay_embeddings, never on norm gains or biases."""
    import torch

    def decays(name: str, p) -> bool:
        embedding = "wte" in name or "wpe" in name
        return p.dim() >= 2 and (optim["decay_embeddings"] or not embedding)

    named = list(model.named_parameters())  # a tied lm_head is the token embedding: listed once
    return torch.optim.AdamW(
        [{"params": [p for n, p in named if decays(n, p)], "weight_decay": optim["weight_decay"]},
         {"params": [p for n, p in named if not decays(n, p)], "weight_decay": 0.0}],
        lr=optim["learning_rate"], betas=(optim["b1"], optim["b2"]), eps=optim["eps"],
    )


def torch_loss(model, inputs, targets):
    """Mean cross-entropy of `model` on int64 tensors inputs, targets [B, T] (IGNORED targets left out,
    as transformer.training.loss does): a scalar tensor."""
    import torch.nn.functional as F

    logits = model(inputs).logits  # [B, T, V]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORED)


def torch_train_step(model, optimizer, inputs, targets, grad_clip: float):
    """One training step as ours takes it: loss, backward, global-norm clipping (grad_clip > 0),
    the optimizer's update; returns the loss before the update (a detached scalar tensor)."""
    import torch

    loss = torch_loss(model, inputs, targets)
    loss.backward()
    if grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()
