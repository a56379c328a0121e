"""The ViT half of attention beyond language: image patches, the bidirectional mask, registers, the image data."""

import numpy as np
import pytest

from transformer.data import images


def test_shapes_are_deterministic_per_seed_and_their_masks_match_their_labels():
    a, b, c = images.shapes(64, seed=3), images.shapes(64, seed=3), images.shapes(64, seed=4)
    for key in ("images", "masks", "shape", "colour", "position", "count"):
        np.testing.assert_array_equal(a[key], b[key])
    assert not np.array_equal(a["images"], c["images"])
    assert a["images"].shape == (64, 32, 32, 3) and a["images"].dtype == np.float32
    assert a["masks"].shape == (64, images.MAX_OBJECTS, 32, 32) and a["masks"].dtype == bool
    present = a["shape"] >= 0
    np.testing.assert_array_equal(present, np.arange(images.MAX_OBJECTS)[None] < a["count"][:, None])
    np.testing.assert_array_equal(present, a["colour"] >= 0)
    np.testing.assert_array_equal(present, a["masks"].any(axis=(2, 3)))  # an absent object draws nothing
    assert not (a["masks"].sum(axis=1) > 1).any()  # a pixel belongs to one object at most
    y, x = np.mgrid[0:32, 0:32] + 0.5
    side = {"left": (-1, 0), "right": (1, 0), "top": (0, -1), "bottom": (0, 1)}
    for i, k in zip(*np.nonzero(present)):
        mask = a["masks"][i, k]
        dx, dy = x[mask].mean() - 16, y[mask].mean() - 16  # the object's centre from the picture's
        sx, sy = side[images.POSITIONS[a["position"][i, k]]]
        assert dx * sx + dy * sy > 4 and abs(dx * sy + dy * sx) < 4  # on its labelled side of the centre
        pixels = a["images"][i][mask]  # [m, 3]: the object's colour, a little shaded
        nearest = np.linalg.norm(pixels.mean(0)[None] - images.RGB, axis=1).argmin()
        assert nearest == a["colour"][i, k]


def test_classification_sets():
    x, y = images.classification("shapes", 16, seed=0)
    assert x.shape == (16, 32, 32, 3) and set(y) <= {0, 1, 2}
    x, y = images.classification("digits", 16, seed=0)
    assert x.shape == (16, 8, 8, 1) and 0 <= x.min() and x.max() <= 1 and set(y) <= set(range(10))
    train, test = images.digits("train"), images.digits("test")
    assert len(train["label"]) + len(test["label"]) == 1797 and len(test["label"]) == images.DIGITS_TEST
    with pytest.raises(ValueError, match="no image set"):
        images.classification("cifar", 4, 0)
    with pytest.raises(ValueError, match="objects"):
        images.shapes(4, 0, objects=(0, 2))


# --- the model: patches, the mask kind, registers, pooling -------------------------------------------

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from transformer.analysis.capture import capture  # noqa: E402
from transformer.model import image, ops  # noqa: E402
from transformer.model.config import ModelConfig  # noqa: E402
from transformer.model.decoder import Decoder, encode  # noqa: E402
from transformer.model.edits import ablate_heads, run  # noqa: E402
from transformer.model.key_view import key_view  # noqa: E402
from transformer.model.kv_cache import PAD_POSITION, init_cache  # noqa: E402
from transformer.training.steps import init_params  # noqa: E402


def vit_cfg(**changes) -> ModelConfig:
    fields = dict(vocab_size=1, max_seq_len=17, d_model=16, num_layers=2, num_heads=2, mlp_dim=32, inputs="image",
                  mask="bidirectional", image_size=8, patch_size=2, channels=3, cls_token=True, num_classes=3,
                  tie_embeddings=False, scan_layers=False)
    return ModelConfig(**{**fields, **changes})


