"""The attention explorer's page in a real browser: Debian's chromium, headless, driven by Playwright
(its Python package only: no browser of its own is downloaded).

A page saved from a tiny random model is opened from its file; the test checks that the map and the
thumbnails are drawn from the weights (every future cell grey, every visible cell on the colour scale,
lighter where the model's weight is higher), then clicks a layer, a head, a thumbnail and head toggles
and reads the numbers the page shows back against those transformer/analysis/explore.py computed.

Without chromium (`apt-get install chromium`) or playwright (the `dev` extra) the test is skipped,
except in CI (CI=true), where .ci/run installs chromium and a skip would hide a broken page.

EXPLORER_SCREENSHOT=path also saves a screenshot of the page there (the README's docs/figures/
explorer.png); EXPLORER_WORKDIR=runs/NAME makes the page from that trained run instead of the tiny
model, with the same checks:

    EXPLORER_WORKDIR=runs/shakespeare EXPLORER_SCREENSHOT=docs/figures/explorer.png \\
        .venv/bin/python -m pytest -q tests/test_explore_browser.py
"""

import contextlib
import os
import shutil
from decimal import ROUND_HALF_UP, Decimal

import numpy as np
import pytest

from tests.helpers.decoder import make_cfg, random_params
from transformer.analysis.explore import explore
from transformer.model.decoder import Decoder
from transformer.data.tokenizer import ByteTokenizer

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
PROMPTS = ["ROMEO:\nBut soft, what light", "JULIET:\nO Romeo"]
MASKED, WHITE = [238, 238, 238], [255, 255, 255]  # the page's grey for a key after its query; the canvas's ground
# Weights this far apart get colours at least a whole 8-bit step apart along the page's scale; closer ones
# may share a colour, or swap by one rounding step of a channel (up to 0.004 apart, near weight 1).
RESOLUTION = 0.01



def browser_or_skip():
    """playwright's sync API, or a skip (a failure in CI) naming what is missing."""
    missing = []
    if not (os.path.exists(CHROMIUM) or shutil.which("chromium")):
        missing.append(f"chromium ({CHROMIUM}; apt-get install -y chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing.append("playwright (pip install playwright, in the dev extra)")
    if missing:
        message = f"the browser test needs {' and '.join(missing)}"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message}: .ci/run installs them; in CI this test must run, not skip")
        pytest.skip(message)
    return sync_playwright


@contextlib.contextmanager
def chromium(sync_playwright):
    """The system's chromium, headless, through Playwright; closed afterwards."""
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM if os.path.exists(CHROMIUM) else shutil.which("chromium"),
                                    args=ARGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture(scope="module")
def exploration():
    if os.environ.get("EXPLORER_WORKDIR"):
        return explore(os.environ["EXPLORER_WORKDIR"], PROMPTS, top_k=8)
    cfg = make_cfg("gqa", "rope").replace(vocab_size=256, max_seq_len=32, num_layers=3)
    return explore(random_params(Decoder(cfg)), PROMPTS, cfg=cfg, tokenizer=ByteTokenizer(), top_k=6)


def fmt(x):
    """x with 4 decimals as JavaScript's toFixed(4) writes it: the double's exact value, halves up."""
    return str(Decimal(x).quantize(Decimal("0.0001"), ROUND_HALF_UP))


