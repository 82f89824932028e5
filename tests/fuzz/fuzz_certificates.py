"""Fuzz target: the webhook's serving certificate and key, from the files' bytes to a loaded context.

atheris convention: TestOneInput(data) returns for every input, or raises what is a bug. The input
is the certificate file, then (after a blank line pair, ``\\n\\n\\n``) the key file; without the
separator both files hold the whole input (a PEM file may carry both). Loading them as the webhook
starts must load or be a StartupError (one line, exit 1); a reload with the files swapped must
answer True, False or None. Anything else (a traceback, MemoryError) is a bug.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from dra.daemon.bootstrap import StartupError
from dra.webhook.server import Certificates

#: The files the webhook reads, rewritten for each input (as a rotated Secret is).
_DIRECTORY = Path(tempfile.mkdtemp(prefix="fuzz-certificates-"))
CERT, KEY = _DIRECTORY / "tls.crt", _DIRECTORY / "tls.key"


def TestOneInput(data: bytes) -> None:  # noqa: N802 (atheris' name)
    """Load `data` as the webhook's certificate and key, then reload them swapped."""
    cert, separator, key = data.partition(b"\n\n\n")
    if not separator:
        key = cert
    CERT.write_bytes(cert)
    KEY.write_bytes(key)
    try:
        certificates = Certificates(CERT, KEY)
    except StartupError as err:
        refusal = str(err)
    else:
        refusal = ""
    if refusal:
        assert "\n" not in refusal, refusal
        return
    CERT.write_bytes(key)
    KEY.write_bytes(cert)
    assert certificates.reload_if_changed() in (True, False, None)
