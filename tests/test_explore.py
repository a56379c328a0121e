"""The attention explorer's numbers (transformer/analysis/explore.py): what the page shows is what the model
computes. The page itself is driven in a browser by tests/test_explore_browser.py.

Tiny random models (tests/helpers/decoder.py draws weights at std 0.25, so attention is far from
uniform) of every attention variant; an imported Hugging Face model against `transformers`' own
attention weights.
"""

import functools
import json
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers.marks import first_fast
from tests.helpers.decoder import jit, make_cfg, random_params
from transformer.analysis.capture import capture
from transformer.analysis.explore import explore, head_masks, mask_key, token_label
from transformer.model.edits import ablate_heads
from transformer.model.decoder import Decoder
from transformer.data.tokenizer import ByteTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPTS = [[5, 9, 1, 33, 7, 2, 61], [12, 3, 40]]  # different lengths: the shorter is padded in the batch


def model(attention):
    cfg = make_cfg(attention, "rope")
    return cfg, random_params(Decoder(cfg))


def direct(cfg, params, tokens, head_mask=None):
    """(attention [L, H, T, T], next-token probabilities [V]) of one prompt, straight from a capture."""
    attention, probs = _direct(cfg, params, jnp.asarray(tokens)[None], head_mask)
    return np.asarray(attention[:, 0]), np.asarray(probs)


@functools.partial(jit, static_argnums=0)
def _direct(cfg, params, tokens, head_mask):
    off = [] if head_mask is None else [ablate_heads(cfg, head_mask)]
    logits, _, got = capture(params, cfg, tokens, ["blocks.*.attn.pattern"], edits=off)
    return got["blocks.*.attn.pattern"], jax.nn.softmax(logits[0, -1])


@pytest.mark.parametrize("attention", ["mha", "gqa", "mqa", "mla_q_rope"])
def test_attention_and_statistics_are_the_models(attention):
    cfg, params = model(attention)
    ex = explore(params, PROMPTS, cfg=cfg, top_k=5)
    L, H = cfg.num_layers, cfg.num_heads
    for view, tokens in zip(ex.prompts, PROMPTS):
        T = len(tokens)
        a = view.attention
        assert a.shape == (L, H, T, T) and view.tokens == tokens
        np.testing.assert_allclose(a, direct(cfg, params, tokens)[0], atol=1e-5)  # padding changes nothing
        np.testing.assert_allclose(a.sum(-1), 1, atol=1e-5)
        assert np.all(np.triu(a, 1) == 0)  # causal
        assert view.key_positions == list(range(T)) and view.first_key == 0
        rows = a[:, :, 1:]  # queries t >= 1
        np.testing.assert_allclose(view.first_token_share, rows[..., 0].mean(-1), rtol=1e-6)
        assert view.first_token_share.shape == view.entropy.shape == (L, H)
        assert np.all(view.entropy >= 0) and np.all(view.entropy <= np.log(T) + 1e-5)
        assert view.entropy.std() > 0.01  # heads differ: the statistics are per head, not one number


def test_masked_top_k_equals_a_direct_head_mask_forward():
    cfg, params = model("gqa")
    ex = explore(params, PROMPTS, cfg=cfg, top_k=6)
    L, H = cfg.num_layers, cfg.num_heads
    assert len(ex.masks) == 1 + L * H + L
    one_head, one_layer = np.ones((L, H)), np.ones((L, H))
    one_head[1, 2] = 0
    one_layer[0] = 0
    for b, tokens in enumerate(PROMPTS):
        for mask in (np.ones((L, H)), one_head, one_layer):
            probs = direct(cfg, params, tokens, jnp.asarray(mask))[1]
            top = np.argsort(-probs)[:6]
            got = ex.top_tokens(b, mask)
            assert [t for t, _ in got] == top.tolist()
            np.testing.assert_allclose([p for _, p in got], probs[top], rtol=1e-5)
        # Switching a head off changes the prediction: the masks reach the model.
        assert ex.top_tokens(b, one_head) != ex.top_tokens(b)
    two_heads = one_head.copy()
    two_heads[0, 0] = 0
    assert ex.mask_index(two_heads) is None
    with pytest.raises(ValueError, match="not precomputed.*extra_masks"):
        ex.top_tokens(0, two_heads)
    ex = explore(params, PROMPTS[:1], cfg=cfg, extra_masks=[two_heads, one_head])
    assert len(ex.masks) == 1 + L * H + L + 1  # one_head was there already
    probs = direct(cfg, params, PROMPTS[0], jnp.asarray(two_heads))[1]
    assert ex.top_tokens(0, two_heads)[0] == (int(probs.argmax()), pytest.approx(float(probs.max()), rel=1e-5))
    assert ex.coverage().endswith("and L1H1, L2H3 off")


