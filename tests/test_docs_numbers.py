"""Every marked number in the docs equals its results file at the printed digits.

Each page of docs/experiments/ has a results file beside it (NAME.json, written by the command the page
names, or once from the committed sources its "source" field names). A page marks where its numbers
come from in two ways, both invisible when the Markdown is rendered:

    ... MQA 4.78<!-- kv_cache.json:decode.mqa.ms_low --> ms per step ...     one number, by its key
    <!-- table kv_cache.json:bytes_table -->                                   the table on the next line:
    | variant | bytes |                                                       each row of the file's list,
    | --- | --: |                                                           cell by cell: null (not a
    | MHA | 4,096 |                                                          number), a number, or a list of
                                                                              the cell's numbers in order

README.md's results rows and docs/performance.md's summary mark their numbers the same way, from the
files in docs/experiments/.
"""

import contextlib
import glob
import json
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "docs", "experiments")
PAGES = sorted(p for p in glob.glob(os.path.join(RESULTS, "*.md")) if not p.endswith("README.md"))
CHECKED = [os.path.join(ROOT, "README.md"), os.path.join(ROOT, "docs", "performance.md"), *PAGES]

NUMBER = r"[-+]?\d[\d,]*(?:\.\d+)?"  # a signed number is compared with its sign, an unsigned one by size
INLINE = re.compile(rf"(?<![\w.])(?P<number>{NUMBER})(?:x|%)?<!-- (?P<file>[\w-]+\.json):(?P<key>[\w.-]+) -->")
TABLE = re.compile(r"^<!-- table (?P<file>[\w-]+\.json):(?P<key>[\w.-]+) -->\n(?P<table>(?:\|.*\n?)+)", re.M)
CELL_NUMBER = re.compile(rf"(?<![\w.]){NUMBER}(?![\w])")  # not the 2 and 7 of L2H7


def lookup(results: dict, key: str):
    """The value at a dotted key; a part that is an integer indexes a list."""
    value = results
    for part in key.split("."):
        value = value[int(part)] if isinstance(value, list) else value[part]
    return value


def printed_as(value, printed: str) -> bool:
    """Whether `value` shows as `printed` at the printed number's digits (thousands commas ignored); a
    number printed without a sign is its size ("0.28 nats below" for -0.2837)."""
    printed = printed.replace(",", "")
    decimals = len(printed.split(".")[1]) if "." in printed else 0
    value = float(value) if printed[0] in "+-" else abs(float(value))
    return float(f"{value:.{decimals}f}") == float(printed)


def mismatches(text: str, folder: str = RESULTS) -> list[str]:
    """One line per marked number of `text` that differs from its results file in `folder` (or has none)."""
    files: dict[str, dict] = {}

    def results(name: str):
        if name not in files:
            path = os.path.join(folder, name)
            with open(path) if os.path.isfile(path) else contextlib.nullcontext() as f:
                files[name] = json.load(f) if f else None
        return files[name]

    def value(name: str, key: str):
        if results(name) is None:
            return f"{name}: no such results file in {folder}"
        try:
            return lookup(results(name), key)
        except (KeyError, IndexError, ValueError, TypeError):
            return f"{name}: no key {key!r}"

    found = []
    for m in INLINE.finditer(text):
        v, number = value(m["file"], m["key"]), m["number"]
        if text[m.start() - 4:m.start()] == " -->":  # the dash of a range, 4.78<!-- ... -->-5.92
            number = number.lstrip("-")
        if isinstance(v, str):
            found.append(v)
        elif not printed_as(v, number):
            found.append(f"{m['file']}:{m['key']} is {v}, printed as {number}")
    for m in TABLE.finditer(text):
        rows = value(m["file"], m["key"])
        if isinstance(rows, str):
            found.append(rows)
            continue
        lines = m["table"].strip().split("\n")[2:]  # after the header and its rule
        if len(lines) != len(rows):
            found.append(f"{m['file']}:{m['key']} has {len(rows)} rows, the table {len(lines)}")
            continue
        for i, (line, row) in enumerate(zip(lines, rows)):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            for j, (cell, expected) in enumerate(zip(cells, row)):
                if expected is None:
                    continue
                expected = expected if isinstance(expected, list) else [expected]
                printed = CELL_NUMBER.findall(cell)
                if len(printed) != len(expected) or not all(map(printed_as, expected, printed)):
                    found.append(f"{m['file']}:{m['key']} row {i} column {j}: {expected} printed as {cell!r}")
    return found