def test_the_page_in_chromium(exploration, tmp_path):
    """The page in chromium: maps coloured by the selected head's weights, the buttons, the pointer's
    readout, the head toggles' next tokens, a second prompt; no errors and no network."""
    sync_playwright = browser_or_skip()
    ex, data = exploration, exploration.data()
    L, H = ex.masks.shape[1:]
    path = ex.save(tmp_path / "explorer.html")
    with chromium(sync_playwright) as browser:
        page = browser.new_page(viewport={"width": 1500, "height": 760})
        errors, requests = [], []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("request", lambda r: requests.append(r.url))
        page.goto(f"file://{path}")

        prompt = data["prompts"][0]
        T = len(prompt["tokens"])
        assert page.locator("#grid canvas").count() == L * H
        assert page.locator("#layer-buttons button").count() == L and page.locator("#head-buttons button").count() == H
        check_map(page, ex.prompts[0], 0, 0)
        check_thumbnails(page, ex.prompts[0])

        # A layer, then a head: the map, the title and the statistics follow.
        page.click(f"#layer-buttons button[data-layer='{L - 1}']")
        page.click(f"#head-buttons button[data-head='{H - 1}']")
        check_map(page, ex.prompts[0], L - 1, H - 1)
        assert page.text_content("#map-title").startswith(f"layer {L}, head {H}:")
        assert page.text_content("#stat-share") == fmt(prompt["first_token_share"][L - 1][H - 1])
        assert page.text_content("#stat-entropy") == fmt(prompt["entropy"][L - 1][H - 1])
        np.testing.assert_allclose(float(page.text_content("#stat-share")),
                                   ex.prompts[0].first_token_share[L - 1, H - 1], atol=5e-5)
        for part, shares in [("#stat-sink-part", "sink_share"), ("#stat-register-part", "register_share")]:
            assert page.is_hidden(part) == (prompt[shares] is None)  # shown only for a model that has them

        # The pointer over cell (t, s): its value and its two tokens.
        for t, s in [(T - 1, 0), (T - 1, T - 2), (T // 2, T // 2)]:
            point_at(page, t, s)
            a = prompt["attention"][L - 1][H - 1][t][s] / prompt["attention_scale"]
            assert page.text_content("#readout") == (
                f'query {t} "{prompt["query_labels"][t]}" \u2192 key {s} "{prompt["key_labels"][s]}": {fmt(a)}')
            assert abs(a - ex.prompts[0].attention[L - 1, H - 1, t, s]) <= 5e-5
        point_at(page, 0, T - 1)
        assert page.text_content("#readout").endswith("masked (the key comes after the query)")

        # A thumbnail selects its head.
        page.click(".thumb[data-layer='0'][data-head='1']")
        assert page.text_content("#stat-entropy") == fmt(prompt["entropy"][0][1])

        # Head toggles: the top-k next tokens are those of the masked model.
        assert read_top(page) == expected_top(ex, 0, np.ones((L, H)))
        page.click(".toggle[data-layer='0'][data-head='1']")
        mask = np.ones((L, H))
        mask[0, 1] = 0
        assert page.text_content("#mask-status") == "heads: layer 1 head 2 off"
        assert read_top(page) == expected_top(ex, 0, mask)
        assert read_top(page) != expected_top(ex, 0, np.ones((L, H)))  # the toggle changed the numbers

        page.click(f".toggle[data-layer='{L - 1}'][data-head='0']")  # two heads in two layers: not precomputed
        assert page.get_attribute("#mask-status", "class") == "uncovered"
        assert "not precomputed" in page.text_content("#mask-status") and read_top(page) == []
        page.click(f".toggle[data-layer='{L - 1}'][data-head='0']")
        page.click(".toggle[data-layer='0'][data-head='1']")
        page.click(".layer-toggle[data-layer='0']")  # the whole first layer off
        mask = np.ones((L, H))
        mask[0] = 0
        assert page.text_content("#mask-status") == "heads: layer 1 off"
        assert read_top(page) == expected_top(ex, 0, mask)

        # The second prompt: its own maps and numbers (the layer stays off; the head the thumbnail selected).
        page.select_option("#prompt", "1")
        check_map(page, ex.prompts[1], 0, 1)
        check_thumbnails(page, ex.prompts[1])
        assert read_top(page) == expected_top(ex, 1, mask)
        page.click(".layer-toggle[data-layer='0']")  # the layer back on

        # Back to the first prompt with one head of the last layer off: the view the README shows.
        page.select_option("#prompt", "0")
        page.click(f".toggle[data-layer='{L - 1}'][data-head='0']")
        mask = np.ones((L, H))
        mask[L - 1, 0] = 0
        assert read_top(page) == expected_top(ex, 0, mask)
        page.click(f".thumb[data-layer='{L - 1}'][data-head='{H - 1}']")
        point_at(page, T - 1, T - 3)
        assert page.text_content("#readout").startswith(f'query {T - 1} "{prompt["query_labels"][T - 1]}"')
        if os.environ.get("EXPLORER_SCREENSHOT"):
            page.screenshot(path=os.environ["EXPLORER_SCREENSHOT"], full_page=True)

        assert errors == []
        assert all(url.startswith("file://") for url in requests), requests  # nothing from a network


@pytest.mark.slow
def test_sink_and_register_columns_render_and_read_under_the_pointer(tmp_path):
    """A model with an attention sink and 2 registers: columns [sink, reg 1, reg 2, tokens], all
    three coloured by their weights for every query, labelled in the readout, and their shares in the
    head's statistics."""
    sync_playwright = browser_or_skip()
    cfg = make_cfg("gqa", "rope", attention_sink=True, num_registers=2).replace(vocab_size=256, max_seq_len=32)
    ex = explore(random_params(Decoder(cfg)), ["ROMEO: hi"], cfg=cfg, tokenizer=ByteTokenizer(), top_k=4)
    prompt = ex.data()["prompts"][0]
    T, H = len(prompt["tokens"]), cfg.num_heads
    with chromium(sync_playwright) as browser:
        page = browser.new_page(viewport={"width": 1500, "height": 760})
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"file://{ex.save(tmp_path / 'explorer.html')}")
        page.click(f"#head-buttons button[data-head='{H - 1}']")
        assert page.text_content("#stat-sink") == fmt(prompt["sink_share"][0][H - 1])
        assert page.text_content("#stat-register") == fmt(prompt["register_share"][0][H - 1])
        assert page.text_content("#stat-share") == fmt(prompt["first_token_share"][0][H - 1])
        check_map(page, ex.prompts[0], 0, H - 1)  # the sink's and registers' columns: seen by query 0 too
        for s, name in [(0, "sink (attends to nothing)"), (2, "reg 2"), (3, 'key 0 "R"')]:
            for t in (0, T - 1):
                point_at(page, t, s)
                a = prompt["attention"][0][H - 1][t][s] / prompt["attention_scale"]
                assert page.text_content("#readout") == f'query {t} "{prompt["query_labels"][t]}" \u2192 {name}: {fmt(a)}'
                assert abs(a - ex.prompts[0].attention[0, H - 1, t, s]) <= 5e-5
        assert errors == []


# A canvas's cells as drawn: the pixel at each cell's centre, for T query rows and S key columns. The main
# map names its grid in its dataset (cell size, label margins); a thumbnail is one pixel per cell.
CELLS = """function cells(c, T, S) {
    const d = c.dataset, cell = +(d.cell || 1), left = +(d.left || 0), top = +(d.top || 0);
    const px = c.getContext("2d").getImageData(0, 0, c.width, c.height).data, colours = [];
    for (let t = 0; t < T; t++) for (let s = 0; s < S; s++) {
      const o = 4 * (Math.floor(top + (t + 0.5) * cell) * c.width + Math.floor(left + (s + 0.5) * cell));
      colours.push([px[o], px[o + 1], px[o + 2]]); }
    return {shape: [Math.floor((c.height - top) / cell), Math.floor((c.width - left) / cell)], colours}; }"""


def check_map(page, view, l, h):
    """The main map draws head (l, h) of PromptView `view`."""
    T, S = view.attention.shape[2:]
    drawn = page.eval_on_selector("#map", f"(c, [T, S]) => {{ {CELLS}; return cells(c, T, S); }}", [T, S])
    check_cells(drawn, view, l, h, "the map")


def check_thumbnails(page, view):
    """Every head's thumbnail draws that head of PromptView `view`."""
    L, H, T, S = view.attention.shape
    drawn = page.eval_on_selector_all(".thumb canvas", f"""(canvases, [T, S]) => {{ {CELLS};
        return canvases.map((c) => [+c.parentElement.dataset.layer, +c.parentElement.dataset.head,
                                    cells(c, T, S)]); }}""", [T, S])
    assert sorted((l, h) for l, h, _ in drawn) == [(l, h) for l in range(L) for h in range(H)]
    for l, h, cells in drawn:
        check_cells(cells, view, l, h, "a thumbnail")


def check_cells(drawn, view, l, h, what):
    """`drawn` (CELLS' answer) is head (l, h) of `view`: a T x S grid, every key after its query the mask's
    grey, every visible key a colour of the scale (neither grey nor unpainted), lighter where the weight is higher."""
    where = f"{what} of layer {l + 1} head {h + 1}"
    T, S = view.attention.shape[2:]
    assert tuple(drawn["shape"]) == (T, S), where
    colours = np.array(drawn["colours"]).reshape(T, S, 3)
    positions = np.array([-1 if x is None else x for x in view.key_positions])  # None: a key every query sees
    visible = positions[None, :] <= np.arange(T)[:, None]  # [T, S]
    assert (colours[~visible] == MASKED).all(), (where, np.argwhere(~visible & (colours != MASKED).any(-1)))
    shown = colours[visible].tolist()
    assert MASKED not in shown and WHITE not in shown, where
    cells = [tuple(ts) for ts in np.argwhere(visible).tolist()]  # (query, key) of each visible cell
    assert_lighter_where_heavier(colours[visible], view.attention[l, h][visible], cells, where)


def luminance(rgb):
    """The relative luminance (sRGB, 0 black to 1 white) of 8-bit colours [..., 3]: the scale's dark end is
    no weight, its light end all of it."""
    c = np.asarray(rgb, np.float64) / 255
    linear = np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)
    return linear @ np.array([0.2126, 0.7152, 0.0722])