def test_the_page_embeds_its_data_and_loads_nothing():
    cfg, params = model("mha")
    tokenizer = ByteTokenizer()
    cfg = cfg.replace(vocab_size=256, max_seq_len=32)
    params = random_params(Decoder(cfg))
    ex = explore(params, ["ROMEO: </script><b>", "a\nb"], cfg=cfg, tokenizer=tokenizer, top_k=3)
    page = ex.html()
    embedded = re.search(r'<script type="application/json" id="explorer-data">(.*?)</script>', page, re.S).group(1)
    data = json.loads(embedded)
    assert data == json.loads(json.dumps(ex.data()))
    assert data["prompts"][0]["text"] == "ROMEO: </script><b>"  # the prompt cannot close the element
    assert data["prompts"][1]["query_labels"] == ["a", "⏎", "b"]
    rows = data["prompts"][1]["attention"]  # [L][H][T][keys up to the query's own]: integers
    assert [len(r) for r in rows[0][0]] == [1, 2, 3] and data["prompts"][1]["attention_scale"] == 10**4
    np.testing.assert_array_equal(rows[1][2][2], np.rint(ex.prompts[1].attention[1, 2, 2] * 10**4))
    assert not re.search(r"https?:|//[a-z]|\bsrc=|\bhref=|import\(|fetch\(", page)  # nothing from a network
    keys = [m["key"] for m in data["masks"]]
    assert keys[0] == "1" * 8 and set(data["prompts"][0]["top"]) == set(keys)
    L0H1_off = np.ones((2, 4))
    L0H1_off[0, 1] = 0
    assert mask_key(L0H1_off) == "10111111"
    assert data["prompts"][0]["top"][mask_key(L0H1_off)] == [
        [t, ex.labels[t], round(p, 6)] for t, p in ex.top_tokens(0, L0H1_off)]
    # A byte of a multi-byte character decodes to U+FFFD alone: shown by its id instead.
    assert ex.labels and all(label == (token_label(chr(t)) if t < 128 else f"#{t}") for t, label in ex.labels.items())
    assert 'srcdoc="' in ex._repr_html_() and "<script" not in ex._repr_html_()  # escaped into the iframe


def test_bad_input_is_named(tmp_path):
    cfg, params = model("mha")
    with pytest.raises(ValueError, match="needs the model's config"):
        explore(params, [[1, 2]])
    with pytest.raises(ValueError, match="step picks a checkpoint of a run"):
        explore(params, [[1, 2]], cfg=cfg, step=3)
    with pytest.raises(ValueError, match="needs the model's tokenizer"):
        explore(params, "text", cfg=cfg)
    with pytest.raises(ValueError, match="the prompt has 20 tokens.*max_tokens=12"):
        explore(params, [list(range(20))], cfg=cfg, max_tokens=12)
    with pytest.raises(ValueError, match=r"not a 0/1 array \[L, H\] = \[2, 4\]"):
        head_masks(cfg, [np.ones((4, 2))])
    with pytest.raises(FileNotFoundError, match="workdir .* does not exist"):
        explore(str(tmp_path / "nothing"), "x")
    ex = explore(params, [[1, 2]], cfg=cfg)
    with pytest.raises(FileNotFoundError, match="no folder .*create it first"):
        ex.save(tmp_path / "missing" / "x.html")


def test_a_prompt_filling_the_context_is_explored_and_ids_the_tokenizer_lacks_are_shown_by_id():
    """#31: a text prompt of exactly max_seq_len tokens was refused, "leaving no room for new tokens",
    though the explorer generates none. A head larger than the tokenizer lists its extra ids as '#id'."""
    cfg, _ = model("mha")
    cfg = cfg.replace(vocab_size=300, max_seq_len=16)
    params = random_params(Decoder(cfg))
    ex = explore(params, "x" * 16, cfg=cfg, tokenizer=ByteTokenizer(), top_k=300, max_tokens=16)
    assert ex.prompts[0].attention.shape[-2:] == (16, 16)
    assert all(ex.labels[t] == f"#{t}" for t in range(256, 300))
    with pytest.raises(ValueError, match="the prompt has 17 tokens but the model's context is max_seq_len=16; "):
        explore(params, "x" * 17, cfg=cfg, tokenizer=ByteTokenizer(), max_tokens=32)


