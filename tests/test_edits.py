"""Tests of edits at named points (transformer/model/edits.py): an identity edit changes no bit; zero
ablation of a head is the head mask's result and zeroing its pattern's; patching a clean run's points
into a corrupted run gives the clean logits; mean ablation and steering equal their hand computations;
both layer layouts agree; positions count tokens with registers; the sampler decodes with edits as a
full forward pass does; a forward pass with no edits is the same program; bad edits are clear errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers.decoder import jit
from tests.helpers.marks import first_fast
from tests.test_capture import T, model, tokens
from transformer.analysis.capture import capture
from transformer.model import edits
from transformer.model.decoder import Decoder
from transformer.model.param_tree import stack_layers
from transformer.model.points import CAPTURE_ONLY, point_names
from transformer.sampling.sampler import generate

TOL = dict(rtol=1e-5, atol=1e-5)


def editable(cfg) -> list[str]:
    """Every point of `cfg` an edit can change, each layer's as blocks.*.NAME."""
    names = dict.fromkeys(n if not n.startswith("blocks.") else "blocks.*." + n.split(".", 2)[2] for n in point_names(cfg))
    mla_kv = ("blocks.*.attn.k", "blocks.*.attn.v") if cfg.attention == "mla" else ()
    return [n for n in names if n.split(".", 2)[-1] not in CAPTURE_ONLY and n not in mla_kv]


def identity(cfg, name):
    """scale 1, add 0 at point `name`: an edit that changes nothing."""
    select = edits.selection(cfg, name, None, None, None)
    return edits.at_layer(cfg, name, jnp.ones_like(select), jnp.zeros_like(select))


def forward(cfg):
    return jit(lambda p, x, e: edits.run(p, cfg, x, e)[0])


@pytest.mark.parametrize("variant", first_fast(["mha", "mla", "sink_registers"]))
def test_an_identity_edit_changes_no_bit_of_the_logits(variant):
    """Identity edits at every point at once (unrolled layers), and one point at a time (scanned):
    bitwise the plain forward's logits."""
    cfg, params = model(variant)
    x = tokens()
    plain = jit(lambda p, x: Decoder(cfg).apply({"params": p}, x)[0])(params, x)
    np.testing.assert_array_equal(forward(cfg)(params, x, [identity(cfg, n) for n in editable(cfg)]), plain)
    scanned_cfg = cfg.replace(scan_layers=True)
    scanned = stack_layers(params, cfg.num_layers)
    for name in ("embed", "blocks.*.resid_mid", "blocks.*.attn.pattern", "blocks.*.attn.z", "logits"):
        np.testing.assert_array_equal(forward(scanned_cfg)(scanned, x, [identity(cfg, name)]), plain, err_msg=name)


@pytest.mark.parametrize("variant, scan_layers", first_fast([("gqa_qk_norm", False), ("mla", True), ("sink_registers", True)]))
def test_zeroing_a_head_is_its_head_mask_and_its_zeroed_pattern(variant, scan_layers):
    """zero(blocks.1.attn.z, head=2) == ablate_heads with head (1, 2) off (what head_mask did) ==
    zero(blocks.1.attn.pattern, head=2) (no weights: a zero output), and it changes the logits."""
    cfg, params = model(variant, scan_layers)
    x = tokens()
    run = forward(cfg)
    mask = np.ones((cfg.num_layers, cfg.num_heads), np.float32)
    mask[1, 2] = 0.0
    by_z = run(params, x, [edits.zero(cfg, "blocks.1.attn.z", head=2)])
    np.testing.assert_array_equal(by_z, run(params, x, [edits.ablate_heads(cfg, mask)]))
    np.testing.assert_allclose(by_z, run(params, x, [edits.zero(cfg, "blocks.1.attn.pattern", head=2)]), **TOL)
    assert np.abs(by_z - run(params, x, [])).max() > 1e-3


