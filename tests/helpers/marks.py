"""Variants of one check: the first kept in `make test`, the others marked slow (`make test-all`).

For tests parametrised over variants (attention kinds, layer layouts, families) that each cost a
compile or more: the default set checks the function once, the full suite checks every variant.
"""

from __future__ import annotations

import pytest


def first_fast(values: list, ids: list[str] | None = None) -> list:
    """pytest parameters for `values`: values[0] as it is, every later one marked slow."""
    ids = ids or [None] * len(values)
    return [pytest.param(*(v if isinstance(v, tuple) else (v,)), id=i, marks=() if n == 0 else pytest.mark.slow)
            for n, (v, i) in enumerate(zip(values, ids))]
