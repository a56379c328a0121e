"""An interactive attention explorer: one self-contained HTML page, inline in Jupyter or in a file.

    ex = explore("runs/shakespeare", ["ROMEO:"])          # a run's workdir (its latest checkpoint)
    ex = explore(params, ["ROMEO:"], cfg=cfg, tokenizer=tok)  # or a model in memory (e.g. from_hf)
    ex.save("explorer.html")                               # or `ex` as a Jupyter cell's last line

Per prompt the page (no network) shows every head's attention weights [L, H, T, S] (a sink and registers
as columns in front), first-token share and entropy, and the top-k next tokens with heads off."""

from __future__ import annotations

import dataclasses
import functools
import html
import json
import os
from collections.abc import Sequence
from importlib import resources
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from transformer.model.config import ModelConfig
from transformer.analysis.capture import attention_maps
from transformer.analysis.patching import run_cells
from transformer.model.edits import ablate_heads
from transformer.model.inputs import check_tokens
from transformer.analysis.attention_shares import shares_from_weights
from transformer.data.atomic_files import write_atomically

DIGITS = 4  # decimals of the attention weights and statistics the page shows
ATTENTION_SCALE = 10**DIGITS  # the page stores a weight a as the integer round(a * ATTENTION_SCALE)
PROB_DIGITS = 6  # decimals of the next-token probabilities kept in the page


@dataclasses.dataclass
class PromptView:
    """One prompt's numbers: T queries (its tokens), S = (1 sink) + R registers + T keys, M head masks."""

    text: str
    tokens: list[int]  # [T]
    query_labels: list[str]  # [T]
    key_labels: list[str]  # [S]
    key_positions: list[int | None]  # [S]: a key's position, None for a key every query sees
    first_key: int  # the column of the first prompt token
    attention: np.ndarray  # [L, H, T, S] float32, each row sums to 1
    first_token_share: np.ndarray  # [L, H]: mean weight on column first_key, over queries t >= 1
    entropy: np.ndarray  # [L, H]: mean -sum_s a log a in nats, over queries t >= 1
    next_probs: np.ndarray  # [M, V] float32: the next token's distribution after the prompt, per mask
    register_share: np.ndarray | None = None  # [L, H]: mean weight on all registers (R > 0)
    sink_share: np.ndarray | None = None  # [L, H]: mean weight on the sink


@dataclasses.dataclass(repr=False)
class Exploration:
    """What `explore` computed; `_repr_html_` shows it in Jupyter, `save` writes the page."""

    model: dict  # the config fields the page shows
    masks: np.ndarray  # [M, L, H] 0/1: the head masks whose next-token distributions were computed
    mask_names: list[str]  # [M]: what each mask switches off, in words
    prompts: list[PromptView]
    labels: dict[int, str]  # how each token id the page lists as a next token is shown
    top_k: int

    def mask_index(self, head_mask: np.ndarray) -> int | None:
        """The index in `masks` of `head_mask` [L, H] (1 keep, 0 off), or None if not precomputed."""
        return next((i for i, m in enumerate(self.masks) if mask_key(m) == mask_key(head_mask)), None)

    def top_tokens(self, prompt: int, head_mask: np.ndarray | None = None) -> list[tuple[int, float]]:
        """The top-k (token id, probability) after prompt `prompt` with `head_mask` [L, H] (default all on)."""
        i = 0 if head_mask is None else self.mask_index(head_mask)
        if i is None:
            raise ValueError("that head mask was not precomputed; pass it to explore(..., extra_masks=[...])")
        probs = self.prompts[prompt].next_probs[i]
        top = np.argsort(-probs, kind="stable")[: self.top_k]
        return [(int(t), float(probs[t])) for t in top]

    def coverage(self) -> str:
        """Which combinations of heads off were precomputed, in words."""
        L, H = self.masks.shape[1:]
        standard = 1 + L * H + (L if H > 1 else 0)  # head_masks' own, before any extra ones
        text = "all heads on, any single head off" + (", any whole layer off" if H > 1 else "")
        extra = self.mask_names[standard:]
        return text + (f", and {'; '.join(extra)}" if extra else "")

    def data(self) -> dict:
        """The JSON the page embeds: the numbers rounded to what the page shows."""
        return {"model": self.model, "top_k": self.top_k, "coverage": self.coverage(),
                "masks": [{"key": mask_key(m), "name": n} for m, n in zip(self.masks, self.mask_names)],
                "prompts": [_prompt_data(self, i) for i in range(len(self.prompts))]}

    def html(self) -> str:
        """The whole page: HTML, our script, and the data as JSON ("<" escaped: no prompt closes the script)."""
        data = json.dumps(self.data(), ensure_ascii=False, separators=(",", ":")).replace("<", "\\u003c")
        return _asset("page.html").replace("/*SCRIPT*/", _asset("explorer.js")).replace("/*DATA*/", data)

    def save(self, path: str | os.PathLike) -> str:
        """Writes the page to `path` (UTF-8) and returns the path."""
        check_page_path(path)
        write_atomically(path, self.html())
        return os.fspath(path)

    def __repr__(self) -> str:
        L, H = self.masks.shape[1:]
        return (f"Exploration of {len(self.prompts)} prompt(s): {L} layers x {H} heads, {len(self.masks)} head "
                "masks precomputed (display it in Jupyter, or .save(path) for a browser)")

    def _repr_html_(self) -> str:
        # An iframe of its own: the page's ids and script cannot clash with the notebook's.
        return (f'<iframe srcdoc="{html.escape(self.html(), quote=True)}" sandbox="allow-scripts" '
                'style="width: 100%; height: 900px; border: 1px solid #ddd"></iframe>')


