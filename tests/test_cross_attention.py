"""Cross-attention (model.cross_attention, inputs='image_text'): a byte decoder reading a ViT encoder's tokens.

The cache holds the encoder's keys and values from the prefill on, and decoding never runs the encoder
again; the cross pattern is a named point, its heads switch off like self-attention's; the vqa task's
batches grade the answer alone and its chance line is the majority answer per question."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.analysis.capture import capture
from transformer.data.batches import IGNORED
from transformer.experiments.vqa import questions
from transformer.experiments.vqa.answers import answer_attention, answer_span, exact_match, object_patches, object_shares
from transformer.model import kv_cache
from transformer.model.config import ModelConfig
from transformer.model.decoder import Decoder, example_input
from transformer.model.edits import ablate_heads, run
from transformer.sampling.sampler import generate

VIT = dict(vocab_size=1, max_seq_len=16, d_model=16, num_layers=1, num_heads=2, tie_embeddings=False, inputs="image",
           mask="bidirectional", image_size=8, patch_size=4, channels=3, pool="mean", num_classes=2)


def tiny(**changes) -> ModelConfig:
    fields = dict(vocab_size=32, max_seq_len=16, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2,
                  inputs="image_text", cross_attention=True, encoder=VIT)
    return ModelConfig(**{**fields, **changes})


def setup(cfg: ModelConfig, batch: int = 2, length: int = 10, seed: int = 0):
    params = Decoder(cfg).init(jax.random.key(seed), example_input(cfg, 4))["params"]
    rng = np.random.default_rng(seed)
    image = jnp.asarray(rng.random((batch, 8, 8, 3)), jnp.float32)
    tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, (batch, length)), jnp.int32)
    return params, image, tokens


def cached_logits(params, cfg, image, tokens, prompt: int, step_image=None):
    """Prefill `prompt` tokens with the image, then one decoding step per token (the sampler's path);
    step_image: passed to every step too (the encoder must not read it)."""
    apply = jax.jit(lambda data, positions, cache: Decoder(cfg).apply({"params": params}, data, positions, cache))
    cache = kv_cache.init_cache(cfg, tokens.shape[0], cfg.max_seq_len)
    logits, cache = apply({"image": image, "tokens": tokens[:, :prompt]}, None, cache)
    out = [logits]
    for t in range(prompt, tokens.shape[1]):
        step = tokens[:, t:t + 1] if step_image is None else {"image": step_image, "tokens": tokens[:, t:t + 1]}
        logits, cache = apply(step, jnp.full((tokens.shape[0], 1), t), cache)
        out.append(logits)
    return jnp.concatenate(out, axis=1), cache


@pytest.mark.parametrize("changes", [{}, {"scan_layers": False, "prenorm": False},
                                     {"qk_norm": True, "sublayer_out_norm": True, "attention_sink": True}])
def test_cached_decoding_equals_the_full_forward(changes):
    cfg = tiny(**changes)
    params, image, tokens = setup(cfg)
    full, _ = Decoder(cfg).apply({"params": params}, {"image": image, "tokens": tokens})
    stepped, cache = cached_logits(params, cfg, image, tokens, prompt=4)
    np.testing.assert_allclose(stepped, full, atol=1e-5)
    s = cfg.encoder.image_tokens
    assert cache[0].cross_k.shape == (2, cfg.num_kv_heads, s, cfg.head_dim)  # [B, G, S, K], never grown


def test_a_decoding_step_does_not_run_the_encoder():
    cfg = tiny()
    params, image, tokens = setup(cfg)
    plain, _ = cached_logits(params, cfg, image, tokens, prompt=4)
    garbage, _ = cached_logits(params, cfg, image, tokens, prompt=4, step_image=jnp.full_like(image, 1e6))
    wrong_size, _ = cached_logits(params, cfg, image, tokens, prompt=4, step_image=jnp.zeros((2, 5, 5, 1)))
    np.testing.assert_array_equal(garbage, plain)
    np.testing.assert_array_equal(wrong_size, plain)  # the encoder would refuse this image: it is not run
    other = jnp.flip(image, axis=1)  # the prefill's image does matter
    assert not np.allclose(cached_logits(params, cfg, other, tokens, prompt=4)[0], plain, atol=1e-4)


def test_the_sampler_answers_from_the_image_as_the_forward_pass_does():
    cfg = tiny()
    params, image, tokens = setup(cfg)
    prompts = [tokens[0, :3].tolist(), tokens[1, :5].tolist()]
    out = generate(params, cfg, prompts, 0, 4, images=image, temperature=0.0)
    forward = jax.jit(lambda data: Decoder(cfg).apply({"params": params}, data)[0])
    for b, prompt in enumerate(prompts):  # greedy without a cache: one full forward per token
        row = np.zeros((1, 9), np.int32)
        row[0, :len(prompt)] = prompt
        for t in range(len(prompt), len(prompt) + 4):  # causal: the zeros after t change nothing before it
            row[0, t] = int(forward({"image": image[b:b + 1], "tokens": row})[0, t - 1].argmax())
        assert out.tokens[b].tolist() == row[0, len(prompt):len(prompt) + 4].tolist()
    with pytest.raises(ValueError, match="images="):
        generate(params, cfg, prompts, 0, 4)


def test_the_cross_pattern_is_a_point_that_sums_to_one_over_the_encoder_tokens():
    cfg = tiny(scan_layers=False)
    params, image, tokens = setup(cfg)
    _, _, got = capture(params, cfg, {"image": image, "tokens": tokens}, ["blocks.*.cross.pattern", "blocks.1.cross.z"])
    pattern = got["blocks.*.cross.pattern"]
    assert pattern.shape == (2, 2, 4, 10, cfg.encoder.image_tokens)  # [L, B, H, T, S]
    np.testing.assert_allclose(pattern.sum(-1), 1.0, atol=1e-5)
    assert got["blocks.1.cross.z"].shape == (2, 10, 4, cfg.head_dim)


def test_a_cross_head_switched_off_changes_the_output_only_through_that_head():
    cfg = tiny()
    params, image, tokens = setup(cfg)
    data, names = {"image": image, "tokens": tokens}, ["blocks.0.cross.z", "blocks.0.cross.head_out", "blocks.0.cross.out"]
    _, _, plain = capture(params, cfg, data, names)
    mask = np.ones((cfg.num_layers, cfg.num_heads), np.float32)
    mask[0, 1] = 0.0
    _, _, off = capture(params, cfg, data, names, edits=[ablate_heads(cfg, mask, sublayer="cross")])
    z, z_off = plain["blocks.0.cross.z"], off["blocks.0.cross.z"]
    np.testing.assert_array_equal(z_off[:, :, 1], 0.0)
    np.testing.assert_array_equal(z_off[:, :, [0, 2, 3]], z[:, :, [0, 2, 3]])
    head = plain["blocks.0.cross.head_out"][:, :, 1]  # [B, T, D]: its share of the output
    np.testing.assert_allclose(off["blocks.0.cross.out"], plain["blocks.0.cross.out"] - head, atol=1e-5)
    changed = run(params, cfg, data, [ablate_heads(cfg, mask, sublayer="cross")])[0]
    assert not np.allclose(changed, Decoder(cfg).apply({"params": params}, data)[0], atol=1e-5)


def test_vqa_batches_grade_the_answer_bytes_only():
    drawn = questions.draw(16, 3)
    inputs, targets = questions.encode(drawn, 32)
    assert inputs["image"].shape == (16, 32, 32, 3) and inputs["tokens"].shape == targets.shape == (16, 32)
    for b in range(16):
        prompt, answer = drawn["prompt"][b].encode(), drawn["answer_text"][b].encode()
        graded = np.flatnonzero(targets[b] != IGNORED)
        assert graded.tolist() == list(range(len(prompt) - 1, len(prompt) + len(answer) - 1))
        assert bytes(targets[b, graded].astype(np.uint8)) == answer  # the answer and END, nothing else
        assert bytes(inputs["tokens"][b, :len(prompt)].astype(np.uint8)) == prompt
        asked, about, value = questions.QUESTIONS[drawn["question"][b]]
        named = drawn[about][b] == value
        assert named.sum() == 1 and named[drawn["target"][b]]  # defined: exactly one object named
        assert drawn[asked][b, drawn["target"][b]] == drawn["answer"][b]
    again, _ = questions.encode(questions.draw(16, 3), 32)
    np.testing.assert_array_equal(again["tokens"], inputs["tokens"])  # a function of the seed alone


def test_the_chance_line_is_the_majority_answer_per_question_on_the_training_draw():
    train = {"question": np.array([0, 0, 0, 1, 1, 2]), "answer": np.array([2, 2, 1, 3, 0, 1])}
    test = {"question": np.array([0, 0, 1, 1, 3]), "answer": np.array([2, 1, 0, 3, 0])}
    assert questions.majority_answers(train["question"], train["answer"]) == {0: 2, 1: 0, 2: 1}  # a tie: smaller
    assert questions.chance_accuracy(train, test) == pytest.approx(2 / 5)  # q0 -> 2 right once, q1 -> 0 once, q3 unseen


def test_exact_match_and_the_answer_bytes_attention_on_the_object():
    cfg = tiny(num_layers=1, max_seq_len=40, vocab_size=256, encoder={**VIT, "image_size": 32, "patch_size": 16})
    drawn = questions.draw(4, 1)
    inputs, targets = questions.encode(drawn, 32)
    params = Decoder(cfg).init(jax.random.key(0), example_input(cfg, 4))["params"]
    assert exact_match(params, cfg, inputs, targets).shape == (4,)  # prefill and decode: jitted each
    weights = np.asarray(answer_attention(params, cfg, inputs, targets))  # [L, B, H, N, S]
    graded = np.asarray(weights.sum(-1)[0, :, 0] > 0.5)
    assert weights.shape[:3] == (1, 4, 4) and weights.shape[-1] == 4  # [L, B, H, N, S]: 2 x 2 patches
    np.testing.assert_allclose(weights.sum(-1), np.broadcast_to(answer_span(targets)[2][None, :, None], weights.shape[:-1]),
                               atol=1e-5)  # each answer byte's weights sum to 1, the rows past it are zeros
    shares = object_shares(weights, graded, drawn, cfg.encoder)
    assert shares["share"].shape == (1, 4) and 0 < shares["chance"] < 1
    masks = np.zeros((1, 8, 8), bool)
    masks[0, 5, 1] = True  # a pixel in patch row 1, column 0 of a 2 x 2 grid of 4 x 4 patches
    assert object_patches(masks, 4).tolist() == [[False, False, True, False]]


def test_bad_inputs_get_one_line_errors():
    cfg = tiny()
    params, image, tokens = setup(cfg)
    apply = lambda data: Decoder(cfg).apply({"params": params}, data)  # noqa: E731
    for bad, match in [(jnp.zeros((2, 6, 6, 3)), "image_size=8"), (jnp.zeros((2, 8, 8, 1)), "1 channels")]:
        with pytest.raises(ValueError, match=match) as error:
            apply({"image": bad, "tokens": tokens})
        assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match="past the model's context"):
        apply({"image": image, "tokens": jnp.zeros((2, cfg.max_seq_len + 1), jnp.int32)})
    with pytest.raises(ValueError, match="past train.seq_len=16"):
        questions.encode(questions.draw(4, 0), 16)
    with pytest.raises(ValueError, match="pass the image"):
        apply(tokens)
    with pytest.raises(ValueError, match="one image per row"):
        apply({"image": image[:1], "tokens": tokens})
    with pytest.raises(ValueError, match="context of max_seq_len"):
        generate(params, cfg, [[1] * 15], 0, 4, images=image[:1])


def test_the_config_checks_cross_attention_and_its_encoder_in_one_line():
    with pytest.raises(ValueError, match="needs all three"):
        tiny(cross_attention=False)
    with pytest.raises(ValueError, match=r"^ModelConfig\.encoder: image_size=6 is not a multiple of patch_size=4"):
        tiny(encoder={**VIT, "image_size": 6})
    with pytest.raises(ValueError, match=r"ModelConfig\.encoder.*mask='bidirectional'"):
        tiny(encoder={**VIT, "mask": "causal"})
    with pytest.raises(ValueError, match="attention='mha'"):
        tiny(attention="mla", kv_latent_dim=8)
    cfg = tiny()
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg and isinstance(cfg.to_dict()["encoder"], dict)
    assert hash(cfg.replace(d_model=64)) != hash(cfg)


@pytest.mark.slow
def test_configs_vqa_trains_a_few_steps(tmp_path):
    from transformer.experiments import catalog
    from transformer.run.config_files import load_config_file

    config = load_config_file("configs/vqa.py")
    config.train.steps, config.train.eval_every, config.train.checkpoint_every = 3, 3, 3
    config.train.log_every, config.train.eval_batches, config.train.batch_size = 1, 1, 8
    last_eval = catalog.train(config, str(tmp_path / "run"))
    assert 0.0 <= last_eval["val_exact_match"] <= 1.0
