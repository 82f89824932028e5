"""Fuzz target: the command line, from argv to the parsed flags every command runs on.

atheris convention: TestOneInput(data) returns for every input, or raises what is a bug. The first
byte picks the command, the rest are its arguments, separated by NUL bytes (as the kernel passes
them; undecodable bytes as Python decodes argv). Parsing must give flags or a usage error (argparse's
exit 2, or UsageError: one line naming the flag); nothing else. What parses must hold values the
API server accepts where they become part of an object: the node name.
"""

from __future__ import annotations

import contextlib
import io
import os

from dra.cli import COMMANDS
from dra.cli.parser import parse_args
from dra.core.labels import is_dns_subdomain
from dra.daemon.flags import UsageError

NAMES = sorted(COMMANDS)


def TestOneInput(data: bytes) -> None:  # noqa: N802 (atheris' name)
    """Parse `data` as `dra-gpu COMMAND ARG...`."""
    if not data:
        return
    command = NAMES[data[0] % len(NAMES)]
    argv = [command, *(os.fsdecode(arg) for arg in data[1:].split(b"\0") if arg)]
    refusal: SystemExit | UsageError | None = None
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            args = parse_args(argv)
    except (SystemExit, UsageError) as err:
        refusal = err
    if isinstance(refusal, SystemExit):
        # argparse: 2 for a usage error, 0 after --help.
        assert refusal.code in (0, 2), refusal.code
    if isinstance(refusal, UsageError):
        assert "\n" not in str(refusal), str(refusal)
    if refusal is not None:
        return
    node = getattr(args, "node_name", None)
    if node and command != "top":
        assert is_dns_subdomain(node), node
