"""Log set-up: text lines for people, one JSON object per line for pipelines."""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import Iterator

import pytest

from dra.daemon import logs


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    urllib3_level = logging.getLogger("urllib3").level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    logging.getLogger("urllib3").setLevel(urllib3_level)


def _record(msg: str, *args: object, exc: bool = False) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ValueError("boom")
        except ValueError:
            exc_info = sys.exc_info()
    return logging.LogRecord("dra.kubeletplugin.state", logging.WARNING, __file__, 1, msg, args, exc_info)


def test_json_lines_carry_time_level_logger_and_message() -> None:
    entry = json.loads(logs.JsonFormatter().format(_record("prepared claim %s", "team-a/train")))
    assert set(entry) == {"time", "level", "logger", "msg"}
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", entry["time"])
    assert (entry["level"], entry["logger"], entry["msg"]) == (
        "warning",
        "dra.kubeletplugin.state",
        "prepared claim team-a/train",
    )


def test_json_lines_carry_the_exception() -> None:
    line = logs.JsonFormatter().format(_record("failed", exc=True))
    assert "\n" not in line
    entry = json.loads(line)
    assert "ValueError: boom" in entry["exc"]


@pytest.mark.parametrize(("fmt", "formatter"), [("json", logs.JsonFormatter), ("text", logging.Formatter)])
def test_setup_installs_one_stderr_handler(fmt: str, formatter: type[logging.Formatter]) -> None:
    logs.setup("debug", fmt)
    root = logging.getLogger()
    (handler,) = root.handlers
    assert isinstance(handler, logging.StreamHandler)
    assert type(handler.formatter) is formatter
    assert root.level == logging.DEBUG
    assert logging.getLogger("urllib3").level == logging.ERROR
    logs.setup("warning", fmt)
    assert len(root.handlers) == 1
    assert root.level == logging.WARNING


def test_text_lines_are_utc_with_level_and_logger() -> None:
    logs.setup("info", "text")
    (handler,) = logging.getLogger().handlers
    assert handler.formatter is not None
    line = handler.formatter.format(_record("device %s is unhealthy", "gpu-3"))
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z WARNING dra\.kubeletplugin\.state: "
        r"device gpu-3 is unhealthy",
        line,
    )


def test_a_request_that_does_not_decode_is_one_warning_line() -> None:
    logs.setup("info", "text")
    grpc_common = logging.getLogger("grpc._common")
    seen: list[logging.LogRecord] = []

    class Kept(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    handler = Kept()
    grpc_common.addHandler(handler)
    try:
        try:
            raise ValueError("Error parsing message: Wire format was corrupt")
        except ValueError:
            # As grpcio's _common logs a request's bytes that do not decode.
            grpc_common.exception("Exception deserializing message!")
    finally:
        grpc_common.removeHandler(handler)
    [record] = seen
    assert record.levelno == logging.WARNING
    assert record.exc_info is None
    assert record.getMessage() == (
        "a request that does not decode was refused: Error parsing message: Wire format was corrupt"
    )
