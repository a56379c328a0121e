"""Tests of transformer/model/config.py: validation messages name the problem and the fix, derived
defaults, config files."""

from __future__ import annotations

import dataclasses
import importlib
import pathlib

import jax
import pytest

from transformer.model.config import ModelConfig
from transformer.model.decoder import Decoder, example_input
from transformer.model.execution import resolve_auto

BASE = dict(vocab_size=64, max_seq_len=16, d_model=32, num_layers=2, num_heads=4)
MLA = dict(BASE, attention="mla", kv_latent_dim=16)
MLA_ROPE = dict(MLA, position="rope", rope_head_dim=4)

# Fragments shared by several messages.
POSITIVE = "must be a positive integer"
MLA_ONLY = "is only used with attention='mla'; remove it or set attention='mla'"
SOFTCAP = "must be a finite number >= 0 (the cap c of c * tanh(logits / c); 0: no cap)"
ROPE_PAIRS = "RoPE rotates pairs of features, so head_dim must be even"

INVALID = [
    # (fields, the problem the message names: field and value, the fix it names). Where a message names
    # only the rule the value breaks ("must be a positive integer"), the rule is the fix.
    (dict(BASE, d_model=30), "d_model=30 is not divisible by num_heads=4",
     "choose num_heads dividing d_model or set head_dim"),
    (dict(BASE, num_kv_heads=3), "num_heads=4 is not divisible by num_kv_heads=3",
     "choose num_kv_heads dividing num_heads"),
    (dict(BASE, d_model=28, position="rope"), "got head_dim=7", ROPE_PAIRS),  # head_dim derived: 28 / 4
    (dict(BASE, head_dim=5, position="rope"), "got head_dim=5", ROPE_PAIRS),
    (dict(BASE, activation="tanh"), "activation='tanh' is not a known choice",
     "use one of 'gelu', 'gelu_tanh', 'relu', 'relu2', 'swiglu'"),
    (dict(BASE, position="xpos"), "position='xpos' is not a known choice",
     "use one of 'learned', 'sinusoidal', 'rope', 'none'"),
    (dict(BASE, norm="batchnorm"), "norm='batchnorm' is not a known choice", "use one of 'layernorm', 'rmsnorm'"),
    (dict(BASE, attention="linear"), "attention='linear' is not a known choice", "use one of 'mha', 'mla'"),
    (dict(BASE, dtype="float64"), "dtype='float64' is not a known choice",
     "use one of 'float32', 'bfloat16', 'float16', 'auto'"),
    (dict(BASE, attention_impl="flash"), "attention_impl='flash' is not a known choice",
     "use one of 'reference', 'xla', 'cudnn', 'auto'"),
    (dict(BASE, attention="mla"), "attention='mla' needs kv_latent_dim", "(the cached latent width)"),
    (dict(MLA, position="rope"), "MLA with position='rope' needs rope_head_dim",
     "the width of the decoupled rotary part"),
    (dict(MLA_ROPE, rope_head_dim=3), "got 3", "so rope_head_dim must be even"),
    (dict(MLA, position="learned", rope_head_dim=4), "rope_head_dim is only used with position='rope' "
     "(got position='learned')", "; remove it"),
    (dict(MLA, num_kv_heads=2), "got num_kv_heads=2, num_heads=4", "num_kv_heads does not apply; leave it unset"),
    (dict(BASE, kv_latent_dim=16), "ModelConfig.kv_latent_dim", MLA_ONLY),
    (dict(BASE, q_latent_dim=16), "ModelConfig.q_latent_dim", MLA_ONLY),
    (dict(BASE, rope_head_dim=4), "ModelConfig.rope_head_dim", MLA_ONLY),
    (dict(BASE, v_head_dim=8), "ModelConfig.v_head_dim", MLA_ONLY),
    (dict(BASE, vocab_size=0), "vocab_size must", f"{POSITIVE}, got 0"),
    (dict(BASE, max_seq_len=-1), "max_seq_len must", f"{POSITIVE}, got -1"),
    (dict(BASE, d_model=0), "d_model must", f"{POSITIVE}, got 0"),
    (dict(BASE, d_model=-32), "d_model must", f"{POSITIVE}, got -32"),
    (dict(BASE, num_layers=0), "num_layers must", f"{POSITIVE}, got 0"),
    (dict(BASE, num_heads=0), "num_heads must", f"{POSITIVE}, got 0"),
    (dict(BASE, num_kv_heads=0), "num_kv_heads must", f"{POSITIVE}, got 0"),
    (dict(BASE, num_kv_heads=-2), "num_kv_heads must", f"{POSITIVE}, got -2"),
    (dict(BASE, head_dim=-8), "head_dim must", f"{POSITIVE}, got -8"),
    # 0 is allowed: no MLP (tests/test_attention_only.py)
    (dict(BASE, mlp_dim=-1), "mlp_dim must", f"{POSITIVE}, or 0 for no MLP; got -1"),
    (dict(BASE, d_model=32.0), "d_model must", f"{POSITIVE}, got 32.0"),  # a float is no size
    (dict(BASE, num_layers=True), "num_layers must", f"{POSITIVE}, got True"),  # nor is a bool
    (dict(MLA, kv_latent_dim=0), "kv_latent_dim must", f"{POSITIVE}, got 0"),
    (dict(MLA, q_latent_dim=-1), "q_latent_dim must", f"{POSITIVE}, got -1"),
    (dict(MLA, v_head_dim=0), "v_head_dim must", f"{POSITIVE}, got 0"),
    (dict(MLA_ROPE, rope_head_dim=0), "rope_head_dim must", f"{POSITIVE}, got 0"),
    (dict(BASE, dropout=-0.1), "dropout=-0.1", "must be in [0, 1)"),
    (dict(BASE, dropout=1.0), "dropout=1.0", "must be in [0, 1)"),
    (dict(BASE, dropout=1.5), "dropout=1.5", "must be in [0, 1)"),
    (dict(BASE, norm_eps=0.0), "norm_eps=0.0", "must be positive"),
    (dict(BASE, rope_theta=-1.0), "rope_theta=-1.0", "must be positive"),
    (dict(BASE, d_model=15, num_heads=3, position="sinusoidal"), "got 15",
     "sinusoidal positions need an even d_model"),
    (dict(BASE, qk_norm=1), "qk_norm must", "be True or False, got 1"),
    (dict(MLA, qk_norm=True), "qk_norm=True is implemented for attention='mha' only",
     "Set qk_norm=False or attention='mha'"),
    (dict(BASE, logit_softcap=-1.0), "logit_softcap must", f"{SOFTCAP}, got -1.0"),
    (dict(BASE, logit_softcap=float("inf")), "logit_softcap must", f"{SOFTCAP}, got inf"),
    (dict(BASE, logit_softcap=float("nan")), "logit_softcap must", f"{SOFTCAP}, got nan"),
    (dict(BASE, logit_softcap=True), "logit_softcap must", f"{SOFTCAP}, got True"),
    (dict(BASE, logit_softcap="30"), "logit_softcap must", f"{SOFTCAP}, got '30'"),
    (dict(BASE, zero_init_out="yes"), "zero_init_out must", "be True or False, got 'yes'"),
    # the head is tied: the embedding matrix
    (dict(BASE, zero_init_head=True), "zero_init_head=True needs an untied head", "(tie_embeddings=False)"),
]


