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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dra.core.labels import MAX_DRIVER_NAME, is_dns_subdomain


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


def dns_subdomain(text: str) -> str:
    """A DRA driver name (a DNS subdomain of at most 63 characters, as the API server checks it).

    Checked before it names any file: the driver name becomes part of paths (the plugin directory,
    socket names), so ``..`` or a slash in it would put files elsewhere.
    """
    if not is_dns_subdomain(text, MAX_DRIVER_NAME):
        shown = text if len(text) <= 60 else text[:57] + "..."
        raise argparse.ArgumentTypeError(
            f"{shown!r} is not a DRA driver name: a DNS subdomain (lowercase letters, digits, '-' and '.', "
            f"each part starting and ending with a letter or digit) of at most {MAX_DRIVER_NAME} characters"
        )
    return text


def option(
    parser: argparse.ArgumentParser,
    flag: str,
    help: str,
    default: Any = None,
    type: Callable[[str], Any] = str,
    choices: Sequence[str] | None = None,
    required: bool = False,
) -> None:
    """Add a flag whose default comes from its environment variable, if set."""
    env = env_name(flag)
    raw = os.environ.get(env)
    shown = f"; default {default}" if default not in (None, "") else ""
    if raw is not None:
        default = _FromEnv(env, raw)
    parser.add_argument(
        flag,
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