@pytest.mark.parametrize("variant, scan_layers", first_fast([("mha", False), ("sink_registers", True), ("mla", False)]))
def test_patching_a_clean_runs_points_into_a_corrupted_run_gives_the_clean_logits(variant, scan_layers):
    """Every editable point patched from the clean run at once; and each layer's residual stream
    alone, a cut through the whole model; and the tokens' embeddings alone (the only difference)."""
    cfg, params = model(variant, scan_layers)
    clean, corrupted = tokens(seed=1), tokens(seed=2)
    names = editable(cfg)
    clean_logits, _, got = jit(lambda p, x: capture(p, cfg, x, names))(params, clean)
    run = forward(cfg)
    assert np.abs(run(params, corrupted, []) - clean_logits).max() > 1e-2
    everything = [edits.patch(cfg, n, got[n]) for n in names if n != "logits"]
    np.testing.assert_allclose(run(params, corrupted, everything), clean_logits, **TOL)
    for l in range(cfg.num_layers):
        stream = edits.patch(cfg, f"blocks.{l}.resid_pre", got["blocks.*.resid_pre"][l])
        np.testing.assert_allclose(run(params, corrupted, [stream]), clean_logits, **TOL)
    if cfg.position == "rope":  # the embedding is all that differs (learned positions add the same)
        np.testing.assert_allclose(run(params, corrupted, [edits.patch(cfg, "embed", got["embed"])]), clean_logits, **TOL)


@pytest.mark.slow  # make test-all only (the default set's time: docs/performance.md)
def test_patching_one_position_changes_that_position_and_later_ones_only():
    """A patch of blocks.0.resid_mid at position 3, with registers first: the captured point holds the
    clean value there and the corrupted one elsewhere; logits before position 3 are the corrupted run's."""
    cfg, params = model("sink_registers")
    clean, corrupted = tokens(seed=1), tokens(seed=2)
    name = "blocks.0.resid_mid"
    _, _, source = capture(params, cfg, clean, [name])
    base, _, before = capture(params, cfg, corrupted, [name])
    patched, _, after = capture(params, cfg, corrupted, [name], edits=[edits.patch(cfg, name, source[name], position=3)])
    np.testing.assert_array_equal(after[name][:, 3], source[name][:, 3])
    np.testing.assert_array_equal(np.delete(np.asarray(after[name]), 3, axis=1), np.delete(np.asarray(before[name]), 3, axis=1))
    np.testing.assert_allclose(patched[:, :3], base[:, :3], **TOL)
    assert np.abs(patched[:, 3] - base[:, 3]).max() > 1e-3


