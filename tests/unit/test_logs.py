"""Structured logging: one JSON object per line with the context fields."""

from __future__ import annotations

import logging

import orjson
from chronowheel.logs import JsonFormatter


def test_json_lines_carry_the_message_and_context_fields() -> None:
    record = logging.LogRecord("chronowheel.node.shard", logging.WARNING, __file__, 1,
                               "shard %d: rejected offset %d", (3, 17), None)
    record.shard = 3
    record.job_id = "reminder-42"
    line = JsonFormatter().format(record)
    doc = orjson.loads(line)
    assert doc["msg"] == "shard 3: rejected offset 17"
    assert doc["level"] == "WARNING" and doc["logger"] == "chronowheel.node.shard"
    assert doc["shard"] == 3 and doc["job_id"] == "reminder-42"
    assert "occurrence" not in doc  # absent context is left out, not null
    assert doc["ts"].endswith("Z") and "\n" not in line
