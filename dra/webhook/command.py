"""`dra-gpu webhook`: the parsed flags as WebhookSettings, then the HTTPS server."""

from __future__ import annotations

import argparse

import anyio

from dra.webhook.server import WebhookSettings, run_webhook


def webhook(args: argparse.Namespace) -> int:
    """Serve the admission webhook until SIGTERM or SIGINT; the exit status."""
    settings = WebhookSettings(
        driver_name=args.driver_name,
        bind_address=args.bind_address,
        tls_cert_file=args.tls_cert_file,
        tls_key_file=args.tls_key_file,
        http_address=args.http_address or None,
        tls_reload_interval=args.tls_reload_interval,
    )
    anyio.run(run_webhook, settings, backend="asyncio")
    return 0
