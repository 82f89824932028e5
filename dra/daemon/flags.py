"""Flags that DRA_GPU_* environment variables can set, as a DaemonSet sets them.

Every flag --some-flag reads DRA_GPU_SOME_FLAG when it is not on the command
line. A variable's value is converted and checked only when its subcommand
runs, so a variable meant for another subcommand cannot stop this one, and a
bad value is a one-line UsageError naming the variable.
"""

from __future__ import annotations

import argparse
import math
import os
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dra.core.labels import MAX_DRIVER_NAME, MAX_SUBDOMAIN, is_dns_subdomain
from dra.model.quoting import quote


class UsageError(Exception):
    """A flag or environment value is invalid."""


@dataclass(frozen=True)
class _FromEnv:
    """A default taken from the environment, converted and checked only if its subcommand runs.

    Not a str, so that argparse leaves it alone instead of converting it early.
    """

    env: str
    raw: str


def env_name(flag: str) -> str:
    """--node-name -> DRA_GPU_NODE_NAME."""
    return "DRA_GPU_" + flag.lstrip("-").upper().replace("-", "_")


def path(text: str) -> Path:
    """A path flag; an empty value is an error, not the current directory."""
    if not text:
        raise ValueError("must not be empty")
    return Path(text)


def host_program(text: str) -> Path:
    """A program on the host that a container runtime runs by its absolute path."""
    found = path(text)
    if not found.is_absolute():
        raise argparse.ArgumentTypeError(f"{found} is not an absolute path (the container runtime runs it)")
    return found


def nonempty(text: str) -> str:
    """A text flag that must have a value."""
    if not text.strip():
        raise ValueError("must not be empty")
    return text


def csv(text: str) -> list[str]:
    """A comma-separated list flag."""
    return [item.strip() for item in text.split(",") if item.strip()]


def boolean(text: str) -> bool:
    """true/false (also yes/no, on/off, 1/0), as a chart or a person writes it."""
    value = text.strip().lower()
    if value in ("true", "yes", "on", "1"):
        return True
    if value in ("false", "no", "off", "0"):
        return False
    raise ValueError(f"expected true or false, not {text!r}")


def positive_int(text: str) -> int:
    """A whole number above 0."""
    value = int(text)
    if value <= 0:
        raise ValueError(f"must be above 0, not {value}")
    return value


#: A year: longer waits are mistakes, and sleeping that long overflows some clocks.
MAX_SECONDS = 365 * 24 * 3600.0


def seconds(text: str) -> float:
    """A finite, non-negative number of seconds, at most MAX_SECONDS (0 disables where a flag says so)."""
    value = float(text)
    if not math.isfinite(value):
        # ArgumentTypeError: argparse prints its message (for a ValueError, only "invalid value").
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number of seconds")
    if value < 0:
        raise ValueError("must not be negative")
    if value > MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"at most {MAX_SECONDS:g} seconds (a year)")
    return value


def _subdomain(text: str, what: str, limit: int) -> str:
    """`text` when it is a DNS subdomain of at most `limit` characters; ArgumentTypeError naming `what`."""
    if not is_dns_subdomain(text, limit):
        raise argparse.ArgumentTypeError(
            f"{quote(text)} is not {what}: a DNS subdomain (lowercase letters, digits, '-' and '.', "
            f"each part starting and ending with a letter or digit) of at most {limit} characters"
        )
    return text


def dns_subdomain(text: str) -> str:
    """A DRA driver name (a DNS subdomain of at most 63 characters, as the API server checks it).

    Checked before it names any file: the driver name becomes part of paths (the plugin directory,
    socket names), so ``..`` or a slash in it would put files elsewhere.
    """
    return _subdomain(text, "a DRA driver name", MAX_DRIVER_NAME)


def node_name(text: str) -> str:
    """A Node's name, as the API server checks it: a DNS subdomain of at most 253 characters.

    It becomes a ResourceSlice's `nodeName`, its pool's name and part of its object name, the
    object a label or an Event is written to, and a seed of fake GPUs' UUIDs.
    """
    return _subdomain(nonempty(text), "a node name", MAX_SUBDOMAIN)


def _kind(path: Path) -> str | None:
    """What is at `path`: "directory", "file", "other", or None when nothing is."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return None
    except OSError as err:
        raise argparse.ArgumentTypeError(f"cannot look at {path}: {err.strerror}") from None
    return "directory" if stat.S_ISDIR(mode) else "file" if stat.S_ISREG(mode) else "other"


def directory(text: str) -> Path:
    """A directory the command makes things in: one that exists, or none yet (it is made)."""
    found = path(text)
    if _kind(found) not in (None, "directory"):
        raise argparse.ArgumentTypeError(f"{found} is not a directory (give one, or a path to make one at)")
    return found


def file(text: str) -> Path:
    """A file the command reads as it appears: a regular file, or none yet."""
    found = path(text)
    if _kind(found) not in (None, "file"):
        raise argparse.ArgumentTypeError(f"{found} is not a regular file (give a file, or a path for one)")
    return found


def option(
    parser: argparse.ArgumentParser,
    flag: str,
    help: str,
    default: Any = None,
    type: Callable[[str], Any] = str,
    choices: Sequence[str] | None = None,
    required: bool = False,
) -> None:
    """Add a flag whose default comes from its environment variable, if set.

    A `boolean` flag alone means true, as Go's flags (and NVIDIA's drivers') do: `--vfio` is
    `--vfio=true`, and `--vfio=false` (or `--vfio false`) turns it off.
    """
    env = env_name(flag)
    raw = os.environ.get(env)
    shown = f"; default {default}" if default not in (None, "") else ""
    if raw is not None:
        default = _FromEnv(env, raw)
    bare = type is boolean
    parser.add_argument(
        flag,
        nargs="?" if bare else None,
        const=True if bare else None,
        metavar="true|false" if bare else None,
        default=default,
        type=type,
        choices=choices,
        required=required and raw is None,
        help=f"{help} (env {env}{shown})",
    )
    checks = parser.get_default("env_checks") or ()
    parser.set_defaults(env_checks=(*checks, (flag.lstrip("-").replace("-", "_"), type, choices)))


def apply_environment(args: argparse.Namespace) -> argparse.Namespace:
    """Convert and check the values parsed args took from DRA_GPU_* variables; UsageError if one is bad."""
    for dest, convert, choices in args.env_checks:
        value = getattr(args, dest)
        if not isinstance(value, _FromEnv):
            continue
        where = f"environment variable {value.env}={value.raw!r}"
        if choices is not None and value.raw not in choices:
            raise UsageError(f"{where}: expected one of {', '.join(choices)}")
        try:
            setattr(args, dest, convert(value.raw))
        except (ValueError, argparse.ArgumentTypeError) as err:
            raise UsageError(f"{where}: {err}") from None
    return args