def check_page_path(path: str | os.PathLike) -> None:
    """Raises if `path` is a folder or its folder does not exist (--out, checked before any work)."""
    if os.path.isdir(path):
        raise ValueError(f"cannot save the explorer to {path}: it is a folder; name a file, e.g. "
                         f"{os.path.join(path, 'explorer.html')}")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"cannot save the explorer to {path}: no folder {folder}; create it first")


def explore(params_or_workdir: Any, prompts: str | Sequence[str | Sequence[int]], *, cfg: ModelConfig | None = None,
            tokenizer: Any = None, step: int | None = None, top_k: int = 10, max_tokens: int = 96,
            extra_masks: Sequence[np.ndarray] = ()) -> Exploration:
    """The page for `prompts` (texts or token id lists) of a run's folder (checkpoint `step`) or of params
    (with `cfg`); `extra_masks`: head masks [L, H] (1 keep, 0 off) to precompute besides the standard ones."""
    if isinstance(params_or_workdir, (str, os.PathLike)):
        from transformer.run.checkpoint import restore_for_inference

        if cfg is not None:
            raise ValueError("cfg is read from the run's checkpoint; pass cfg only with params")
        cfg, params, saved_tokenizer = restore_for_inference(os.fspath(params_or_workdir), step=step)
        tokenizer = saved_tokenizer if tokenizer is None else tokenizer
    else:
        if cfg is None:
            raise ValueError("explore(params, ...) needs the model's config: pass cfg=ModelConfig(...)")
        if step is not None:
            raise ValueError("step picks a checkpoint of a run: pass the run's workdir, not params, with step")
        params = params_or_workdir
        if isinstance(params, dict) and set(params) == {"params"}:  # {"params": ...} as Flax's apply takes it
            params = params["params"]
    if top_k < 1:
        raise ValueError(f"top_k={top_k}: the page lists at least one next token; pass top_k >= 1")
    prompts = [prompts] if isinstance(prompts, str) else list(prompts)
    if not prompts:
        raise ValueError("no prompts: pass a text or a list of texts")
    cfg = cfg.replace(attention_impl="reference", dropout=0.0)  # the one attention that returns its weights
    masks, names = head_masks(cfg, extra_masks)
    label = functools.partial(_label, tokenizer)
    views = _views(cfg, params, prompts, tokenizer, label, masks, max_tokens)
    kind = (f"MLA (latent {cfg.kv_latent_dim})" if cfg.attention == "mla" else "MHA" if cfg.num_kv_heads == cfg.num_heads
            else "MQA" if cfg.num_kv_heads == 1 else f"GQA ({cfg.num_kv_heads} key/value heads)")
    shown_fields = ("num_layers", "num_heads", "d_model", "position", "vocab_size", "attention_sink", "num_registers")
    model = {"attention": kind, **{k: getattr(cfg, k) for k in shown_fields}}
    ex = Exploration(model, masks, names, views, {}, min(top_k, cfg.vocab_size))
    shown = {t for i in range(len(views)) for m in masks for t, _ in ex.top_tokens(i, m)}
    ex.labels.update({t: label(t) for t in sorted(shown)})
    return ex


