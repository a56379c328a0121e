"""ModelConfig: every architectural choice of the decoder, in one frozen dataclass, checked when made:
a wrong field fails here, naming the field and the fix, not as a shape error inside a jitted function."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from transformer.model.positions import SCHEMES

CHOICES = {
    "activation": ("gelu", "gelu_tanh", "relu", "relu2", "swiglu", "geglu"),
    "position": tuple(SCHEMES),  # model/positions.py
    "norm": ("layernorm", "rmsnorm"),
    "attention": ("mha", "mla"),
    "dtype": ("float32", "bfloat16", "float16", "auto"),
    "attention_impl": ("reference", "xla", "cudnn", "auto"),
    "inputs": ("tokens", "table", "image", "image_text"),
    "mask": ("causal", "bidirectional"),
    "pool": ("cls", "mean"),
}
# A value chosen at start-up from the backend JAX runs on (transformer/model/execution.py: resolve_auto).
AUTO = "auto"


# How the parameters start, not what they mean: only a random init reads them, so a checkpoint or an
# imported model resumes, samples and fine-tunes with any value.
INIT_FIELDS = ("zero_init_out", "zero_init_head")
# How the parameters are computed with, not what they mean: a checkpoint trained with one setting
# resumes, samples and fine-tunes with another (scan_layers changes the parameters' layout, which
# resuming converts; load_balance_coef is a term of the training loss, as dropout is a training noise).
EXECUTION_FIELDS = ("dropout", "dtype", "attention_impl", "scan_layers", "remat", "load_balance_coef")
_NOT_ARCHITECTURE = INIT_FIELDS + EXECUTION_FIELDS
# Fields whose None means "derived from other fields"; `replace` derives them again.
DERIVED_FIELDS = ("num_kv_heads", "head_dim", "mlp_dim", "v_head_dim")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of a decoder-only transformer; each field's comment says what it does.

    Three groups: the architecture (what the parameters mean), INIT_FIELDS and EXECUTION_FIELDS. None
    fields are derived (DERIVED_FIELDS), again by `replace`: cfg.replace(d_model=128) doubles mlp_dim.
    """

    vocab_size: int
    max_seq_len: int
    d_model: int
    num_layers: int
    num_heads: int
    num_kv_heads: int | None = None  # None: = num_heads (multi-head attention)
    head_dim: int | None = None  # None: d_model // num_heads
    mlp_dim: int | None = None  # None: 4 * d_model; 0: no MLP (attention-only blocks)
    activation: str = "gelu"
    position: str = "learned"
    rope_theta: float = 10000.0
    norm: str = "layernorm"
    norm_scale: bool = True  # learned gain in each norm
    norm_bias: bool = True  # learned bias in each layer norm (RMSNorm has none)
    norm_eps: float = 1e-5
    prenorm: bool = True  # x + f(norm(x)); False: norm(x + f(x)) (post-norm)
    use_bias: bool = True  # biases in the attention and MLP projections
    tie_embeddings: bool = True  # logits use the token embedding matrix
    attention: str = "mha"
    kv_latent_dim: int | None = None  # MLA: width C of the cached key/value latent
    q_latent_dim: int | None = None  # MLA: width of the query latent (None: no query latent)
    rope_head_dim: int | None = None  # MLA with RoPE: width of the decoupled rotary part
    v_head_dim: int | None = None  # MLA: value head width (None: head_dim)
    attention_sink: bool = False  # a learned logit per head that joins every softmax row, with no value
    num_registers: int = 0  # learned register tokens placed before every sequence (no logits, no loss)
    attention_window: int = 0  # W > 0: a query sees itself and the W - 1 tokens before it (Mistral); 0: all
    global_every: int = 0  # k > 0 (with a window): every k-th layer (k-1, 2k-1, ...) attends to all; 0: none
    qk_norm: bool = False  # RMSNorm over K of each head's q and k, before RoPE (MHA / GQA / MQA)
    logit_softcap: float = 0.0  # > 0: logits = c * tanh(logits / c) in float32; 0: off
    inputs: str = "tokens"  # 'tokens': ids [B, T] -> vocabulary logits; 'table': rows [B, T, F + 1] -> class logits
    num_features: int = 0  # inputs='table': F, the features a row holds (a table with fewer is zero-padded)
    num_classes: int = 0  # inputs='table': C, the class head's width (vocab_size is then unused)
    # --- Gemma 2 / 3 (activation='geglu': the gated MLP with tanh GELU), also for training from scratch ---
    norm_unit_offset: bool = False  # every norm's gain is 1 + w, w starting at 0 (Gemma's RMSNorm)
    sublayer_out_norm: bool = False  # pre-norm: x + norm(f(norm(x))), a norm after each sublayer too (4 per block)
    embed_scale: bool = False  # the token embeddings times sqrt(d_model), in the compute dtype (not the tied head's)
    attn_scale_dim: float = 0.0  # > 0: scores q.k / sqrt(attn_scale_dim) (query_pre_attn_scalar); 0: / sqrt(head_dim)
    attn_softcap: float = 0.0  # > 0: each attention logit s -> c tanh(s / c) before the mask (Gemma 2); 0: off
    rope_local_theta: float = 0.0  # > 0: the RoPE base of the windowed layers (Gemma 3); 0: rope_theta in all
    # --- mixture of experts (model/moe.py): E > 0 replaces every layer's MLP by E SwiGLU experts of width mlp_dim ---
    num_experts: int = 0  # E; 0: a dense MLP
    experts_per_token: int = 2  # k: each token goes to the k experts of largest router probability
    renormalize_top_k: bool = True  # the k weights divided by their sum (Mixtral; Qwen3-MoE's norm_topk_prob)
    load_balance_coef: float = 0.01  # EXECUTION_FIELDS: the training loss adds this x the Switch balancing loss
    # --- initialisation (INIT_FIELDS): how a random init starts the parameters ---
    zero_init_out: bool = False  # W_o and the MLP's fc_out start at zero (each block starts as the identity)
    zero_init_head: bool = False  # the untied head starts at zero (uniform first logits); needs tie_embeddings=False
    # --- execution (EXECUTION_FIELDS): changing these keeps the parameters' meaning ---
    dropout: float = 0.0
    dtype: str = "float32"  # compute dtype; parameters stay float32; 'auto': per backend
    attention_impl: str = "reference"  # 'xla' / 'cudnn': jax.nn.dot_product_attention; 'auto': per backend
    scan_layers: bool = True  # stack the layers with nn.scan (fast compile for deep models)
    remat: bool = False  # recompute each layer's activations in the backward pass
    # --- the mask kind and images (model/image.py: a ViT); num_classes is the class head's width ---
    mask: str = "causal"  # 'bidirectional': every query sees every key of its call (one pass, no cache)
    image_size: int = 0  # inputs='image': H = W, the pixels per side of images [B, H, W, C]
    patch_size: int = 0  # P: an image is cut into (H / P)^2 patches of P x P pixels, each a token
    channels: int = 0  # C, the colour channels of an image
    cls_token: bool = False  # a learned [CLS] token before the patches
    pool: str = "cls"  # what the class head reads: the [CLS] token ('cls') or the patch tokens' mean ('mean')
    # --- cross-attention (inputs='image_text'): the blocks also read an encoder's output tokens e [B, S, D_e] ---
    cross_attention: bool = False  # each block: x = x + cross(norm(x), e) between attention and MLP (post-norm alike)
    encoder: Any = None  # the encoder's ModelConfig, or its fields as a mapping (a ViT: inputs='image'); None: none
    # Which DERIVED_FIELDS were given as None (filled by __post_init__); not a config field.
    derived: frozenset = dataclasses.field(default=frozenset(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "derived", frozenset(f for f in DERIVED_FIELDS if getattr(self, f) is None))
        for name, choices in CHOICES.items():
            _check(getattr(self, name) in choices, f".{name}={getattr(self, name)!r} is not a known choice; "
                   f"use one of {', '.join(map(repr, choices))}")
        for name in ("vocab_size", "max_seq_len", "d_model", "num_layers", "num_heads"):
            _positive(name, getattr(self, name))
        self._fill_derived()
        for name in ("num_kv_heads", "head_dim"):
            _positive(name, getattr(self, name))
        _check(_is_count(self.mlp_dim), f".mlp_dim must be a positive integer, or 0 for no MLP; got {self.mlp_dim!r}")
        _check(self.num_heads % self.num_kv_heads == 0, f": num_heads={self.num_heads} is not divisible by "
               f"num_kv_heads={self.num_kv_heads}; each key/value head serves the same number of query heads, so "
               "choose num_kv_heads dividing num_heads")
        _check(0.0 <= self.dropout < 1.0, f".dropout={self.dropout} must be in [0, 1)")
        for name in ("norm_eps", "rope_theta"):  # NaN fails the comparison too
            _check(0 < getattr(self, name) < float("inf"), f".{name}={getattr(self, name)} must be positive and finite")
        _check(self.position != "sinusoidal" or self.d_model % 2 == 0,
               f": sinusoidal positions need an even d_model, got {self.d_model}")
        _check(self.attention_impl != "cudnn" or self.dtype in ("bfloat16", "float16", AUTO),
               f": attention_impl='cudnn' (cuDNN's fused attention) runs in bfloat16 or float16, not {self.dtype}; "
               f"set dtype='bfloat16', or attention_impl='xla' for {self.dtype}")
        self._check_sinks_and_windows()
        self._check_recipe()
        self._check_table()
        self._check_image()
        self._check_experts()
        self._check_cross()
        self._check_mla() if self.attention == "mla" else self._check_mha()

    def _fill_derived(self) -> None:
        """G = H, K = D / H and F = 4 D where left None (MLA's v_head_dim: `_check_mla`)."""
        if self.num_kv_heads is None:
            object.__setattr__(self, "num_kv_heads", self.num_heads)
        if self.head_dim is None:
            _check(self.d_model % self.num_heads == 0, f": d_model={self.d_model} is not divisible by num_heads="
                   f"{self.num_heads}; choose num_heads dividing d_model or set head_dim")
            object.__setattr__(self, "head_dim", self.d_model // self.num_heads)
        if self.mlp_dim is None:
            object.__setattr__(self, "mlp_dim", 4 * self.d_model)

    def _check_sinks_and_windows(self) -> None:
        _flag("attention_sink", self.attention_sink)
        _check(_is_count(self.num_registers), ".num_registers must be an integer >= 0 (0: no registers), got "
               f"{self.num_registers!r}")
        _check(not (self.attention_sink and self.attention_impl in ("xla", "cudnn")),
               ": attention_sink=True needs attention_impl='reference' (or 'auto', which chooses it; got "
               f"{self.attention_impl!r}): jax.nn.dot_product_attention has no sink logit")
        for name in ("attention_window", "global_every"):
            value = getattr(self, name)
            _check(_is_count(value), f".{name} must be an integer >= 0 (0: off), got {value!r}")
        _check(not self.global_every or self.attention_window, f": global_every={self.global_every} interleaves "
               "global layers with windowed ones, but attention_window=0 (no window): set attention_window=W > 0, "
               "or global_every=0")
        _check(self.global_every != 1, ": global_every=1 makes every layer global, so the window is never used; "
               "set attention_window=0 for full attention, or global_every >= 2 for local layers between global ones")
        _check(not (self.attention_window and self.num_registers), f": num_registers={self.num_registers} with "
               f"attention_window={self.attention_window} is not implemented: registers sit before position 0, "
               "outside every window past the first W tokens; use attention_sink=True (a learned sink every row "
               "sees) or num_registers=0")

    def layer_windows(self) -> tuple[int | None, ...]:
        """Each layer's window, W (at most max_seq_len: no longer ring) or None for a global layer (every
        layer without a window; with global_every=k, layers k-1, 2k-1, ...)."""
        w, k = min(self.attention_window, self.max_seq_len), self.global_every
        return tuple(None if not w or (k and (i + 1) % k == 0) else w for i in range(self.num_layers))

    def _check_recipe(self) -> None:
        for name in ("qk_norm", "zero_init_out", "zero_init_head", "norm_unit_offset", "sublayer_out_norm",
                     "embed_scale"):
            _flag(name, getattr(self, name))
        cap = "the cap c of c * tanh(logits / c); 0: no cap"
        for name, meaning in (("logit_softcap", cap), ("attn_softcap", cap), ("rope_local_theta", "0: rope_theta"),
                              ("attn_scale_dim", "the d of q.k / sqrt(d); 0: head_dim")):
            c = getattr(self, name)
            _check(not isinstance(c, bool) and isinstance(c, (int, float)) and 0.0 <= c < float("inf"),
                   f".{name} must be a finite number >= 0 ({meaning}), got {c!r}")
        self._check_gemma()
        _check(not (self.qk_norm and self.attention == "mla"), ": qk_norm=True is implemented for attention='mha' "
               "only: MLA decodes by scoring queries against the cached latent through W_UK (absorbed), which a "
               "norm of the up-projected keys would break; MLA already normalises its latents (kv_norm, q_norm). "
               "Set qk_norm=False or attention='mha'")
        _check(not (self.zero_init_head and self.tie_embeddings), ": zero_init_head=True needs an untied head "
               "(tie_embeddings=False): tied logits use the token embedding matrix, which must not start at zero")

    def _check_gemma(self) -> None:
        """Gemma's options need what they act on: a gain, pre-norm, RoPE with windows, MHA / GQA's scores."""
        _check(not (self.norm_unit_offset and not self.norm_scale), ": norm_unit_offset=True offsets the norms' "
               "gain, but norm_scale=False leaves them none; set norm_scale=True")
        _check(self.prenorm or not self.sublayer_out_norm, ": sublayer_out_norm=True adds a norm after each "
               "pre-norm sublayer; with prenorm=False the norm already follows it: set prenorm=True")
        _check(not self.rope_local_theta or (self.position == "rope" and self.attention_window), ": rope_local_theta="
               f"{self.rope_local_theta} is the RoPE base of the windowed layers: set position='rope' and "
               "attention_window=W > 0, or rope_local_theta=0")
        _check(not (self.attn_softcap and self.attention_impl in ("xla", "cudnn")), ": attn_softcap > 0 needs "
               f"attention_impl='reference' (or 'auto'; got {self.attention_impl!r}): the fused paths do not cap")
        mla = [f"{k}={getattr(self, k)}" for k in ("attn_scale_dim", "attn_softcap", "rope_local_theta")
               if getattr(self, k) and self.attention == "mla"]
        _check(not mla, f": {', '.join(mla)} implemented for attention='mha' only; set them to 0")

    def _check_table(self) -> None:
        """inputs='table' needs F >= 1 and C >= 2, and none of the options that read token order or ids."""
        for name in ("num_features", "num_classes"):
            _check(_is_count(getattr(self, name)), f".{name} must be an integer >= 0, got {getattr(self, name)!r}")
        if self.inputs != "table":
            _check(not (self.num_features or (self.num_classes and self.inputs in ("tokens", "image_text"))), ": num_features and "
                   "num_classes are read with inputs='table' only (num_classes with 'image' too); set inputs='table' "
                   "or leave them 0")
            return
        _check(self.num_features >= 1 and self.num_classes >= 2, ": inputs='table' needs num_features >= 1 and "
               f"num_classes >= 2 (got {self.num_features} and {self.num_classes}): the widest table the model "
               "will read")
        refused = {"position": (self.position != "none", "a table's rows are a set: set position='none'"),
                   "tie_embeddings": (self.tie_embeddings, "rows have no token embedding to tie: set "
                                      "tie_embeddings=False"),
                   "num_registers": (self.num_registers, "set num_registers=0"),
                   "embed_scale": (self.embed_scale, "rows have no token embedding to scale: set embed_scale=False"),
                   "attention_window": (self.attention_window, "rows have no order to window: set attention_window=0")}
        for name, (bad, fix) in refused.items():
            _check(not bad, f": inputs='table' does not take {name}={getattr(self, name)!r}; {fix}")

    def _check_image(self) -> None:
        """inputs='image' needs a size that P divides, C >= 1 and >= 2 classes, the bidirectional mask, and
        none of the options that read token ids or a 1-D order; the image fields are read with images only."""
        image = ("image_size", "patch_size", "channels")
        for name in image:
            _check(_is_count(getattr(self, name)), f".{name} must be an integer >= 0, got {getattr(self, name)!r}")
        _flag("cls_token", self.cls_token)
        _check(not (self.mask == "bidirectional" and self.attention_window), ": mask='bidirectional' sees every "
               f"key, so attention_window={self.attention_window} (a causal band) does not apply; set it to 0")
        if self.inputs != "image":
            _check(not any(getattr(self, f) for f in image + ("cls_token",)), ": image_size, patch_size, channels "
                   "and cls_token are read with inputs='image' only; set inputs='image' or leave them 0 / False")
            return
        p, h = self.patch_size, self.image_size
        _check(p >= 1 and h >= 1 and self.channels >= 1 and self.num_classes >= 2, ": inputs='image' needs "
               f"image_size, patch_size, channels >= 1 and num_classes >= 2 (got {h}, {p}, {self.channels}, "
               f"{self.num_classes})")
        _check(h % p == 0, f": image_size={h} is not a multiple of patch_size={p}; choose a patch_size dividing it")
        refused = {"mask": (self.mask != "bidirectional", "every patch sees every patch: set mask='bidirectional'"),
                   "position": (self.position not in ("learned", "sinusoidal", "none"), "patches are placed by "
                                "learned, 2-D sinusoidal or no position embeddings: set one of those"),
                   "tie_embeddings": (self.tie_embeddings, "patches have no token embedding: set tie_embeddings=False"),
                   "embed_scale": (self.embed_scale, "patches have no token embedding: set embed_scale=False"),
                   "pool": (self.pool == "cls" and not self.cls_token, "set cls_token=True, or pool='mean'")}
        for name, (bad, fix) in refused.items():
            _check(not bad, f": inputs='image' does not take {name}={getattr(self, name)!r}; {fix}")
        _check(self.position != "sinusoidal" or self.d_model % 4 == 0, ": 2-D sinusoidal positions need d_model "
               f"divisible by 4 (half for the row, half for the column), got {self.d_model}")
        _check(self.max_seq_len >= self.image_tokens, f": max_seq_len={self.max_seq_len} is below the image's "
               f"{self.image_tokens} tokens ((image_size / patch_size)^2 patches + [CLS]); raise it")

    @property
    def image_tokens(self) -> int:
        """An image's tokens: N = (H / P)^2 patches, then one more with a [CLS] token (model/image.py)."""
        return (self.image_size // self.patch_size) ** 2 + self.cls_token

    def _check_experts(self) -> None:
        e, k, c = self.num_experts, self.experts_per_token, self.load_balance_coef
        _check(_is_count(e) and e != 1, f".num_experts must be 0 (a dense MLP) or an integer >= 2, got {e!r}")
        _flag("renormalize_top_k", self.renormalize_top_k)
        _check(not isinstance(c, bool) and isinstance(c, (int, float)) and 0 <= c < float("inf"),
               f".load_balance_coef must be a finite number >= 0, got {c!r}")
        if e:
            _check(_is_count(k) and 1 <= k <= e, f".experts_per_token={k!r} must be an integer in 1..num_experts={e}")
            _check(self.mlp_dim and self.activation == "swiglu", f": num_experts={e} needs activation='swiglu' and "
                   f"mlp_dim > 0 (each expert is a SwiGLU MLP of width mlp_dim), got {self.activation!r}, {self.mlp_dim}")

    def _check_cross(self) -> None:
        """cross_attention needs inputs='image_text', an encoder (its fields checked here, named
        ModelConfig.encoder.FIELD) and MHA / GQA; an encoder without cross-attention is unused."""
        _flag("cross_attention", self.cross_attention)
        needs = self.cross_attention or self.inputs == "image_text" or self.encoder is not None
        if not needs:
            return
        _check(self.cross_attention and self.inputs == "image_text" and self.encoder is not None, ": cross-attention "
               "needs all three of cross_attention=True, inputs='image_text' and an encoder (its fields, e.g. "
               f"encoder=dict(inputs='image', ...)); got cross_attention={self.cross_attention}, inputs="
               f"{self.inputs!r}, encoder={'set' if self.encoder is not None else None}")
        _check(self.attention == "mha", ": cross_attention=True is implemented for attention='mha' (and grouped "
               "queries) only; set attention='mha'")
        if not isinstance(self.encoder, ModelConfig):
            fields = self.encoder.to_dict() if hasattr(self.encoder, "to_dict") else self.encoder
            _check(isinstance(fields, Mapping), f".encoder must be a ModelConfig or a mapping of its fields, got "
                   f"{type(self.encoder).__name__}")
            try:
                object.__setattr__(self, "encoder", ModelConfig.from_dict(fields))
            except ValueError as error:  # its own one-line error, named as this config's field
                raise ValueError(str(error).replace("ModelConfig", "ModelConfig.encoder", 1)
                                 .replace("model config", "model.encoder config", 1)) from None
        _check(not self.encoder.cross_attention and self.encoder.inputs != "table", ".encoder reads an image or "
               "tokens on its own: it takes no cross_attention and no table (inputs='image' for a ViT)")

    def encoder_config(self) -> "ModelConfig":
        """The encoder's config computing as this model does (its dtype and attention_impl)."""
        return self.encoder.replace(dtype=self.dtype, attention_impl=self.attention_impl)

    @property
    def row_width(self) -> int:
        """A table row's input width, F + 1: the features, then the label (model/table.py)."""
        return self.num_features + 1

    def _check_mha(self) -> None:
        """MHA / GQA / MQA: no MLA field is set, and RoPE rotates pairs of the K features of a head."""
        for name in ("kv_latent_dim", "q_latent_dim", "rope_head_dim", "v_head_dim"):
            _check(getattr(self, name) is None, f".{name} is only used with attention='mla'; remove it or set "
                   "attention='mla'")
        _check(self.position != "rope" or self.head_dim % 2 == 0, ": RoPE rotates pairs of features, so head_dim "
               f"must be even; got head_dim={self.head_dim}")

    def _check_mla(self) -> None:
        _check(self.kv_latent_dim is not None, ": attention='mla' needs kv_latent_dim (the cached latent width)")
        _positive("kv_latent_dim", self.kv_latent_dim)
        if self.q_latent_dim is not None:
            _positive("q_latent_dim", self.q_latent_dim)
        _check(self.num_kv_heads == self.num_heads, ": MLA shares one latent across all heads, so num_kv_heads "
               f"does not apply; leave it unset (got num_kv_heads={self.num_kv_heads}, num_heads={self.num_heads})")
        if self.v_head_dim is None:
            object.__setattr__(self, "v_head_dim", self.head_dim)
        _positive("v_head_dim", self.v_head_dim)
        if self.position != "rope":
            _check(self.rope_head_dim is None, f".rope_head_dim is only used with position='rope' (got position="
                   f"{self.position!r}); remove it")
            return
        _check(self.rope_head_dim is not None, ": MLA with position='rope' needs rope_head_dim, the width of the "
               "decoupled rotary part of queries and of the shared rotary key")
        _positive("rope_head_dim", self.rope_head_dim)
        _check(self.rope_head_dim % 2 == 0, ": RoPE rotates pairs of features, so rope_head_dim must be even; "
               f"got {self.rope_head_dim}")

    def check_resolved(self) -> None:
        """Raises if dtype or attention_impl is still 'auto': a model computes with the values that
        execution.resolve_auto chooses for the backend at start-up."""
        unresolved = [f"{name}='auto'" for name in ("dtype", "attention_impl") if getattr(self, name) == AUTO]
        if unresolved:
            raise ValueError(
                f"ModelConfig.{' and '.join(unresolved)} is chosen per backend at start-up; build the model "
                "from transformer.model.execution.resolve_auto(cfg).cfg, or set a concrete value"
            )

    @property
    def kv_groups(self) -> int:
        """Query heads per key/value head, R = H // G."""
        return self.num_heads // self.num_kv_heads

    @classmethod
    def fields(cls) -> tuple[dataclasses.Field, ...]:
        """The config's fields (what a config file's `model` section holds)."""
        return tuple(f for f in dataclasses.fields(cls) if f.init)

    @classmethod
    def from_dict(cls, fields: Mapping[str, Any]) -> "ModelConfig":
        """Builds a ModelConfig from a mapping (e.g. a config file's `model` ConfigDict)."""
        fields = dict(fields)
        known = {f.name for f in cls.fields()}
        unknown = sorted(set(fields) - known)
        if unknown:
            raise ValueError(f"unknown model config field(s) {unknown}; known fields are {sorted(known)}")
        missing = sorted(f.name for f in cls.fields() if f.default is dataclasses.MISSING and f.name not in fields)
        if missing:
            raise ValueError(f"model config is missing required field(s) {missing}")
        return cls(**fields)

    def to_dict(self) -> dict[str, Any]:
        """All fields, with the derived defaults filled in (JSON-serialisable)."""
        return {f.name: getattr(self, f.name).to_dict() if isinstance(getattr(self, f.name), ModelConfig)
                else getattr(self, f.name) for f in self.fields()}

    def architecture(self) -> dict[str, Any]:
        """The fields that say what the parameters mean (all but INIT_FIELDS and EXECUTION_FIELDS)."""
        return {k: v for k, v in self.to_dict().items() if k not in _NOT_ARCHITECTURE}

    def differences(self, other: "ModelConfig") -> list[str]:
        """The names of the fields whose values differ between `self` and `other`, in field order."""
        mine, theirs = self.to_dict(), other.to_dict()
        return [k for k in mine if mine[k] != theirs[k]]

    def architecture_differences(self, other: "ModelConfig") -> list[str]:
        """The architecture fields that differ: empty when `other` gives the same parameters the same
        meaning (it may still start or compute them otherwise)."""
        return [k for k in self.differences(other) if k not in _NOT_ARCHITECTURE]

    def replace(self, **changes: Any) -> "ModelConfig":
        """A copy with some fields changed; derived fields that were never set are derived again."""
        fields = {k: v for k, v in self.to_dict().items() if k not in self.derived}
        return ModelConfig(**{**fields, **changes})


def _check(ok: Any, message: str) -> None:
    """Raises ValueError("ModelConfig" + message) unless `ok`: the message names the field and the fix."""
    if not ok:
        raise ValueError("ModelConfig" + message)


def _is_count(value: Any) -> bool:
    """An integer >= 0 (a bool or a float is no count)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _positive(name: str, value: Any) -> None:
    _check(_is_count(value) and value > 0, f".{name} must be a positive integer, got {value!r}")


def _flag(name: str, value: Any) -> None:
    _check(isinstance(value, bool), f".{name} must be True or False, got {value!r}")
