"""The code's shape, as docs/design.md states it: thin command lines that nothing imports, config
files loaded by path in one place, and no function body in the package over 50 lines."""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPTS = ("train.py", "sample.py", "sweep.py")
MAX_BODY = 50  # lines of a function body, its docstring left out


def python_files() -> list[pathlib.Path]:
    """Every Python file of the project but the scripts themselves."""
    folders = ("transformer", "tests", "bench", "notebooks", "configs", "scripts")
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


def test_the_command_lines_are_thin():
    lengths = {name: len((ROOT / name).read_text().splitlines()) for name in SCRIPTS}
    assert all(n <= 150 for n in lengths.values()), lengths


def test_nothing_imports_a_script_or_loads_a_module_by_path():
    imports, by_path = [], []
    for path in python_files():
        text = path.read_text()
        for node in ast.walk(ast.parse(text, str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            imports += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names if n in ("train", "sample", "sweep")]
        if "spec_from_file_location" in text:
            by_path.append(str(path.relative_to(ROOT)))
    assert imports == []
    # The one loader of config and sweep files (by design, by path), and this test's own search.
    assert by_path == ["tests/test_shape.py", "transformer/run/config_files.py"]
    script = re.compile(r'"(import (train|sample|sweep)\b|from (train|sample|sweep) import)')  # a source line
    notebooks = [p.name for p in (ROOT / "notebooks").glob("*.ipynb") if script.search(p.read_text())]
    assert notebooks == []


def long_functions(path: pathlib.Path, limit: int = MAX_BODY) -> list[str]:
    """'file:line name (n lines)' of each function whose body, docstring left out, exceeds `limit`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                    and isinstance(body[0].value.value, str) and len(body) > 1):
                body = body[1:]
            lines = node.end_lineno - body[0].lineno + 1
            if lines > limit:
                found.append(f"{path}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_body_in_the_package_is_over_50_lines():
    assert [f for p in sorted((ROOT / "transformer").rglob("*.py")) for f in long_functions(p)] == []


@pytest.mark.parametrize("lines, long", [(50, False), (51, True)])
def test_the_length_check_counts_the_body_without_its_docstring(tmp_path, lines, long):
    body = "".join(f"    x{i} = {i}\n" for i in range(lines))
    probe = tmp_path / "probe.py"
    probe.write_text(f'def f():\n    """A docstring\n    of two lines."""\n{body}')
    assert bool(long_functions(probe)) == long