def test_the_command_line_checks_out_before_loading(tmp_path, capsys):
    """#31: --out naming a folder failed with IsADirectoryError after the model was loaded; numbers out of
    range are named before loading too."""
    from transformer.explore import main

    page = str(tmp_path / "p.html")
    for flags, message in [(["--out", str(tmp_path)], f"error: cannot save the explorer to {tmp_path}: it is a "
                                                      f"folder; name a file, e.g. {tmp_path / 'explorer.html'}"),
                           (["--out", str(tmp_path / "no" / "p.html")], "no folder"),
                           (["--out", page, "--top_k", "0"], "error: --top_k 0 must be at least 1 (the default is 10)"),
                           (["--out", page, "--max_tokens", "-3"],
                            "error: --max_tokens -3 must be at least 1 (the default is 96)"),
                           (["--out", page, "--step", "-1"],
                            "error: --step -1: checkpoint steps are >= 0; leave --step out for the latest")]:
        with pytest.raises(SystemExit) as exit:
            main(["--workdir", str(tmp_path / "never_read"), "--prompt", "x", *flags])
        err = capsys.readouterr().err
        assert exit.value.code == 1 and len(err.splitlines()) == 1 and message in err


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_an_imported_hugging_face_model_shows_transformers_attention(family, tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformer.hf import from_hf

    torch.manual_seed(0)
    if family == "gpt2":
        config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=256, n_positions=32,
                                         initializer_range=0.2)
        hf = transformers.GPT2LMHeadModel(config)
    else:  # grouped-query attention with RoPE
        config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                                          num_key_value_heads=2, intermediate_size=48, vocab_size=256,
                                          max_position_embeddings=32, initializer_range=0.2)
        hf = transformers.LlamaForCausalLM(config)
    hf.config._attn_implementation = "eager"  # the implementation that returns attention weights
    hf.eval().save_pretrained(tmp_path)
    cfg, params = from_hf(tmp_path)  # the folder, as a user imports it
    ex = explore(params, ["Hello there"], cfg=cfg, tokenizer=ByteTokenizer(), top_k=4)
    tokens = torch.tensor([list(b"Hello there")])
    with torch.no_grad():
        out = hf(tokens, output_attentions=True)
    want = np.stack([a[0].numpy() for a in out.attentions])  # [L, H, T, T]
    np.testing.assert_allclose(ex.prompts[0].attention, want, atol=1e-5)
    probs = torch.softmax(out.logits[0, -1], -1).numpy()
    assert [t for t, _ in ex.top_tokens(0)] == np.argsort(-probs)[:4].tolist()


