"""Tests of sparse autoencoders (transformer/analysis/sae/): splicing with the error term leaves the
logits unchanged and its features can be captured, steered, patched and ablated, in the sampler too;
our layout loads back bitwise; files in SAELens's and Gemma Scope's layouts load with their keys,
shapes and config fields pinned and encode as a NumPy version of each formula; JumpReLU's
straight-through gradients are the paper's; bad inputs are one-line errors; training resumes exactly."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from tests.helpers.runs import quiet_train, tiny_config
from tests.test_capture import model, tokens
from transformer.analysis.capture import capture
from transformer.analysis.sae import features as F, layouts
from transformer.analysis.sae.autoencoder import SAE, init, jump_relu, step
from transformer.analysis.sae.splice import Splice
from transformer.model import edits
from transformer.sampling.sampler import generate

POINT, N = "blocks.1.resid_post", 48
FEATURES = POINT + ".features"


def trained_like(cfg, architecture="topk", seed=0, point=POINT) -> SAE:
    """An SAE on `point` with random biases (so every term of the formulas counts)."""
    sae = init(jax.random.key(seed), point=point, width=cfg.d_model, features=N, architecture=architecture, k=5)
    b_enc, b_dec, threshold = jax.random.normal(jax.random.key(seed + 1), (3, N))[:, None] * jnp.array([[0.1], [0.1], [0.2]])
    return sae.replace(b_enc=b_enc[0], b_dec=b_dec[0, :cfg.d_model], threshold=jnp.abs(threshold[0]))


@pytest.mark.parametrize("architecture", ["topk", "jumprelu"])
def test_splicing_with_the_error_term_leaves_the_logits_and_reads_the_features(architecture):
    cfg, params = model("mha")
    x, sae = tokens(), trained_like(cfg, architecture)
    clean, _ = edits.run(params, cfg, x, [])
    spliced, _ = jax.jit(lambda p, t: edits.run(p, cfg, t, [Splice(sae)]))(params, x)
    np.testing.assert_allclose(spliced, clean, rtol=1e-5, atol=1e-5)
    without, _ = edits.run(params, cfg, x, [Splice(sae, error=False)])
    assert np.abs(without - clean).max() > 1e-2  # the reconstruction alone is not the activation
    _, _, got = capture(params, cfg, x, [FEATURES, POINT], edits=[Splice(sae)])
    assert got[FEATURES].shape == (*x.shape, N)
    np.testing.assert_allclose(got[FEATURES], sae.encode(got[POINT]), atol=1e-6)


@pytest.mark.parametrize("point", [POINT, "final_norm.out"])  # a layer's point and a top one
def test_an_edit_of_the_features_is_an_edit_of_the_point_through_the_decoder(point):
    """Steering feature i by alpha is adding alpha W_dec[i]; patching features f' is x + decode(f') - decode(f);
    zeroing every feature at a position removes decode(f) - b_dec there; all with the error term, in a forward
    pass and the sampler."""
    cfg, params = model("mha")
    x, sae, i = tokens(), trained_like(cfg, point=point), 7
    features = point + ".features"
    _, _, got = capture(params, cfg, x, [features, point], edits=[Splice(sae)])
    f, a = got[features], got[point]
    steer = edits.steer(cfg, features, 3.0 * jnp.eye(N)[i])
    steered, _ = edits.run(params, cfg, x, [Splice(sae), steer])
    by_hand, _ = edits.run(params, cfg, x, [edits.steer(cfg, point, 3.0 * sae.W_dec[i])])
    np.testing.assert_allclose(steered, by_hand, rtol=1e-5, atol=1e-5)
    source = jnp.roll(f, 1, axis=0)
    patched, _ = edits.run(params, cfg, x, [Splice(sae), edits.patch(cfg, features, source)])
    by_hand, _ = edits.run(params, cfg, x, [edits.patch(cfg, point, a + sae.decode(source) - sae.decode(f))])
    np.testing.assert_allclose(patched, by_hand, rtol=1e-5, atol=1e-5)
    ablated, _ = edits.run(params, cfg, x, [Splice(sae), edits.zero(cfg, features, position=2, length=x.shape[1])])
    minus = jnp.zeros_like(a).at[:, 2].set(-(f[:, 2] @ sae.W_dec))  # every feature at position 2 zeroed
    by_hand, _ = edits.run(params, cfg, x, [edits.patch(cfg, point, a + minus)])
    np.testing.assert_allclose(ablated, by_hand, rtol=1e-5, atol=1e-5)
    prompts = [[1, 2, 3], [4, 5]]
    with_splice = generate(params, cfg, prompts, jax.random.key(0), 5, edits=[Splice(sae), steer], temperature=0)
    with_steer = generate(params, cfg, prompts, jax.random.key(0), 5, temperature=0,
                          edits=[edits.steer(cfg, point, 3.0 * sae.W_dec[i])])
    np.testing.assert_array_equal(with_splice.tokens, with_steer.tokens)


@pytest.mark.parametrize("architecture", ["topk", "jumprelu"])
def test_our_layout_loads_back_bitwise(tmp_path, architecture):
    cfg, _ = model("mha")
    sae = trained_like(cfg, architecture)
    layouts.save(sae, str(tmp_path))
    back = layouts.load(str(tmp_path), cfg)
    for key in layouts.KEYS if architecture == "jumprelu" else layouts.KEYS[:4]:
        np.testing.assert_array_equal(np.asarray(getattr(back, key)), np.asarray(getattr(sae, key)))
    assert (back.point, back.architecture, back.k, back.subtract_b_dec) == (sae.point, sae.architecture, sae.k, True)
    fields = json.load(open(tmp_path / "cfg.json"))  # SAELens reads the same folder
    assert fields["meta"]["hook_name"] == "blocks.1.hook_resid_post" and fields["d_sae"] == N
    assert sorted(load_file(str(tmp_path / "sae_weights.safetensors"))) == sorted(
        ["W_dec", "W_enc", "b_dec", "b_enc"] + ["threshold"] * (architecture == "jumprelu"))


def published_arrays(d: int, n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"W_enc": rng.normal(size=(d, n)).astype(np.float32), "W_dec": rng.normal(size=(n, d)).astype(np.float32),
            "b_enc": rng.normal(size=n).astype(np.float32) * 0.1, "b_dec": rng.normal(size=d).astype(np.float32),
            "threshold": np.abs(rng.normal(size=n)).astype(np.float32)}


def relu(z):
    return np.maximum(z, 0.0)


@pytest.mark.parametrize("architecture, legacy", [("jumprelu", False), ("topk", False), ("jumprelu", True)])
def test_a_saelens_folder_loads_and_encodes_as_saelens_does(tmp_path, architecture, legacy):
    """SAELens v6 (hook in meta.hook_name) and older files (hook_name at the top): keys W_enc [d_in, d_sae],
    W_dec [d_sae, d_in], b_enc, b_dec, threshold (JumpReLU); z = (x - b_dec) W_enc + b_enc."""
    cfg, _ = model("mha")
    d, arrays = cfg.d_model, published_arrays(cfg.d_model, N)
    if architecture == "topk":
        del arrays["threshold"]
    save_file(arrays, str(tmp_path / "sae_weights.safetensors"))
    hook = {"hook_name": "blocks.1.hook_resid_post"}
    fields = {"architecture": architecture, "d_in": d, "d_sae": N, "dtype": "float32", "apply_b_dec_to_input": True,
              "normalize_activations": "none", **({"k": 6} if architecture == "topk" else {}),
              **(hook if legacy else {"meta": hook})}
    (tmp_path / "cfg.json").write_text(json.dumps(fields))
    sae = layouts.load(str(tmp_path), cfg)
    assert (sae.point, sae.width, sae.num_features, sae.architecture) == (POINT, d, N, architecture)
    x = np.random.default_rng(1).normal(size=(3, 4, d)).astype(np.float32)
    z = (x - arrays["b_dec"]) @ arrays["W_enc"] + arrays["b_enc"]
    if architecture == "jumprelu":
        expected = relu(z) * (z > arrays["threshold"])
    else:
        kth = np.sort(z, -1)[..., -6][..., None]
        expected = relu(z) * (z >= kth)
        assert ((np.asarray(sae.encode(x)) != 0).sum(-1) <= 6).all()
    np.testing.assert_allclose(sae.encode(x), expected, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(sae.decode(expected), expected @ arrays["W_dec"] + arrays["b_dec"], rtol=1e-5, atol=1e-4)


def test_a_gemma_scope_params_npz_loads_and_encodes_as_its_tutorial_does(tmp_path):
    """params.npz: W_enc [d_model, d_sae], W_dec [d_sae, d_model], b_enc, b_dec, threshold;
    acts = (pre > threshold) * relu(pre), pre = x W_enc + b_enc (b_dec not subtracted)."""
    cfg, _ = model("mha")
    arrays = published_arrays(cfg.d_model, N, seed=2)
    np.savez(tmp_path / "params.npz", **arrays)
    sae = layouts.load_gemma_scope(str(tmp_path / "params.npz"), POINT, cfg)
    assert (sae.W_enc.shape, sae.W_dec.shape, sae.threshold.shape) == ((cfg.d_model, N), (N, cfg.d_model), (N,))
    x = np.random.default_rng(3).normal(size=(5, cfg.d_model)).astype(np.float32)
    pre = x @ arrays["W_enc"] + arrays["b_enc"]
    np.testing.assert_allclose(sae.encode(x), (pre > arrays["threshold"]) * relu(pre), rtol=1e-5, atol=1e-4)


def test_jump_relu_gradients_are_the_straight_through_estimators():
    """d/dz JumpReLU = H(z - t); d/dt JumpReLU = -(t / eps) K((z - t) / eps); d/dt H = -(1 / eps) K(...),
    K the rectangle of width 1 (Rajamanoharan et al. 2024), summed over the rows."""
    z = jnp.array([[0.10, 0.52, 0.30], [0.49, 0.05, 0.33]])
    t, eps = jnp.array([0.5, 0.5, 0.3]), 0.1
    near = (np.abs((np.asarray(z) - np.asarray(t)) / eps) < 0.5).astype(np.float32)
    dz, dt = jax.grad(lambda z, t: jump_relu(z, t, eps).sum(), argnums=(0, 1))(z, t)
    np.testing.assert_allclose(dz, np.asarray(z > t, np.float32))
    np.testing.assert_allclose(dt, (-(np.asarray(t) / eps) * near).sum(0), rtol=1e-6)
    np.testing.assert_allclose(jax.grad(lambda t: step(z, t, eps).sum())(t), (-near / eps).sum(0), rtol=1e-6)
    np.testing.assert_allclose(jump_relu(z, t, eps), np.where(z > t, z, 0.0))


def error_of(call) -> str:
    with pytest.raises(ValueError) as caught:
        call()
    return str(caught.value)


def test_bad_inputs_are_one_line_errors(tmp_path):
    cfg, params = model("mha")
    narrow = init(jax.random.key(0), point=POINT, width=cfg.d_model - 1, features=N)
    np.savez(tmp_path / "params.npz", **published_arrays(cfg.d_model, N))
    bad_npz = tmp_path / "bad.npz"
    np.savez(bad_npz, **{k: v for k, v in published_arrays(cfg.d_model, N).items() if k != "threshold"})
    wrong_shape = tmp_path / "wrong_shape.npz"
    np.savez(wrong_shape, **{**published_arrays(cfg.d_model, N), "b_dec": np.zeros(cfg.d_model + 1, np.float32)})
    normalized = tmp_path / "normalized"
    layouts.save(trained_like(cfg), str(normalized))
    fields = json.loads((normalized / "cfg.json").read_text())
    (normalized / "cfg.json").write_text(json.dumps({**fields, "normalize_activations": "expected_average_only_in"}))
    cases = {
        "width": (lambda: layouts.check_fits(narrow, cfg), "width 31"),
        "wrong shape": (lambda: layouts.load_gemma_scope(str(wrong_shape), POINT), "b_dec has shape (33,)"),
        "normalized": (lambda: layouts.load(str(normalized), cfg), "fold the scaling into the weights"),
        "no such point": (lambda: layouts.load_gemma_scope(str(tmp_path / "params.npz"), "blocks.1.resid_middle", cfg),
                          "is not a point of this model"),
        "no such layer": (lambda: layouts.load_gemma_scope(str(tmp_path / "params.npz"), "blocks.9.resid_post", cfg),
                          "layers 0..1"),
        "heads": (lambda: layouts.load_gemma_scope(str(tmp_path / "params.npz"), "blocks.1.attn.z", cfg), "[B, T, width]"),
        "missing key": (lambda: layouts.load_gemma_scope(str(bad_npz), POINT), "has no threshold"),
        "architecture": (lambda: init(jax.random.key(0), point=POINT, width=8, features=8, architecture="gated"),
                         "use one of"),
        "every layer": (lambda: edits.run(params, cfg, tokens(), [Splice(narrow.replace(point="blocks.*.resid_post"))]),
                        "name the layer"),
        "features without the SAE": (lambda: capture(params, cfg, tokens(), [FEATURES]), "exists only with an SAE"),
    }
    for name, (call, expected) in cases.items():
        message = error_of(call)
        assert expected in message and "\n" not in message, (name, message)


def test_reading_features_top_contexts_density_rule_and_ablation():
    """top_contexts finds the planted largest activations; density counts the active tokens; the rule
    passes a feature on one byte (or after one byte) and fails one on varied bytes or active too rarely;
    ablating feature i with the error term subtracts f_i W_dec[i] from the point."""
    windows = np.array([[1, 2, 3, 4, 5, 6, 7, 8], [2, 3, 2, 3, 2, 3, 2, 3]])
    f = np.zeros((2, 8, 4), np.float32)
    f[1, [1, 3, 5, 7], 0] = [4, 3, 2, 1]  # on byte 3 (after byte 2): passes
    f[0, [0, 2, 4, 6], 1] = [4, 3, 2, 1]  # on bytes 1, 3, 5, 7 after varied bytes: fails
    f[1, [2, 4], 2] = [1, 1]  # byte 2, but only twice: fails
    f[0, [1, 3, 5, 7], 3] = 1.0  # varied bytes: fails
    values, where = F.top_contexts(f, 4)
    assert sorted(where[0]) == [9, 11, 13, 15] and values[0].tolist() == [4, 3, 2, 1]
    np.testing.assert_allclose(F.density(f), [4 / 16, 4 / 16, 2 / 16, 4 / 16])
    assert F.token_rule(where, values, windows).tolist() == [True, False, False, False]
    cfg, params = model("mha")
    x, sae, i = tokens(), trained_like(cfg), 3
    _, _, got = capture(params, cfg, x, [FEATURES, POINT], edits=[Splice(sae)])
    ablated, _ = edits.run(params, cfg, x, [Splice(sae), F.ablate(cfg, sae, [i])])
    minus = got[POINT] - got[FEATURES][..., i:i + 1] * sae.W_dec[i]
    by_hand, _ = edits.run(params, cfg, x, [edits.patch(cfg, POINT, minus)])
    np.testing.assert_allclose(ablated, by_hand, rtol=1e-5, atol=1e-5)
    assert F.logit_effect(params, cfg, sae).shape == (N, cfg.vocab_size)


@pytest.mark.slow
def test_training_resumes_exactly(tmp_path):
    """An SAE trained 4 steps, stopped and resumed to 8 equals one trained 8 steps straight, bitwise."""
    from configs import sae as sae_config
    from transformer.analysis.sae.training import train_sae

    quiet_train(tiny_config(tmp_path, steps=2, every=2), tmp_path / "model")
    config = sae_config.get_config()
    config.sae.update(dict(run=str(tmp_path / "model"), features=32, k=4, batch_size=64, model_batches=1,
                           model_batch_size=4, seq_len=16, eval_batches=1, log_every=2, eval_every=4, steps=8))
    train_sae(config, str(tmp_path / "straight"))
    config.sae.steps = 4
    train_sae(config, str(tmp_path / "resumed"))
    config.sae.steps = 8
    last = train_sae(config, str(tmp_path / "resumed"))
    assert set(last) >= {"fve", "l0", "dead", "dense", "loss_increase"}
    a, b = (layouts.load(str(tmp_path / name / "sae")) for name in ("straight", "resumed"))
    for key in layouts.KEYS[:4]:
        np.testing.assert_array_equal(np.asarray(getattr(a, key)), np.asarray(getattr(b, key)))
