"""`auto` execution settings: the compute dtype and attention path chosen for the backend JAX runs on.

A config may leave ModelConfig.dtype and ModelConfig.attention_impl as 'auto' (the named configs in
configs/ do); `resolve_auto` replaces them once, at start-up, by CHOICES[backend]. The parameters stay
float32 whatever the compute dtype (model/linear.py casts them per use). On a CPU bfloat16 gains
nothing (XLA:CPU computes it in float32 and converts), and the reference einsum path is the one the
tests check against.

    resolved = resolve_auto(cfg)               # on jax.default_backend()
    resolved = resolve_auto(cfg, "gpu", 256)   # as on a GPU, for a training length of 256
    resolved.cfg                               # no field left 'auto'
    resolved.describe()                        # "dtype bfloat16, attention cudnn (auto on gpu)"
"""

from __future__ import annotations

import dataclasses

import jax

from transformer.model.config import AUTO, ModelConfig

AUTO_FIELDS = ("dtype", "attention_impl")  # the ModelConfig fields that accept 'auto'
CHOICES = {  # backend -> what 'auto' becomes there
    "gpu": {"dtype": "bfloat16", "attention_impl": "cudnn"},  # xla where cuDNN's fused attention cannot run the model
    "tpu": {"dtype": "bfloat16", "attention_impl": "xla"},
    "cpu": {"dtype": "float32", "attention_impl": "reference"},
}
# cuDNN's fused (flash) attention takes head widths that are multiples of 8, up to 128 before the
# Hopper generation (256 from Hopper on); 128 holds on every GPU that runs it.
CUDNN_MAX_HEAD_DIM = 128


@dataclasses.dataclass(frozen=True)
class Resolved:
    """A ModelConfig with its 'auto' fields chosen, and how they were chosen."""

    cfg: ModelConfig  # no field is 'auto'
    backend: str  # the backend they were chosen for
    auto: tuple[str, ...]  # the fields that were 'auto' (empty: nothing was chosen)
    note: str = ""  # why a choice is not the backend's usual one, or ""

    def describe(self) -> str:
        """The execution settings in words, for the start-up line."""
        text = f"dtype {self.cfg.dtype}, attention {self.cfg.attention_impl}"
        if self.auto:
            text += f" ({' and '.join(self.auto)} auto on {self.backend}{'; ' + self.note if self.note else ''})"
        return text


def resolve_auto(cfg: ModelConfig, backend: str | None = None, seq_len: int | None = None) -> Resolved:
    """`cfg` with dtype and attention_impl chosen for `backend` where they are 'auto'.

    backend: 'gpu', 'tpu' or 'cpu' (default: jax.default_backend()); another name gets the CPU's
    choices. seq_len: the training sequence length, if known (cuDNN needs it even)."""
    backend = backend or jax.default_backend()
    auto = tuple(name for name in AUTO_FIELDS if getattr(cfg, name) == AUTO)
    if not auto:
        return Resolved(cfg, backend, ())
    note = ""
    if backend not in CHOICES:
        note = f"backend {backend!r} is not gpu, tpu or cpu: the CPU's choices"
    choices = {name: CHOICES.get(backend, CHOICES["cpu"])[name] for name in auto}
    if choices.get("attention_impl", "reference") != "reference" and (cfg.attention_sink or cfg.attn_softcap):
        choices["attention_impl"] = "reference"
        note = "reference attention: the fused paths have no sink logit and no soft-cap"
    if choices.get("attention_impl") == "cudnn":
        why = cudnn_cannot_run(cfg, choices.get("dtype", cfg.dtype), seq_len)
        if why:
            choices["attention_impl"] = "xla"
            note = f"xla, not cudnn: {why}"
    return Resolved(cfg.replace(**choices), backend, auto, note)


def cudnn_cannot_run(cfg: ModelConfig, dtype: str, seq_len: int | None = None) -> str:
    """Why cuDNN's fused attention cannot run this model's training forward and backward, or ""
    (the constraints jax.nn.dot_product_attention(implementation='cudnn') checks)."""
    if dtype not in ("bfloat16", "float16"):
        return f"it runs in bfloat16 or float16, not {dtype}"
    # The head width attention sees; MLA pads q, k and v to the widest.
    width = max(cfg.head_dim + (cfg.rope_head_dim or 0), cfg.v_head_dim) if cfg.attention == "mla" else cfg.head_dim
    if width % 8 or width > CUDNN_MAX_HEAD_DIM:
        return f"it needs a head width that is a multiple of 8 and at most {CUDNN_MAX_HEAD_DIM}, not {width}"
    if seq_len is not None and seq_len % 2:
        return f"it needs an even sequence length with a mask, not {seq_len}"
    return ""