def test_command_line_writes_a_page_from_a_hugging_face_folder(tmp_path):
    from transformer.hf import to_hf

    cfg = make_cfg("gqa", "rope").replace(vocab_size=256, max_seq_len=32)
    to_hf(cfg, random_params(Decoder(cfg)), tmp_path / "model", tokenizer=ByteTokenizer())
    out = tmp_path / "page.html"
    run = lambda *args: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "transformer.explore", *args], cwd=ROOT, capture_output=True, text=True,
        timeout=300, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    done = run("--hf_dir", str(tmp_path / "model"), "--prompt", "ROMEO:", "--prompt", "JULIET:", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "2 prompt(s), 2 layers x 4 heads, 11 head masks precomputed" in done.stdout
    data = json.loads(re.search(r'id="explorer-data">(.*?)</script>', out.read_text(), re.S).group(1))
    assert [p["text"] for p in data["prompts"]] == ["ROMEO:", "JULIET:"]
    done = run("--workdir", str(tmp_path / "nothing"), "--prompt", "x", "--out", str(out))
    assert done.returncode == 1 and done.stderr.startswith("error: workdir ") and "Traceback" not in done.stderr


def test_the_page_ships_with_the_package_and_its_tools_are_extras():
    import fnmatch
    import tomllib

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        pyproject = tomllib.load(f)
    shipped = pyproject["tool"]["setuptools"]["package-data"]["transformer.analysis"]
    for name in ("explorer_page/page.html", "explorer_page/explorer.js"):  # what explore() reads with importlib.resources
        assert os.path.isfile(os.path.join(ROOT, "transformer", "analysis", name))
        assert any(fnmatch.fnmatch(name, pattern) for pattern in shipped), f"{name} is not package data"
    core = " ".join(pyproject["project"]["dependencies"])
    extras = pyproject["project"]["optional-dependencies"]
    assert "playwright" not in core and "treescope" not in core
    assert any(d.startswith("playwright") for d in extras["dev"])
    assert any(d.startswith("treescope") for d in extras["notebooks"]) and any(d.startswith("treescope") for d in extras["dev"])


@pytest.mark.parametrize("attention", first_fast(["mha", "mla_q_rope"]))
def test_a_sink_and_registers_are_labelled_columns_and_their_shares_are_sinks(attention):
    """With attention_sink and 2 registers: the page's columns are [sink, reg 1, reg 2, tokens], the
    Decoder's weights reordered; the shares are transformer/experiments/sinks/sinks.py's; masked top-k is the model's."""
    from transformer.experiments.sinks.sinks import attention_shares

    cfg = make_cfg(attention, "rope", attention_sink=True, num_registers=2)
    params = random_params(Decoder(cfg))
    ex = explore(params, PROMPTS + [[4]], cfg=cfg, top_k=5)  # and a one-token prompt
    L, H = cfg.num_layers, cfg.num_heads
    for b, tokens in enumerate(PROMPTS):
        view, T = ex.prompts[b], len(tokens)
        assert view.key_labels[:3] == ["sink", "reg 1", "reg 2"] and view.key_positions == [None] * 3 + list(range(T))
        assert view.first_key == 3 and view.attention.shape == (L, H, T, 3 + T)
        w = direct(cfg, params, tokens)[0]  # [L, H, T, R + T + 1]: registers, tokens, sink
        np.testing.assert_allclose(view.attention, np.concatenate([w[..., -1:], w[..., :-1]], -1), atol=1e-5)
        want = attention_shares(params, cfg, jnp.asarray(tokens)[None])
        np.testing.assert_allclose(view.first_token_share, want.first_token, atol=1e-6)
        np.testing.assert_allclose(view.register_share, want.registers, atol=1e-6)
        np.testing.assert_allclose(view.sink_share, want.sink, atol=1e-6)
        np.testing.assert_allclose(view.first_token_share, view.attention[:, :, 1:, 3].mean(-1), atol=1e-6)  # column 3
        assert view.sink_share.min() > 0 and view.register_share.min() > 0  # the columns carry attention
        assert np.all(view.entropy <= np.log(T + 3) + 1e-5)
        one_head = np.ones((L, H))
        one_head[1, 0] = 0
        for mask in (np.ones((L, H)), one_head):
            probs = direct(cfg, params, tokens, jnp.asarray(mask))[1]
            got = ex.top_tokens(b, mask)
            assert [t for t, _ in got] == np.argsort(-probs)[:5].tolist()
            np.testing.assert_allclose([p for _, p in got], np.sort(probs)[::-1][:5], rtol=1e-5)
    one = ex.prompts[2]  # a single query: its own row is the share
    np.testing.assert_allclose(one.sink_share, one.attention[:, :, 0, 0], atol=1e-6)
    data = ex.data()
    prompt = data["prompts"][0]
    assert [len(r) for r in prompt["attention"][0][0]] == [4 + t for t in range(len(PROMPTS[0]))]  # extras kept
    assert np.array(prompt["sink_share"]).shape == np.array(prompt["register_share"]).shape == (L, H)
    assert data["model"]["attention_sink"] is True and data["model"]["num_registers"] == 2
    plain_cfg, plain_params = model("mha")
    plain = explore(plain_params, [[1, 2]], cfg=plain_cfg).data()["prompts"][0]
    assert plain["sink_share"] is None and plain["register_share"] is None


def test_the_layout_takes_extra_key_columns_seen_by_every_query():
    """Keys that are not prompt tokens (the sink, registers) are extra leading columns with position
    None; the stored rows keep them for every query."""
    from transformer.analysis.explore import PromptView, _stored_rows

    T = 3
    a = np.zeros((1, 1, T, T + 1), np.float32)
    for t in range(T):
        a[0, 0, t, : t + 2] = 1 / (t + 2)  # the extra column and the tokens up to t
    view = PromptView(text="abc", tokens=[1, 2, 3], query_labels=list("abc"), key_labels=["<sink>", *"abc"],
                      key_positions=[None, 0, 1, 2], first_key=1, attention=a, first_token_share=np.zeros((1, 1)),
                      entropy=np.zeros((1, 1)), next_probs=np.zeros((1, 4)))
    assert _stored_rows(view) == [[[[5000, 5000], [3333, 3333, 3333], [2500, 2500, 2500, 2500]]]]
