"""What the daemons share about their life: waiting for the signal that ends it."""

from __future__ import annotations

import logging
import signal

import anyio

log = logging.getLogger(__name__)


async def until_stopped() -> None:
    """Return at SIGTERM (the kubelet stopping the pod) or SIGINT, saying which."""
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            log.info("received %s, shutting down", signal.Signals(signum).name)
            return