def pictures(n: int = 2, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random((n, 8, 8, 3)).astype(np.float32)


def test_patches_cut_row_by_row_and_unpatch_undoes_them():
    x = pictures(2)
    p = np.asarray(image.patches(jnp.asarray(x), 2))  # [B, 16, 2 * 2 * 3]
    assert p.shape == (2, 16, 12)
    np.testing.assert_array_equal(p[:, 5], x[:, 2:4, 2:4].reshape(2, 12))  # patch 5: row 1, column 1
    np.testing.assert_array_equal(p[:, 3], x[:, 0:2, 6:8].reshape(2, 12))  # patch 3: row 0, column 3
    np.testing.assert_array_equal(np.asarray(image.unpatch(jnp.asarray(p), 2, 8)), x)


def test_2d_sinusoidal_positions_encode_the_row_then_the_column():
    cfg = vit_cfg(position="sinusoidal")
    table = np.asarray(image.sinusoidal_2d(cfg))  # [16, D]
    half = cfg.d_model // 2
    np.testing.assert_array_equal(table[1, :half], table[2, :half])  # patches 1 and 2: the same row
    np.testing.assert_array_equal(table[1, half:], table[5, half:])  # patches 1 and 5: the same column
    assert not np.allclose(table[1, :half], table[5, :half]) and not np.allclose(table[1, half:], table[2, half:])


def test_the_bidirectional_mask_shows_every_key_but_padding_and_refuses_a_cache():
    cfg = ModelConfig(vocab_size=8, max_seq_len=8, d_model=16, num_layers=1, num_heads=2, mask="bidirectional")
    positions = jnp.array([[0, 1, 2, PAD_POSITION]])
    seen = np.asarray(key_view(cfg, positions).bias[0][0, 0]) == 0  # [T, S]
    assert seen[:, :3].all() and not seen[:, 3].any()
    causal = np.asarray(key_view(cfg.replace(mask="causal"), positions).bias[0][0, 0]) == 0
    assert not causal[0, 1], "the causal mask hides the later key"
    params = init_params(cfg, jax.random.key(0))
    cache = init_cache(cfg, 1, 8)
    with pytest.raises(ValueError, match="mask='bidirectional' reads its input in one pass"):
        Decoder(cfg).apply({"params": params}, jnp.array([[1, 2]]), cache=cache)


def test_a_patch_output_depends_on_a_later_patch_only_with_the_bidirectional_mask():
    cfg = vit_cfg(cls_token=False, pool="mean", num_registers=2)
    params = init_params(cfg, jax.random.key(0))
    x = pictures(1)
    later = x.copy()
    later[:, 6:, 6:] += 0.5  # the last patch
    first = lambda images: capture(params, cfg, images, ["blocks.0.resid_post"])[2]["blocks.0.resid_post"][0, 0]  # noqa: E731
    assert np.abs(np.asarray(first(later) - first(x))).max() > 1e-4, "patch 0 sees patch 15"
    text = ModelConfig(vocab_size=8, max_seq_len=8, d_model=16, num_layers=1, num_heads=2, mask="bidirectional")
    tokens, changed = jnp.array([[1, 2, 3, 4]]), jnp.array([[1, 2, 3, 5]])
    for mask, moves in (("bidirectional", True), ("causal", False)):
        c = text.replace(mask=mask)
        p = init_params(c, jax.random.key(1))
        logits = lambda t: Decoder(c).apply({"params": p}, t)[0][0, 0]  # noqa: E731
        assert (np.abs(np.asarray(logits(changed) - logits(tokens))).max() > 1e-6) == moves


@pytest.mark.parametrize("position", ["learned", "sinusoidal", "none"])
def test_registers_with_images_are_seen_by_every_patch_and_give_no_logits(position):
    cfg = vit_cfg(num_registers=3, position=position)
    params = init_params(cfg, jax.random.key(0))
    assert params["registers"].shape == (3, 16)
    logits, _, got = capture(params, cfg, pictures(2), ["blocks.*.attn.pattern", "blocks.*.attn.register_share"])
    assert logits.shape == (2, 1, 3)
    pattern = np.asarray(got["blocks.*.attn.pattern"])  # [L, B, H, T, R + T]: T = 17 tokens, 3 registers
    assert pattern.shape == (2, 2, 2, 17, 20) and (pattern[..., :3] > 0).all() and (pattern > 0).all()
    np.testing.assert_allclose(np.asarray(got["blocks.*.attn.register_share"]), pattern[..., :3].sum(-1), rtol=1e-5)
    moved = {**params, "registers": params["registers"] + jax.random.normal(jax.random.key(1), (3, 16))}
    assert not np.allclose(np.asarray(capture(moved, cfg, pictures(2), [])[0]), np.asarray(logits))


@pytest.mark.parametrize("pool", ["cls", "mean"])
def test_the_class_head_reads_cls_or_the_mean_of_the_patch_tokens(pool):
    cfg = vit_cfg(pool=pool)
    params = init_params(cfg, jax.random.key(0))
    logits, _, got = capture(params, cfg, pictures(2), ["final_norm.out"])
    h = np.asarray(got["final_norm.out"])  # [B, 17, D]: [CLS], then the 16 patches
    pooled = h[:, 0] if pool == "cls" else h[:, 1:].mean(axis=1)
    expected = pooled @ np.asarray(params["head"]["kernel"]).T  # head [C, D]
    np.testing.assert_allclose(np.asarray(logits)[:, 0], expected, rtol=1e-4, atol=1e-5)


def test_encode_gives_the_final_normed_tokens_inside_another_module():
    cfg = vit_cfg(num_registers=2)

    class Reader(nn.Module):
        @nn.compact
        def __call__(self, images):
            return encode(self, cfg, images)

    x = jnp.asarray(pictures(2))
    variables = Reader().init(jax.random.key(0), x)
    tokens = Reader().apply(variables, x)
    assert tokens.shape == (2, 17, 16)
    vit = {**variables["params"]["encoder"], "head": init_params(cfg, jax.random.key(0))["head"]}
    np.testing.assert_allclose(np.asarray(tokens), np.asarray(capture(vit, cfg, x, ["final_norm.out"])[2]["final_norm.out"]),
                               rtol=1e-5, atol=1e-6)


def test_named_points_and_edits_work_on_patches_under_jit():
    cfg = vit_cfg()
    params = init_params(cfg, jax.random.key(0))
    x = jnp.asarray(pictures(2))
    point = jax.jit(lambda p, images: capture(p, cfg, images, ["blocks.1.resid_post"])[2]["blocks.1.resid_post"][:, 5])
    assert point(params, x).shape == (2, 16)  # patch 5's residual stream (token 6 after [CLS])
    mask = np.ones((2, 2), np.float32)
    mask[1, 0] = 0.0  # head 0 of the last layer off
    names = ["blocks.1.resid_pre", "blocks.1.attn.out", "blocks.1.attn.head_out"]
    logits, _, plain = jax.jit(lambda p, images: capture(p, cfg, images, names))(params, x)
    edited, _, ablated = jax.jit(lambda p, images: capture(p, cfg, images, names, edits=[ablate_heads(cfg, mask)])
                                 )(params, x)
    np.testing.assert_array_equal(np.asarray(ablated["blocks.1.resid_pre"]), np.asarray(plain["blocks.1.resid_pre"]))
    np.testing.assert_allclose(np.asarray(ablated["blocks.1.attn.out"]),  # the head's own contribution gone, no more
                               np.asarray(plain["blocks.1.attn.out"] - plain["blocks.1.attn.head_out"][:, :, 0]),
                               rtol=1e-4, atol=1e-5)
    assert np.abs(np.asarray(edited - logits)).max() > 1e-5, "the class logits change through the head"
    np.testing.assert_allclose(np.asarray(run(params, cfg, x, [ablate_heads(cfg, mask)])[0]), np.asarray(edited),
                               rtol=1e-5, atol=1e-6)


def test_bad_configs_and_images_get_one_line_errors():
    bad = {"not a multiple of patch_size": dict(image_size=10, patch_size=4),
           "does not take mask='causal'": dict(mask="causal"),
           "set cls_token=True, or pool='mean'": dict(cls_token=False),
           "does not take tie_embeddings": dict(tie_embeddings=True),
           "does not take position='rope'": dict(position="rope"),
           "divisible by 4": dict(position="sinusoidal", d_model=18, num_heads=2),
           "max_seq_len=16 is below": dict(max_seq_len=16),
           "num_classes >= 2": dict(num_classes=0)}
    for message, changes in bad.items():
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
            vit_cfg(**changes)
    with pytest.raises(ValueError, match="read with inputs='image' only"):
        ModelConfig(vocab_size=8, max_seq_len=8, d_model=16, num_layers=1, num_heads=2, image_size=8)
    with pytest.raises(ValueError, match="attention_window"):
        ModelConfig(vocab_size=8, max_seq_len=8, d_model=16, num_layers=1, num_heads=2, mask="bidirectional",
                    attention_window=4)
    cfg = vit_cfg()
    params = init_params(cfg, jax.random.key(0))
    for images, message in ((np.zeros((1, 8, 8, 1)), "got 1 channels; convert them to 3 channels"),
                            (np.zeros((8, 8, 3)), r"shape \(8, 8, 3\); resize them"),
                            (np.zeros((1, 12, 12, 3)), r"shape \(1, 12, 12, 3\); resize them")):
        with pytest.raises(ValueError, match=message) as error:
            Decoder(cfg).apply({"params": params}, images)
        assert "\n" not in str(error.value)


# --- the data task -------------------------------------------------------------------------------------

from configs.vit import get_config as vit_config  # noqa: E402
from configs.vit_digits import get_config as digits_config  # noqa: E402
from transformer.experiments.catalog import data_task, eval_metrics  # noqa: E402


def test_the_image_task_gives_batches_of_pictures_and_their_class():
    for config, shape, classes in ((vit_config(), (8, 32, 32, 3), 3), (digits_config(), (8, 8, 8, 1), 10)):
        task = data_task(config)
        assert not task.text and [m.name for m in eval_metrics(config)] == ["table_accuracy"]
        x, y = task.batch_at(None, seed=0, step=2, batch_size=8, seq_len=17)
        again, _ = task.batch_at(None, seed=0, step=2, batch_size=8, seq_len=17)
        assert x.shape == shape and x.dtype == np.float32 and y.shape == (8, 1) and y.dtype == np.int32
        assert set(y.ravel()) <= set(range(classes)) and np.array_equal(x, again)
        assert not np.array_equal(x, task.batch_at(None, seed=0, step=3, batch_size=8, seq_len=17)[0])
        held = task.eval_batches(None, num_batches=2, batch_size=8, seq_len=17)
        assert len(held) == 2 and held[0][0].shape == shape and not np.array_equal(held[0][0], held[1][0])
    test = images.digits("test")
    held = data_task(digits_config()).eval_batches(None, num_batches=1, batch_size=8, seq_len=17)
    np.testing.assert_array_equal(held[0][0], test["images"][:8])  # the held-out digits, never a training one
    wrong = vit_config()
    wrong.model.channels = 1
    with pytest.raises(ValueError, match="set model.inputs='image', image_size=32, channels=3"):
        data_task(wrong)
    wrong = vit_config()
    wrong.data.images.name = "cifar"
    with pytest.raises(ValueError, match="not an image set"):
        data_task(wrong)


@pytest.mark.slow
def test_catalog_trains_the_digits_config_a_few_steps(tmp_path):
    from transformer.experiments.catalog import train
    from transformer.load import load_run

    config = digits_config()
    config.train.steps, config.train.eval_every, config.train.checkpoint_every = 4, 4, 4
    config.train.eval_batches, config.train.batch_size, config.train.log_every = 1, 8, 2
    train(config, str(tmp_path / "digits"))
    rows = [line for line in (tmp_path / "digits" / "metrics.jsonl").read_text().splitlines() if "val_accuracy" in line]
    assert len(rows) == 1 and not (tmp_path / "digits" / "tokenizer").exists()
    cfg, params, _ = load_run(str(tmp_path / "digits"))
    assert cfg.inputs == "image" and params["patch_embed"]["kernel"].shape == (64, 4)
