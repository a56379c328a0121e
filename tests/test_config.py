"""Tests of transformer/model/config.py: validation messages name the field, derived defaults, config files."""

from __future__ import annotations

import importlib
import pathlib

import pytest

from transformer.model.config import ModelConfig

BASE = dict(vocab_size=64, max_seq_len=16, d_model=32, num_layers=2, num_heads=4)
MLA = dict(BASE, attention="mla", kv_latent_dim=16)
MLA_ROPE = dict(MLA, position="rope", rope_head_dim=4)

INVALID = [
    # (fields, the field the message must name)
    (dict(BASE, d_model=30), "d_model"),
    (dict(BASE, num_kv_heads=3), "num_kv_heads"),
    (dict(BASE, d_model=28, position="rope"), "head_dim"),  # head_dim 7
    (dict(BASE, head_dim=5, position="rope"), "head_dim"),
    (dict(BASE, activation="tanh"), "activation"),
    (dict(BASE, position="alibi"), "position"),
    (dict(BASE, norm="batchnorm"), "norm"),
    (dict(BASE, attention="linear"), "attention"),
    (dict(BASE, dtype="float64"), "dtype"),
    (dict(BASE, attention_impl="flash"), "attention_impl"),
    (dict(BASE, attention="mla"), "kv_latent_dim"),
    (dict(MLA, position="rope"), "rope_head_dim"),
    (dict(MLA_ROPE, rope_head_dim=3), "rope_head_dim"),
    (dict(MLA, position="learned", rope_head_dim=4), "rope_head_dim"),
    (dict(MLA, num_kv_heads=2), "num_kv_heads"),
    (dict(BASE, kv_latent_dim=16), "kv_latent_dim"),
    (dict(BASE, q_latent_dim=16), "q_latent_dim"),
    (dict(BASE, rope_head_dim=4), "rope_head_dim"),
    (dict(BASE, v_head_dim=8), "v_head_dim"),
    (dict(BASE, vocab_size=0), "vocab_size"),
    (dict(BASE, max_seq_len=-1), "max_seq_len"),
    (dict(BASE, d_model=0), "d_model"),
    (dict(BASE, d_model=-32), "d_model"),
    (dict(BASE, num_layers=0), "num_layers"),
    (dict(BASE, num_heads=0), "num_heads"),
    (dict(BASE, num_kv_heads=0), "num_kv_heads"),
    (dict(BASE, num_kv_heads=-2), "num_kv_heads"),
    (dict(BASE, head_dim=-8), "head_dim"),
    (dict(BASE, mlp_dim=-1), "mlp_dim"),  # 0 is allowed: no MLP (tests/test_attention_only.py)
    (dict(BASE, d_model=32.0), "d_model"),
    (dict(BASE, num_layers=True), "num_layers"),
    (dict(MLA, kv_latent_dim=0), "kv_latent_dim"),
    (dict(MLA, q_latent_dim=-1), "q_latent_dim"),
    (dict(MLA, v_head_dim=0), "v_head_dim"),
    (dict(MLA_ROPE, rope_head_dim=0), "rope_head_dim"),
    (dict(BASE, dropout=-0.1), "dropout"),
    (dict(BASE, dropout=1.0), "dropout"),
    (dict(BASE, dropout=1.5), "dropout"),
    (dict(BASE, norm_eps=0.0), "norm_eps"),
    (dict(BASE, rope_theta=-1.0), "rope_theta"),
    (dict(BASE, d_model=15, num_heads=3, position="sinusoidal"), "d_model"),
    (dict(BASE, qk_norm=1), "qk_norm"),
    (dict(MLA, qk_norm=True), "qk_norm"),
    (dict(BASE, logit_softcap=-1.0), "logit_softcap"),
    (dict(BASE, logit_softcap=float("inf")), "logit_softcap"),
    (dict(BASE, logit_softcap=float("nan")), "logit_softcap"),
    (dict(BASE, logit_softcap=True), "logit_softcap"),
    (dict(BASE, logit_softcap="30"), "logit_softcap"),
    (dict(BASE, zero_init_out="yes"), "zero_init_out"),
    (dict(BASE, zero_init_head=True), "zero_init_head"),  # the head is tied: the embedding matrix
]


def _id(case):
    fields, name = case
    changed = {k: v for k, v in fields.items() if BASE.get(k, object()) != v}
    return f"{name}:" + ",".join(f"{k}={v}" for k, v in changed.items())


@pytest.mark.parametrize("fields,name", INVALID, ids=[_id(c) for c in INVALID])
def test_invalid_config_raises_naming_the_field(fields, name):
    with pytest.raises(ValueError, match=rf"\b{name}\b"):
        ModelConfig(**fields)
    with pytest.raises(ValueError, match=rf"\b{name}\b"):
        ModelConfig.from_dict(fields)


def test_from_dict_rejects_unknown_and_missing_fields():
    with pytest.raises(ValueError, match="num_head"):
        ModelConfig.from_dict(dict(BASE, num_head=4))
    with pytest.raises(ValueError, match="d_model"):
        ModelConfig.from_dict({k: v for k, v in BASE.items() if k != "d_model"})


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
    with pytest.raises(Exception):
        cfg.d_model = 64  # type: ignore[misc]
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.replace(dropout=0.1).dropout == 0.1
    with pytest.raises(ValueError, match="dropout"):
        cfg.replace(dropout=2.0)


CONFIG_DIR = pathlib.Path(__file__).resolve().parents[1] / "configs"
CONFIG_FILES = sorted(
    p.stem for p in CONFIG_DIR.glob("*.py") if "def get_config" in p.read_text()
)


def test_named_configs_exist():
    assert {"gpt2", "llama", "mla", "shakespeare"} <= set(CONFIG_FILES)


@pytest.mark.parametrize("name", CONFIG_FILES)
def test_every_config_file_builds_a_model_config(name):
    config = importlib.import_module(f"configs.{name}").get_config()
    cfg = ModelConfig.from_dict(config.model)
    assert isinstance(cfg, ModelConfig)
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg


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