@pytest.mark.parametrize("path", CHECKED, ids=lambda p: os.path.relpath(p, ROOT))
def test_marked_numbers_equal_their_results_files(path):
    with open(path) as f:
        assert mismatches(f.read()) == [], f"{os.path.relpath(path, ROOT)}: fix the page or rerun its command"


@pytest.mark.parametrize("page", PAGES, ids=os.path.basename)
def test_every_experiment_page_reads_its_own_results_file(page):
    name = os.path.basename(page).replace(".md", ".json")
    with open(os.path.join(RESULTS, name)) as f:
        results = json.load(f)
    assert results.get("command") and results.get("source"), f"{name}: say which command writes it, and from what"
    with open(page) as f:
        text = f.read()
    assert f"<!-- {name}:" in text or f"<!-- table {name}:" in text, f"{page} marks no number from {name}"


def test_the_readme_results_rows_and_the_performance_summary_are_marked():
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    section = readme.split("## The lecture, here", 1)[1].split("\n## ", 1)[0]
    rows = [r for r in section.splitlines() if r.startswith("| ") and not r.startswith(("| the lecture", "| ---"))]
    for row in rows:  # every decimal measured in a results row carries its key
        measured = row.split(" | ")[2]
        bare = [n for n in re.findall(rf"(?<![\w.<]){NUMBER}(?:x|%)?(?!<!--|[\w.])", measured) if "." in n]
        assert not bare, f"README results row {row[:40]!r}: {bare} have no <!-- FILE.json:KEY --> mark"
    with open(os.path.join(ROOT, "docs", "performance.md")) as f:
        performance = f.read()
    summary = performance.split("## Summary of the latest full run", 1)[1].split("\n## ", 1)[0]
    assert INLINE.search(summary), "performance.md's summary marks no number from its results file"


def test_a_wrong_number_is_caught(tmp_path):
    (tmp_path / "x.json").write_text(json.dumps({"command": "c", "source": "s", "a": {"ms": 4.784},
                                                  "rows": [[None, 1024, [0.5, 0.25]]]}))
    good = ("MQA 4.78<!-- x.json:a.ms --> ms\n\n<!-- table x.json:rows -->\n| name | bytes | share |\n"
            "| --- | --: | --: |\n| MQA | 1,024 | 0.50 ± 0.25 |\n")
    assert mismatches(good, str(tmp_path)) == []
    assert mismatches(good.replace("4.78", "4.79"), str(tmp_path)) == ["x.json:a.ms is 4.784, printed as 4.79"]
    assert mismatches(good.replace("4.78", "4.8"), str(tmp_path)) == []  # fewer digits, still that value
    assert len(mismatches(good.replace("4.78", "-4.78"), str(tmp_path))) == 1  # a printed sign counts
    assert mismatches("4.78<!-- x.json:a.ms -->-4.78<!-- x.json:a.ms --> ms", str(tmp_path)) == []  # a range
    assert len(mismatches(good.replace("1,024", "2,048"), str(tmp_path))) == 1
    assert len(mismatches(good.replace("0.50 ± 0.25", "0.50 ± 0.26"), str(tmp_path))) == 1
    assert len(mismatches(good.replace("0.50 ± 0.25", "0.50"), str(tmp_path))) == 1  # a number left out
    assert mismatches(good.replace("a.ms", "a.s"), str(tmp_path)) == ["x.json: no key 'a.s'"]
    assert "no such results file" in mismatches(good.replace("x.json:a", "y.json:a"), str(tmp_path))[0]
