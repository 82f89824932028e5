"""Logging set-up: text for people, JSON lines for log pipelines."""

from __future__ import annotations

import json
import logging
import sys
import time


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, msg (and exc when there is one)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry)


class _UndecodedRequest(logging.Filter):
    """grpcio's synchronous server logs a whole traceback for each request whose bytes do not decode
    (and answers it INTERNAL): a caller's bad bytes, not a fault of ours, so one line says it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[1] is not None:
            record.msg, record.args = "a request that does not decode was refused: %s", (record.exc_info[1],)
            record.exc_info = record.exc_text = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def setup(level: str, fmt: str) -> None:
    """Configure the root logger once, on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        formatter = logging.Formatter(
            "%(asctime)s.%(msecs)03dZ %(levelname)-7s %(name)s: %(message)s", "%Y-%m-%dT%H:%M:%S"
        )
        formatter.converter = time.gmtime
        handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # The client library logs every retry at WARNING; the driver reports failures itself.
    logging.getLogger("urllib3").setLevel(logging.ERROR)
    undecoded = logging.getLogger("grpc._common")
    if not any(isinstance(f, _UndecodedRequest) for f in undecoded.filters):
        undecoded.addFilter(_UndecodedRequest())
