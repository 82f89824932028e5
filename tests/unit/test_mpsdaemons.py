"""The MPS daemons' programs read as data: start or join, the limits each read back and judged, release, stop.

The daemons themselves (processes, pid files, the control pipe) are tests/unit/test_mps.py's, which
needs root; these call the programs of dra.core.mpsdaemons on a recording runner with answers given by hand.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from dra.core import mpsdaemons, sharing
from dra.model.node import StepError
from dra.model.prepared import PreparedClaim, PreparedDevice
from tests.unit.helpers import RecordingRunner

GPU_0, GPU_1 = "GPU-00000000-0000-0000-0000-000000000000", "GPU-11111111-1111-1111-1111-111111111111"
KEY = sharing.mps_key([GPU_0, GPU_1])


def _claim(uid: str, *uuids: str, share: str = "", percentage: int = 0, limit: str = "") -> PreparedClaim:
    devices = tuple(
        PreparedDevice(
            ("gpu",),
            "node-a",
            f"gpu-{i}",
            (),
            uuid=uuid,
            share_id=share,
            mps=True,
            mps_thread_percentage=percentage,
            mps_pinned_limit=limit,
        )
        for i, uuid in enumerate(uuids)
    )
    return PreparedClaim(uid, "team-a", f"claim-{uid}", devices)


def _seen(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """A step as text: a log line's and an MPS command's text, a launch's point and multi-user flag."""
    point = kwargs.get("point", "")
    match name:
        case "log":
            return f"log {args[1]}"
        case "ask_mps":
            return f"ask_mps {args[1]}"
        case "launch_mps":
            return f"launch_mps@{point} multi-user={args[1]}"
        case _:
            return f"{name}@{point}" if point else name


def _run(
    program: Callable[[mpsdaemons.MpsRunner], None], answer: Callable[[str, tuple[Any, ...]], object]
) -> list[str]:
    """Each step the program calls, as text, answered by `answer`; a StepError it raises ends the list."""
    steps = RecordingRunner(answer)
    try:
        program(steps)
    except StepError as err:
        return [*(_seen(*call) for call in steps.calls), f"StepError: {err}"]
    return [_seen(*call) for call in steps.calls]


def _daemon(
    pid: int | None, answers: dict[str, str] | None = None
) -> Callable[[str, tuple[Any, ...]], object]:
    """A node whose daemon runs as `pid` (None: none runs; a launch starts 42) and answers thus."""

    def answer(name: str, args: tuple[Any, ...]) -> object:
        match name:
            case "mps_daemon_pid":
                return pid
            case "launch_mps":
                return 42
            case "ask_mps":
                return (answers or {}).get(args[1], "")
        return None

    return answer


def test_a_claim_starts_its_daemon_and_sets_its_limits_each_read_back() -> None:
    claim = _claim("a", GPU_0, GPU_1, percentage=50, limit="8192M")
    answers = {
        "set_default_active_thread_percentage 50": "50.0",
        "get_default_device_pinned_mem_limit 0": "8G",
        "get_default_device_pinned_mem_limit 1": "8G",
    }
    assert _run(lambda steps: mpsdaemons.start(steps, claim), _daemon(None, answers)) == [
        "mps_daemon_pid",
        "launch_mps@mps-daemon-started multi-user=False",
        f"log started MPS control daemon 42 ({KEY}) for claim a",
        "ask_mps set_default_active_thread_percentage 50",
        "ask_mps set_default_device_pinned_mem_limit 0 8192M",
        "ask_mps get_default_device_pinned_mem_limit 0",
        "ask_mps set_default_device_pinned_mem_limit 1 8192M",
        "ask_mps get_default_device_pinned_mem_limit 1",
    ]


def test_a_claim_joins_a_running_daemon_and_a_shared_one_gets_no_defaults() -> None:
    claim = _claim("b", GPU_0, GPU_1, share="s-1", percentage=50, limit="8192M")
    assert _run(lambda steps: mpsdaemons.start(steps, claim), _daemon(7)) == [
        "mps_daemon_pid",
        f"log claim b uses MPS control daemon 7 ({KEY})",
    ]


@pytest.mark.parametrize(
    ("answers", "refusal"),
    [
        (
            {"set_default_active_thread_percentage 50": "100.0"},
            "did not take 'set_default_active_thread_percentage 50': it answered '100.0'",
        ),
        (
            {"set_default_active_thread_percentage 50": "50.0", "get_default_device_pinned_mem_limit 0": ""},
            "did not take 'set_default_device_pinned_mem_limit 0 8192M': it answered nothing",
        ),
    ],
)
def test_a_value_the_daemon_does_not_hold_fails_the_start(answers: dict[str, str], refusal: str) -> None:
    seen = _run(
        lambda steps: mpsdaemons.start(steps, _claim("a", GPU_0, GPU_1, percentage=50, limit="8192M")),
        _daemon(7, answers),
    )
    assert seen[-1] == f"StepError: MPS control daemon {KEY} {refusal}"


def test_the_last_claim_of_a_daemon_stops_it_and_start_up_stops_those_no_claim_uses() -> None:
    mine, theirs = _claim("a", GPU_0, GPU_1), _claim("b", GPU_0, GPU_1, share="s-1")
    assert _run(lambda steps: mpsdaemons.release(steps, mine, {"b": theirs}), _daemon(7)) == [
        f"log MPS control daemon {KEY} stays for claims b"
    ]
    assert _run(lambda steps: mpsdaemons.release(steps, mine, {}), _daemon(7)) == ["stop_mps"]
    # A claim without MPS has no daemon to release.
    assert (
        _run(lambda steps: mpsdaemons.release(steps, PreparedClaim("c", "team-a", "c", ()), {}), _daemon(7))
        == []
    )
    left = sharing.mps_key([GPU_1])

    def listed(name: str, args: tuple[Any, ...]) -> object:
        return (KEY, left) if name == "list_mps_daemons" else None

    assert _run(lambda steps: mpsdaemons.stop_others(steps, {"a": mine}), listed) == [
        "list_mps_daemons",
        f"log stopping MPS control daemon {left}, which no prepared claim uses",
        "stop_mps",
    ]