def head_masks(cfg: ModelConfig, extra: Sequence[np.ndarray] = ()) -> tuple[np.ndarray, list[str]]:
    """Head masks [M, L, H] (1 keep) and names: all on, each head off, each layer off, then new `extra` ones."""
    L, H = cfg.num_layers, cfg.num_heads
    heads_off = 1 - np.eye(L * H, dtype=np.float32).reshape(L * H, L, H)  # one head off each
    layers_off = 1 - np.repeat(np.eye(L, dtype=np.float32)[:, :, None], H, axis=2)  # one layer off each
    masks = [np.ones((L, H), np.float32), *heads_off, *(layers_off if H > 1 else [])]
    names = ["all heads on"] + [f"layer {l + 1} head {h + 1} off" for l in range(L) for h in range(H)]
    names += [f"layer {l + 1} off" for l in range(L)] if H > 1 else []
    keys = {mask_key(m) for m in masks}
    for m in extra:
        m = np.asarray(m, np.float32)
        if m.shape != (L, H) or not np.isin(m, (0, 1)).all():
            raise ValueError(f"an extra mask of shape {m.shape} is not a 0/1 array [L, H] = [{L}, {H}]; "
                             "pass 1 for a head kept and 0 for a head off")
        if mask_key(m) not in keys:
            keys.add(mask_key(m))
            masks.append(m)
            off = [f"L{l + 1}H{h + 1}" for l, h in zip(*np.nonzero(m == 0))]
            names.append(f"{', '.join(off) or 'no head'} off")
    return np.stack(masks), names


def mask_key(head_mask: np.ndarray) -> str:
    """A head mask [L, H] as the page names it: '1' (on) or '0' (off) per head, layer by layer."""
    return "".join("1" if x else "0" for x in np.asarray(head_mask).reshape(-1))


def _views(cfg: ModelConfig, params: Any, prompts: list, tokenizer: Any, label: Any, masks: np.ndarray,
           max_tokens: int) -> list[PromptView]:
    """Each prompt's PromptView, all in one batch right-padded to the longest (causal: unseen)."""
    encoded = [_encode(cfg, p, tokenizer, max_tokens) for p in prompts]
    lengths = np.array([len(t) for t, _ in encoded])
    batch = np.zeros((len(encoded), lengths.max()), np.int32)  # [B, T_max], padded with token 0
    for b, (t, _) in enumerate(encoded):
        batch[b, : len(t)] = t
    attention, next_probs = _forward(cfg, params, jnp.asarray(batch), jnp.asarray(lengths - 1), jnp.asarray(masks))
    attention, next_probs = np.asarray(attention, np.float32), np.asarray(next_probs, np.float32)
    R, sink, T_max = cfg.num_registers, cfg.attention_sink, batch.shape[1]
    extra_labels = (["sink"] if sink else []) + [f"reg {i + 1}" for i in range(R)]
    views = []
    for b, (tokens, text) in enumerate(encoded):
        T = len(tokens)
        # The Decoder's columns [R registers, T_max tokens, (sink)]: this prompt's, padding dropped.
        w = attention[:, b : b + 1, :, :T, list(range(R + T)) + ([R + T_max] if sink else [])]  # [L, 1, H, T, R+T(+1)]
        measured = w if T > 1 else np.repeat(w, 2, axis=3)  # one query: its row stands in for rows t >= 1
        shares = shares_from_weights(cfg, measured)
        rows = measured[:, 0, :, 1:]  # [L, H, T - 1, columns]: queries t >= 1
        a = np.roll(w[:, 0], int(sink), axis=-1)  # [L, H, T, S] in the page's order: (sink,) registers, tokens
        token_labels = [label(int(t)) for t in tokens]
        views.append(PromptView(
            text=text, tokens=tokens.tolist(), query_labels=token_labels, key_labels=extra_labels + token_labels,
            key_positions=[None] * len(extra_labels) + list(range(T)), first_key=len(extra_labels), attention=a,
            first_token_share=np.asarray(shares.first_token), next_probs=next_probs[:, b],
            entropy=-(rows * np.log(np.maximum(rows, 1e-12))).sum(-1).mean(-1),
            register_share=np.asarray(shares.registers) if R else None,
            sink_share=np.asarray(shares.sink) if sink else None))
    return views


