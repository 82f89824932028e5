"""What the daemons share about their life: a heartbeat for liveness, and the signal that ends it."""

from __future__ import annotations

import logging
import signal
import time

import anyio

log = logging.getLogger(__name__)


async def until_stopped() -> None:
    """Return at SIGTERM (the kubelet stopping the pod) or SIGINT, saying which."""
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            log.info("received %s, shutting down", signal.Signals(signum).name)
            return


class Heartbeat:
    """The event loop's pulse: /healthz fails when it stops, so a wedged daemon is restarted."""

    def __init__(self, interval: float = 2.0, max_age: float = 30.0) -> None:
        self._interval = interval
        self._max_age = max_age
        self._last = time.monotonic()

    async def run(self) -> None:
        """Beat until cancelled."""
        while True:
            self._last = time.monotonic()
            await anyio.sleep(self._interval)

    def alive(self) -> bool:
        """Whether the loop beat recently (called from the HTTP thread)."""
        return time.monotonic() - self._last < self._max_age
