"""Tests of transformer/run/metrics.py: MetricWriter's metrics.jsonl rows and TensorBoard event files,
the disabled writer of hosts other than 0, and read_metrics on a file cut short by a kill."""

from __future__ import annotations

import json
import os
import struct

import pytest
from tensorboardX.proto.event_pb2 import Event
from tensorboardX.record_writer import masked_crc32c

from transformer.run.metrics import MetricWriter, read_metrics

ROWS = [
    {"step": 1, "loss": 4.5, "learning_rate": 1e-4},
    {"step": 2, "loss": 4.25, "learning_rate": 2e-4},
    {"step": 2, "val_loss": 4.375},
]


def tensorboard_scalars(folder) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value), ...]} from the event files in `folder`, read record by record
    (TFRecord framing: length, its CRC, the Event proto, its CRC), checking both CRCs."""
    scalars: dict[str, list[tuple[int, float]]] = {}
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), "rb") as f:
            data = f.read()
        at = 0
        while at < len(data):
            header = data[at:at + 8]
            (length,) = struct.unpack("<Q", header)
            assert struct.unpack("<I", data[at + 8:at + 12])[0] == masked_crc32c(header)
            record = data[at + 12:at + 12 + length]
            assert struct.unpack("<I", data[at + 12 + length:at + 16 + length])[0] == masked_crc32c(record)
            at += 16 + length
            event = Event.FromString(record)
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars


def test_rows_go_to_metrics_jsonl_one_json_object_per_line(tmp_path):
    writer = MetricWriter(str(tmp_path))
    for row in ROWS:
        writer.write(row)
        # Line-buffered: each row is on disk as soon as it is written, before close.
        assert read_metrics(str(tmp_path / "metrics.jsonl"))[-1] == row
    writer.close()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == ROWS


def test_a_second_writer_appends_as_a_resumed_run_does(tmp_path):
    for rows, start in ((ROWS[:1], 0), (ROWS[1:], 1)):
        writer = MetricWriter(str(tmp_path), start_step=start)
        for row in rows:
            writer.write(row)
        writer.close()
    assert read_metrics(str(tmp_path / "metrics.jsonl")) == ROWS


def test_a_restart_drops_the_rows_past_its_start_step(tmp_path):
    """Rows a killed run wrote after its last complete checkpoint are of steps that run again; a
    run started afresh (step 0) keeps none."""
    writer = MetricWriter(str(tmp_path))
    for row in ROWS:
        writer.write(row)
    writer.close()
    MetricWriter(str(tmp_path), start_step=1).close()
    assert read_metrics(str(tmp_path / "metrics.jsonl")) == [r for r in ROWS if r["step"] <= 1]
    MetricWriter(str(tmp_path), start_step=0).close()
    assert read_metrics(str(tmp_path / "metrics.jsonl")) == []


def test_tensorboard_holds_each_step_once_after_a_resume(tmp_path):
    """#31: the TensorBoard files kept the killed invocation's rows past the checkpoint, so its curves
    drew steps 2 (killed) and 2 (resumed) side by side. A writer started at step 1 holds step 1 and the
    resumed run's rows, once each, as an unbroken run's do; started afresh, only the new run's."""
    writer = MetricWriter(str(tmp_path))
    for row in ROWS:
        writer.write(row)
    writer.close()
    resumed = [{"step": 2, "loss": 4.0, "learning_rate": 3e-4}, {"step": 3, "loss": 3.5, "learning_rate": 4e-4}]
    writer = MetricWriter(str(tmp_path), start_step=1)
    for row in resumed:
        writer.write(row)
    writer.close()
    scalars = tensorboard_scalars(tmp_path / "tb")
    assert scalars["loss"] == [(1, 4.5), (2, 4.0), (3, 3.5)]
    assert set(scalars) == {"loss", "learning_rate"}  # the killed run's val_loss at step 2 is gone
    assert read_metrics(str(tmp_path / "metrics.jsonl")) == [ROWS[0], *resumed]

    writer = MetricWriter(str(tmp_path), start_step=0)
    writer.write({"step": 1, "loss": 5.0})
    writer.close()
    assert tensorboard_scalars(tmp_path / "tb") == {"loss": [(1, 5.0)]}


def test_scalars_go_to_tensorboard_event_files_by_step_without_the_step(tmp_path):
    writer = MetricWriter(str(tmp_path))
    for row in ROWS:
        writer.write(row)
    writer.close()
    assert os.listdir(tmp_path / "tb") and all(n.startswith("events.out.tfevents") for n in os.listdir(tmp_path / "tb"))
    scalars = tensorboard_scalars(tmp_path / "tb")
    assert set(scalars) == {"loss", "learning_rate", "val_loss"}
    assert scalars["loss"] == [(1, 4.5), (2, 4.25)]
    assert scalars["val_loss"] == [(2, 4.375)]
    assert [s for s, _ in scalars["learning_rate"]] == [1, 2]
    assert [v for _, v in scalars["learning_rate"]] == pytest.approx([1e-4, 2e-4])


def test_a_disabled_writer_writes_nothing(tmp_path):
    writer = MetricWriter(str(tmp_path / "run"), enabled=False)
    for row in ROWS:
        writer.write(row)
    writer.close()
    assert not (tmp_path / "run").exists() and os.listdir(tmp_path) == []


def test_read_metrics_skips_a_partial_last_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    text = "".join(json.dumps(row) + "\n" for row in ROWS)
    path.write_text(text + '{"step": 3, "lo')  # killed in the middle of a row
    assert read_metrics(str(path)) == ROWS
    path.write_text(text)
    assert read_metrics(str(path)) == ROWS
    path.write_text("")
    assert read_metrics(str(path)) == []