def assert_lighter_where_heavier(rgb, weights, cells, where):
    """Colours rgb [N, 3] order as weights [N] do: of any two cells whose weights differ by more than
    RESOLUTION, the heavier is the lighter (a rank correlation of 1 on those pairs)."""
    y, w = luminance(rgb), np.asarray(weights, np.float64)
    heavier = w[:, None] - w[None, :] > RESOLUTION  # [N, N]: cell i's weight clearly above cell j's
    assert heavier.any(), f"{where}: no two weights {RESOLUTION} apart, nothing to order"
    swapped = heavier & ~(y[:, None] > y[None, :])
    if swapped.any():
        i, j = np.argwhere(swapped)[0]
        pytest.fail(f"{where}: {swapped.sum()} of {heavier.sum()} pairs of cells out of order, e.g. (query, key) "
                    f"{cells[i]} of weight {w[i]:.4f} drawn rgb{tuple(rgb[i].tolist())} (luminance {y[i]:.4f}), "
                    f"no lighter than {cells[j]} of weight {w[j]:.4f} drawn rgb{tuple(rgb[j].tolist())} "
                    f"(luminance {y[j]:.4f})")


def point_at(page, t, s):
    box = page.locator("#map").bounding_box()
    d = page.eval_on_selector("#map", "c => ({cell: +c.dataset.cell, left: +c.dataset.left, top: +c.dataset.top})")
    page.mouse.move(box["x"] + d["left"] + (s + 0.5) * d["cell"], box["y"] + d["top"] + (t + 0.5) * d["cell"])


