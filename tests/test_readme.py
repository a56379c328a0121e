"""The README's Python example ("The model in Python") runs as written, and its shape comments hold."""

import os
import re

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def readme_example() -> str:
    with open(os.path.join(ROOT, "README.md")) as f:
        found = re.search(r"## The model in Python\n\n```python\n(.*?)```", f.read(), re.S)
    assert found, "README.md has no ```python block under '## The model in Python'"
    return found.group(1)


@pytest.mark.slow  # make test-all only (the default set's time: docs/performance.md)
def test_readme_python_example_runs(monkeypatch):
    monkeypatch.chdir(ROOT)  # it reads configs/gpt2.py by a relative path
    names: dict = {}
    exec(compile(readme_example(), "README.md", "exec"), names)
    cfg, tokens = names["cfg"], names["tokens"]
    B, T = tokens.shape
    assert cfg.num_layers == 12  # the last line's config file was read
    # After the example: its 'got' is the pattern captured with layer 1, head 3 switched off.
    pattern = np.asarray(names["got"]["blocks.*.attn.pattern"])
    assert pattern.shape[:2] == (2, B) and pattern.shape[-2:] == (T, T)
    np.testing.assert_allclose(pattern.sum(-1), 1.0, atol=1e-5)
    assert names["logits"].shape == (B, T, 256)  # the small model's, with the head off