def _id(case):
    fields, _, _ = case
    changed = {k: v for k, v in fields.items() if repr(BASE.get(k)) != repr(v)}  # repr: 32.0 is not 32
    return ",".join(f"{k}={v}" for k, v in changed.items())


def raised(build) -> str:
    """The message of the ValueError that `build()` raises."""
    with pytest.raises(ValueError) as error:
        build()
    return str(error.value)


@pytest.mark.parametrize("fields,problem,fix", INVALID, ids=[_id(c) for c in INVALID])
def test_invalid_config_raises_naming_the_problem_and_the_fix(fields, problem, fix):
    """Both ways in (the constructor, a config file's dict) give one ValueError naming the field and
    its value, and what to change."""
    for message in (raised(lambda: ModelConfig(**fields)), raised(lambda: ModelConfig.from_dict(fields))):
        assert message.startswith("ModelConfig"), message
        assert problem in message and fix in message, message


def test_from_dict_rejects_unknown_and_missing_fields():
    """A misspelt field is named with the known ones beside it (the fix: num_heads); a missing one is named."""
    message = raised(lambda: ModelConfig.from_dict(dict(BASE, num_head=4)))
    assert message.startswith("unknown model config field(s) ['num_head']; known fields are ['activation', ")
    assert "'num_heads'" in message
    message = raised(lambda: ModelConfig.from_dict({k: v for k, v in BASE.items() if k != "d_model"}))
    assert message == "model config is missing required field(s) ['d_model']"


