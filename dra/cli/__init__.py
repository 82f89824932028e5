"""The `dra-gpu` command line (also `python -m dra`): parse, then hand over to the command's program.

``parser`` holds every subcommand's flags (``options`` the groups several share); each
program's ``command`` module runs its subcommands. A command's program is imported only
when it runs, so that a daemon loads only its own code (docs/architecture.md has the
figures).

Rule: the top layer; it imports every layer below, the only place that may import every
program. ``parser`` over ``options`` (a layer contract); ``dra.fakegpus`` only for
--mig-mode's default with --fake-gpus.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from dra.cli.parser import parse_args
from dra.daemon import logs
from dra.daemon.bootstrap import StartupError
from dra.daemon.flags import UsageError


def _kubelet_plugin(args: argparse.Namespace) -> int:
    from dra.kubeletplugin import command

    return command.kubelet_plugin(args)


def _discover(args: argparse.Namespace) -> int:
    from dra.kubeletplugin import command

    return command.discover(args)


def _time_slices(args: argparse.Namespace) -> int:
    from dra.kubeletplugin import command

    return command.time_slices(args)


def _taint(args: argparse.Namespace) -> int:
    from dra.kubeletplugin import command

    return command.clear_taint(args)


def _top(args: argparse.Namespace) -> int:
    from dra.kubeletplugin import command

    return command.top(args)


def _device_plugin(args: argparse.Namespace) -> int:
    from dra.deviceplugin import command

    return command.device_plugin(args)


def _node_labeller(args: argparse.Namespace) -> int:
    # The labels follow the device plugin's config file; the two programs meet only here, on top.
    from dra.deviceplugin.setup import labeller_sharing
    from dra.labeller import command

    return command.node_labeller(args, labeller_sharing(args.config_file, args.mig_strategy))


def _webhook(args: argparse.Namespace) -> int:
    from dra.webhook import command

    return command.webhook(args)


def _explain(args: argparse.Namespace) -> int:
    from dra.explain import command

    return command.run(args)


def _api_schema(args: argparse.Namespace) -> int:
    # No program of its own: dra.api is pure and only renders the documents.
    from dra.api import schema

    for name, text in schema.documents().items():
        target = args.output_dir / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        print(target)
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "kubelet-plugin": _kubelet_plugin,
    "device-plugin": _device_plugin,
    "node-labeller": _node_labeller,
    "discover": _discover,
    "webhook": _webhook,
    "api-schema": _api_schema,
    "taint": _taint,
    "time-slices": _time_slices,
    "explain": _explain,
    "top": _top,
}


def _first_startup_error(group: BaseExceptionGroup[BaseException]) -> StartupError | None:
    matched = group.subgroup(StartupError)
    while matched is not None:
        first = matched.exceptions[0]
        if isinstance(first, StartupError):
            return first
        matched = first.subgroup(StartupError) if isinstance(first, BaseExceptionGroup) else None
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; the exit status (1 with one line on stderr for a startup error, 2 for a MIG layout)."""
    try:
        args = parse_args(argv)
    except UsageError as err:
        print(f"dra-gpu: error: {err}", file=sys.stderr)
        return 2
    logs.setup(args.log_level, args.log_format)
    try:
        return COMMANDS[args.command](args)
    except (StartupError, ExceptionGroup) as err:
        # A start-up step that runs inside a task group arrives wrapped in an ExceptionGroup.
        found = err if isinstance(err, StartupError) else _first_startup_error(err)
        if found is None:
            raise
        print(f"dra-gpu: error: {found}", file=sys.stderr)
        return found.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader (| head) went away; say nothing more on a closed stdout.
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115
        return 0