def _encode(cfg: ModelConfig, prompt: str | Sequence[int], tokenizer: Any, max_tokens: int) -> tuple[np.ndarray, str]:
    """(token ids [T], text) of a text prompt or of a prompt given as token ids."""
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ValueError("a text prompt needs the model's tokenizer: pass tokenizer=..., or token ids")
        from transformer.sampling.sampler import encode_prompt

        # new_tokens=0: one forward pass over the prompt, nothing generated, so it may fill the context.
        tokens, text = np.asarray(encode_prompt(cfg, tokenizer, prompt, new_tokens=0)), prompt
    else:
        tokens = np.asarray(prompt, np.int64).reshape(-1)
        check_tokens(cfg, tokens[None])  # ids in the vocabulary: a page of NaN otherwise
        text = tokenizer.decode(tokens) if tokenizer is not None else " ".join(map(str, tokens))
    if not 0 < len(tokens) <= min(max_tokens, cfg.max_seq_len):
        raise ValueError(f"the prompt has {len(tokens)} tokens; the explorer takes 1 to max_tokens={max_tokens} "
                         f"(a T x T map per head), at most the context max_seq_len={cfg.max_seq_len}: shorten it")
    return tokens, text


@functools.partial(jax.jit, static_argnames="cfg")
def _forward(cfg: ModelConfig, params: Any, tokens: jax.Array, last: jax.Array, masks: jax.Array):
    """tokens [B, T], each row's last position last [B], head masks [M, L, H] -> (attention weights
    [L, B, H, T, R + T (+1)] as blocks.*.attn.pattern has them, next-token probabilities [M, B, V])."""
    next_probs = lambda logits: jax.nn.softmax(logits[jnp.arange(tokens.shape[0]), last])  # noqa: E731
    return attention_maps(params, cfg, tokens), run_cells(params, cfg, tokens, masks,
                                                          lambda mask: [ablate_heads(cfg, mask)], next_probs)


def _label(tokenizer: Any, token: int) -> str:
    """Token `token`'s text made visible; '#id' without a tokenizer, for an unknown id or a part of a character."""
    known = tokenizer is not None and 0 <= token < tokenizer.vocab_size
    text = tokenizer.decode([token]) if known else ""
    return f"#{token}" if not text or "\ufffd" in text else token_label(text)


def token_label(text: str) -> str:
    """A token's text with spaces as ␣, line breaks as ⏎, tabs as ⇥ and other control characters as \\xNN."""
    visible = {" ": "␣", "\n": "⏎", "\t": "⇥", "\r": "␍"}
    return "".join(visible.get(c, c if c.isprintable() else f"\\x{ord(c):02x}") for c in text)


def _prompt_data(ex: Exploration, i: int) -> dict:
    """Prompt i's part of the page's JSON."""
    p = ex.prompts[i]
    top = {mask_key(m): [[t, ex.labels[t], round(prob, PROB_DIGITS)] for t, prob in ex.top_tokens(i, m)]
           for m in ex.masks}
    stats = {"first_token_share": p.first_token_share, "entropy": p.entropy, "register_share": p.register_share,
             "sink_share": p.sink_share}
    return {"text": p.text, "tokens": p.tokens, "query_labels": p.query_labels, "key_labels": p.key_labels,
            "key_positions": p.key_positions, "first_key": p.first_key, "attention_scale": ATTENTION_SCALE,
            "attention": _stored_rows(p),  # [L][H][T][<= S]
            **{k: None if v is None else np.round(v, DIGITS).tolist() for k, v in stats.items()}, "top": top}


def _stored_rows(p: PromptView) -> list:
    """The weights as integers round(a * ATTENTION_SCALE), each query's row cut after its last visible key."""
    positions = np.array([-1 if x is None else x for x in p.key_positions])  # None: seen by every query
    ints = np.rint(p.attention * ATTENTION_SCALE).astype(np.int64)  # [L, H, T, S]
    ends = [int(np.nonzero(positions <= t)[0].max()) + 1 for t in range(len(p.query_labels))]  # [T]
    return [[[row[:end].tolist() for row, end in zip(head, ends)] for head in layer] for layer in ints]


def _asset(name: str) -> str:
    return resources.files("transformer.analysis").joinpath("explorer_page", name).read_text(encoding="utf-8")
