"""Logging set-up: plain text for people, or one JSON object per line for log pipelines.

Code attaches context with `extra={"shard": k, "job_id": ..., "occurrence": ...}`; the JSON
format emits those as fields.
"""

from __future__ import annotations

import logging
import sys
import time

import orjson

CONTEXT_FIELDS = ("shard", "job_id", "occurrence", "node", "offset", "partition", "outcome",
                  "lateness_ms", "max_lateness_ms")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for name in CONTEXT_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                doc[name] = value
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(doc, default=str).decode()


def configure(*, verbose: bool, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    if not verbose:  # the drivers' connection chatter is noise at INFO
        logging.getLogger("cassandra").setLevel(logging.WARNING)
        logging.getLogger("aiokafka").setLevel(logging.WARNING)