def test_valid_edge_cases_are_accepted():
    # head_dim given explicitly lifts the divisibility requirement on d_model.
    assert ModelConfig(**dict(BASE, d_model=30, head_dim=8)).head_dim == 8
    # MLA's head_dim may be odd with RoPE: only the decoupled rotary part is rotated.
    assert ModelConfig(**dict(MLA_ROPE, head_dim=7)).head_dim == 7
    assert ModelConfig(**dict(BASE, dropout=0.0)).dropout == 0.0
    assert ModelConfig(**dict(BASE, dropout=0.99)).dropout == 0.99


def test_defaults_are_derived():
    cfg = ModelConfig(**BASE)
    assert cfg.num_kv_heads == 4 and cfg.kv_groups == 1
    assert cfg.head_dim == 32 // 4
    assert cfg.mlp_dim == 4 * 32
    assert cfg.v_head_dim is None and cfg.kv_latent_dim is None

    gqa = ModelConfig(**dict(BASE, num_kv_heads=2, head_dim=16, mlp_dim=100))
    assert (gqa.num_kv_heads, gqa.kv_groups, gqa.head_dim, gqa.mlp_dim) == (2, 2, 16, 100)

    mla = ModelConfig(**MLA_ROPE)
    assert mla.num_kv_heads == mla.num_heads == 4
    assert mla.v_head_dim == mla.head_dim == 8
    assert ModelConfig(**dict(MLA_ROPE, v_head_dim=6)).v_head_dim == 6


def test_config_is_frozen_and_round_trips():
    cfg = ModelConfig(**dict(MLA_ROPE, q_latent_dim=24))
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'd_model'"):
        cfg.d_model = 64  # type: ignore[misc]
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.replace(dropout=0.1).dropout == 0.1
    assert raised(lambda: cfg.replace(dropout=2.0)) == "ModelConfig.dropout=2.0 must be in [0, 1)"


CONFIG_DIR = pathlib.Path(__file__).resolve().parents[1] / "configs"
SECTIONS = {p.stem: set(importlib.import_module(f"configs.{p.stem}").get_config())
            for p in CONFIG_DIR.glob("*.py") if "def get_config" in p.read_text()}
CONFIG_FILES = sorted(name for name, sections in SECTIONS.items() if "model" in sections)  # the models' configs


def test_every_config_file_states_a_model_or_a_sparse_autoencoder():
    assert all("model" in sections or "sae" in sections for sections in SECTIONS.values()), SECTIONS
    assert "sae" in SECTIONS and "sae" not in CONFIG_FILES


def test_named_configs_exist():
    assert {"gpt2", "llama", "mla", "shakespeare"} <= set(CONFIG_FILES)


def blocks(params) -> int:
    """How many blocks a Decoder's parameters hold: a scanned stack's leading axis, or layers_0.. layers_{L-1}."""
    if "layers" in params:
        return {leaf.shape[0] for leaf in jax.tree.leaves(params["layers"])}.pop()
    return sum(name.startswith("layers_") for name in params)