def test_mean_ablation_puts_the_mean_of_other_inputs_and_steering_adds_a_vector():
    """mean(blocks.1.mlp.out, head=None, position=4) sets position 4 to the reference batch's mean over
    batch and tokens; steer(final_norm.out, v) moves the logits by v W_head^T (no soft-cap)."""
    cfg, params = model("gqa_qk_norm")  # untied head? either way the head is linear
    x, reference = tokens(), tokens(b=4, seed=7)
    name = "blocks.1.mlp.out"
    _, _, ref = capture(params, cfg, reference, [name])
    want = np.asarray(ref[name]).mean(axis=(0, 1))  # [D]
    _, _, got = capture(params, cfg, x, [name], edits=[edits.mean(cfg, name, ref[name], position=4, length=T)])
    np.testing.assert_allclose(got[name][:, 4], np.broadcast_to(want, got[name][:, 4].shape), rtol=1e-6, atol=1e-6)

    v = jax.random.normal(jax.random.key(3), (cfg.d_model,))
    plain, _, h = capture(params, cfg, x, ["final_norm.out"])
    steered = edits.run(params, cfg, x, [edits.steer(cfg, "final_norm.out", v, alpha=0.5)])[0]
    unembed = params["embed"]["embedding"] if cfg.tie_embeddings else params["head"]["kernel"]  # [V, D]
    np.testing.assert_allclose(steered - plain, np.broadcast_to(0.5 * unembed @ v, plain.shape), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("variant", first_fast(["gqa_qk_norm", "mla", "sink_registers"]))
def test_the_sampler_decodes_with_edits_as_a_full_forward_pass_does(variant):
    """generate(..., edits) greedy == the argmax of full forward passes with the same edits, token by
    token (prefill and cached decoding, MLA's absorbed form included); the edits change the tokens."""
    cfg, params = model(variant)
    mask = np.ones((cfg.num_layers, cfg.num_heads), np.float32)
    mask[0, 1] = mask[1, 3] = 0.0
    chosen = [edits.ablate_heads(cfg, mask), edits.steer(cfg, "blocks.0.resid_post", jnp.linspace(-1, 1, cfg.d_model))]
    prompts = [[3, 9, 27, 17], [5, 1]]
    steps = 6
    out = generate(params, cfg, prompts, jax.random.key(0), steps, chosen, temperature=0.0)
    run = forward(cfg)
    rows = [list(p) for p in prompts]
    for _ in range(steps):
        padded = np.zeros((2, 16), np.int32)
        for b, row in enumerate(rows):
            padded[b, : len(row)] = row
        logits = np.asarray(run(params, jnp.asarray(padded), chosen))
        for b, row in enumerate(rows):
            row.append(int(np.argmax(logits[b, len(row) - 1])))
    np.testing.assert_array_equal(out.tokens, [row[len(p):] for row, p in zip(rows, prompts)])
    plain = generate(params, cfg, prompts, jax.random.key(0), steps, temperature=0.0)
    assert not np.array_equal(plain.tokens, out.tokens)


def test_a_forward_pass_with_no_edits_is_the_program_of_the_plain_model():
    cfg, params = model("sink_registers", scan_layers=True)
    x = tokens()
    lower = lambda f: jax.jit(f).lower(params, x).as_text()  # noqa: E731
    assert lower(lambda p, x: edits.run(p, cfg, x, [])) == lower(lambda p, x: Decoder(cfg).apply({"params": p}, x))


def test_edits_vmap_over_a_stack_of_edits_in_one_compile():
    """Ten single-head ablations stacked along a leading axis run as one vmapped program and equal
    the ten runs one by one."""
    cfg, params = model("mha", scan_layers=True)
    x = tokens()
    one_by_one = [edits.zero(cfg, f"blocks.{l}.attn.z", head=h) for l in range(2) for h in range(4)]
    stacked = jax.tree.map(lambda *a: jnp.stack(a), *one_by_one)
    together = jax.jit(jax.vmap(lambda e: edits.run(params, cfg, x, [e])[0]))(stacked)
    for i, edit in enumerate(one_by_one):
        np.testing.assert_allclose(together[i], forward(cfg)(params, x, [edit]), **TOL)


def test_bad_edits_are_clear_errors():
    cfg, params = model("mla")
    with pytest.raises(ValueError, match=r"'blocks.0.attn.head_out' is computed for a capture alone.*edit attn.z"):
        edits.zero(cfg, "blocks.0.attn.head_out")
    with pytest.raises(ValueError, match=r"'blocks.0.attn.k' is computed for a capture alone.*attn.latent"):
        edits.zero(cfg, "blocks.0.attn.k")
    with pytest.raises(ValueError, match=r"'blocks.0.resid' is not a point of this model.*list_points"):
        edits.zero(cfg, "blocks.0.resid")
    with pytest.raises(ValueError, match=r"'blocks.7.resid_pre': the model has layers 0..1"):
        edits.zero(cfg, "blocks.7.resid_pre")
    with pytest.raises(ValueError, match=r"has no head axis \(its axes are btd\)"):
        edits.zero(cfg, "blocks.0.resid_pre", head=1)
    with pytest.raises(ValueError, match=r"head 4 is out of range 0..3"):
        edits.zero(cfg, "blocks.0.attn.z", head=4)
    with pytest.raises(ValueError, match="position=2 needs length=T"):
        edits.zero(cfg, "blocks.0.attn.z", position=2)
    with pytest.raises(ValueError, match=r"head_mask has shape \(4,\); this model needs \[L, H\] = \(2, 4\)"):
        edits.ablate_heads(cfg, np.ones(4))
    with pytest.raises(ValueError, match="selects positions; the sampler's calls see one new token"):
        generate(params, cfg, [[1, 2]], jax.random.key(0), 2, [edits.zero(cfg, "embed", position=1, length=2)])
