"""bench/accelerator.py, the device check: its tiny mode runs everywhere (here on the CPU), its peak
table names the chips, and its largest-batch search finds the largest batch that fits."""

import os
import re

import pytest

from bench import accelerator


def test_importing_it_leaves_the_device_count_alone():
    """bench/memory.py asks for 8 simulated devices only as a script: imported here, the processes
    this test worker starts later (train.py in other tests) must still see the real devices."""
    assert "device_count=8" not in os.environ.get("XLA_FLAGS", "")


@pytest.mark.slow  # runs a benchmark or many training steps: make test-all
def test_tiny_run_prints_one_row_per_model_with_measured_figures(capsys):
    accelerator.main(["--tiny"])
    out = capsys.readouterr().out
    assert out.startswith("### Device check: cpu (cpu, ")
    rows = [line for line in out.splitlines() if line.startswith("| baby GPT") or line.startswith("| GPT-2 small")]
    assert len(rows) == 2
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        name, params, execution, batch, compile_s, train, mfu, decode_1, decode_64, largest = cells
        assert execution == "bfloat16, reference"  # 'auto' attention on a CPU, in bfloat16 as asked
        assert batch == "2 x 32"
        assert float(compile_s) > 0
        assert all(float(x.replace(",", "")) > 0 for x in (train, decode_1, decode_64))
        assert mfu == "—" and largest == "—"  # a CPU has no stated peak and reports no memory limit


@pytest.mark.parametrize("kind, flops", [
    ("NVIDIA H100 80GB HBM3", 989e12),
    ("NVIDIA H100 PCIe", 756e12),
    ("NVIDIA H200", 989e12),
    ("NVIDIA A100-SXM4-80GB", 312e12),
    ("NVIDIA L4", 121e12),
    ("NVIDIA L40S", 362e12),
    ("TPU v4", 275e12),
    ("TPU v5 lite", 197e12),
    ("TPU v5p", 459e12),
    ("cpu", None),
    ("NVIDIA GeForce RTX 3090", None),
])
def test_peak_flops_by_device_kind(kind, flops):
    assert accelerator.peak_flops(kind) == flops


def test_largest_batch_doubles_up_halves_down_and_stops_at_the_cap():
    fits_40 = lambda b: b <= 40  # noqa: E731
    assert accelerator.largest_batch(fits_40, 8, cap=1024) == 32
    assert accelerator.largest_batch(fits_40, 64, cap=1024) == 32
    assert accelerator.largest_batch(fits_40, 5, cap=1024) == 40
    assert accelerator.largest_batch(fits_40, 8, cap=16) == 16
    assert accelerator.largest_batch(lambda b: False, 8, cap=1024) == 0


@pytest.mark.slow  # runs a benchmark or many training steps: make test-all
def test_the_step_memory_grows_with_the_batch_and_bounds_the_search():
    plan = accelerator.plans(tiny=True)[0]
    peaks = {b: accelerator.step_peak_bytes(plan, b) for b in (2, 4, 8)}
    assert peaks[2] < peaks[4] < peaks[8]
    assert accelerator.largest_batch(lambda b: peaks[b] <= peaks[4], 2, cap=8) == 4


def test_the_table_shows_mfu_and_the_largest_batch_where_known():
    result = accelerator.Result(
        name="baby GPT", params=10_750_000, execution="bfloat16, cudnn", batch=64, seq_len=256,
        compile_seconds=3.2, tokens_per_sec=1.5e6, mfu=0.42, decode_tokens_per_sec={1: 900.0, 64: 40_000.0},
        largest_batch=512)
    text = accelerator.markdown([result], "NVIDIA H100 80GB HBM3", 989e12, 80 * 2**30)
    assert "989 TFLOP/s bfloat16 peak; 80.0 GiB memory limit" in text
    assert re.search(r"\| baby GPT \| 10.8M \| bfloat16, cudnn \| 64 x 256 \| 3.2 \| 1,500,000 \| 42.0% "
                     r"\| 900 \| 40,000 \| 512 \|", text)