def read_top(page):
    """The top-k table as (token id, probability as embedded, probability as shown)."""
    return page.eval_on_selector_all("#topk tbody tr", """rows => rows.map(r => [
        Number(r.querySelector("td.token").dataset.id), Number(r.querySelector("td.prob").dataset.p),
        r.querySelector("td.prob").textContent])""")


def expected_top(ex, prompt, mask):
    return [[t, round(p, 6), fmt(round(p, 6))] for t, p in ex.top_tokens(prompt, mask)]


@pytest.mark.slow
def test_the_inline_view_runs_in_its_iframe(exploration, tmp_path):
    """What Jupyter shows (`_repr_html_`: the page in a sandboxed iframe) draws the same page."""
    sync_playwright = browser_or_skip()
    ex = exploration
    L, H = ex.masks.shape[1:]
    notebook = tmp_path / "notebook.html"
    notebook.write_text(f"<html><body><div id='output'>{ex._repr_html_()}</div></body></html>", encoding="utf-8")
    with chromium(sync_playwright) as browser:
        page = browser.new_page()
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"file://{notebook}")
        frame = page.frame_locator("#output iframe")
        assert frame.locator("#grid canvas").count() == L * H
        frame.locator(f"#head-buttons button[data-head='{H - 1}']").click()
        assert frame.locator("#stat-entropy").text_content() == fmt(ex.data()["prompts"][0]["entropy"][0][H - 1])
        assert errors == []
