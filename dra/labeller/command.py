"""`dra-gpu node-labeller`: the parsed flags, then the labeller daemon.

The time-slicing and MIG-strategy labels follow the device plugin's config file, which this
program does not read itself: the command line reads it (dra.deviceplugin.setup) and hands
the result in, so that the two programs stay independent.
"""

from __future__ import annotations

import argparse

import anyio

from dra.core.labels import Sharing
from dra.daemon.bootstrap import daemon_fields
from dra.labeller.daemon import LabellerSettings, run_node_labeller


def node_labeller(args: argparse.Namespace, sharing: Sharing) -> int:
    """Run the labeller until SIGTERM or SIGINT; `sharing` is the device plugin's config as labels see it."""
    settings = LabellerSettings(
        **daemon_fields(args),
        kubeconfig=args.kubeconfig or None,
        interval=args.interval,
        sharing=sharing,
        admin=args.label_template,
    )
    anyio.run(run_node_labeller, settings, backend="asyncio")
    return 0