@pytest.mark.parametrize("name", CONFIG_FILES)
def test_every_config_file_builds_the_model_it_states(name):
    """The file's model section becomes a ModelConfig holding every value the file sets, and the
    Decoder built from it (shapes only, 'auto' chosen for the CPU) has the file's vocabulary, width and depth."""
    model = importlib.import_module(f"configs.{name}").get_config().model
    cfg = ModelConfig.from_dict(model)
    stated = {k: v for k, v in model.items() if v is not None}  # None: a derived field, filled by ModelConfig
    held = {k: getattr(cfg, k) for k in stated}
    if "encoder" in stated:  # a nested model (cross-attention): the fields the file sets, in its ModelConfig
        encoder, inner = stated.pop("encoder").to_dict(), held.pop("encoder")
        assert {k: getattr(inner, k) for k in encoder} == encoder
    assert held == stated
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    built = resolve_auto(cfg, backend="cpu").cfg
    params = jax.eval_shape(Decoder(built).init, jax.random.key(0), example_input(built))["params"]
    if built.inputs == "table":  # rows in, classes out (configs/tables.py)
        assert params["row_embed"]["kernel"].shape == (model.d_model, model.num_features + model.num_classes)
        assert params["head"]["kernel"].shape == (model.num_classes, model.d_model)
    elif built.inputs == "image":  # patches in, classes out (configs/vit.py)
        assert params["patch_embed"]["kernel"].shape == (model.d_model, model.patch_size ** 2 * model.channels)
        assert params["head"]["kernel"].shape == (model.num_classes, model.d_model)
    else:
        assert params["embed"]["embedding"].shape == (model.vocab_size, model.d_model)
    assert blocks(params) == model.num_layers


def test_replace_derives_unset_fields_again_and_keeps_set_ones():
    """A sweep over widths must build the model it names: derived fields follow their sources."""
    cfg = ModelConfig(**dict(BASE, d_model=64))
    wide = cfg.replace(d_model=128)
    assert (wide.head_dim, wide.mlp_dim) == (128 // 4, 4 * 128)
    assert wide == ModelConfig(**dict(BASE, d_model=128))
    fixed = ModelConfig(**dict(BASE, d_model=64, head_dim=8, mlp_dim=100)).replace(d_model=128)
    assert (fixed.head_dim, fixed.mlp_dim) == (8, 100)  # set explicitly: kept
    assert cfg.replace(num_heads=2).num_kv_heads == 2  # MHA stays MHA
    gqa = ModelConfig(**dict(BASE, num_kv_heads=2)).replace(num_heads=8)
    assert gqa.num_kv_heads == 2
    mla = ModelConfig(**MLA_ROPE).replace(head_dim=12)
    assert mla.v_head_dim == 12


def test_architecture_leaves_out_the_init_and_execution_fields():
    from transformer.model.config import EXECUTION_FIELDS, INIT_FIELDS

    cfg = ModelConfig(**dict(BASE, tie_embeddings=False))
    assert set(cfg.architecture()) == set(cfg.to_dict()) - set(EXECUTION_FIELDS) - set(INIT_FIELDS)
    assert cfg.replace(dtype="bfloat16", remat=True, scan_layers=False).architecture() == cfg.architecture()
    started = cfg.replace(zero_init_out=True, zero_init_head=True)  # another init, the same parameters' meaning
    assert started.architecture_differences(cfg) == [] and started.differences(cfg) == list(INIT_FIELDS)
    recipe = cfg.replace(qk_norm=True, logit_softcap=30.0, activation="relu2")
    assert recipe.architecture_differences(cfg) == ["activation", "qk_norm", "logit_softcap"]


def test_recipe_options_are_off_by_default():
    cfg = ModelConfig(**BASE)
    assert (cfg.qk_norm, cfg.logit_softcap, cfg.zero_init_out, cfg.zero_init_head) == (False, 0.0, False, False)
    assert ModelConfig(**dict(BASE, logit_softcap=30)).logit_softcap == 30  # an int cap is a number too
