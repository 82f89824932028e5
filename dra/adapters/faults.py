"""Test-only crash points: end the process at a named durable step, as kill -9 would there.

With DRA_GPU_FAULT_POINT=NAME the process ends with status 137 the first time
it reaches ``point(NAME)``; NAME:N ends it at the N-th time. The crash-point
matrix (tests/e2e/test_crash_points.py) drives every point and checks that the
restarted driver converges. Unset, a point is one string comparison.
"""

from __future__ import annotations

import os

_NAME, _, _COUNT = os.environ.get("DRA_GPU_FAULT_POINT", "").partition(":")
_left = int(_COUNT) if _COUNT else 1


def point(name: str) -> None:
    """End the process here (os._exit(137), no clean-up) when DRA_GPU_FAULT_POINT names this point."""
    global _left
    if name != _NAME:
        return
    _left -= 1
    if _left <= 0:
        # Straight to fd 2: no logging handler, buffer or atexit hook runs, as with SIGKILL.
        os.write(2, f"fault point {name}: exiting with 137\n".encode())
        os._exit(137)
