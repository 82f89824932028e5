"""The MPS daemons' programs read as data: start or join, the limits each read back and judged, release, stop.

The daemons themselves (processes, pid files, the control pipe) are tests/unit/test_mps.py's, which
needs root; these run the programs of dra.core.mpsdaemons against answers given by hand.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dra.core import mpsdaemons, sharing
from dra.core.steps import Log, Step, StepError
from dra.model.prepared import PreparedClaim, PreparedDevice

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


def _run(
    program: mpsdaemons.Program[None], answer: Callable[[Step[mpsdaemons.MpsRunner]], object]
) -> list[str]:
    """Each step the program yields, as text, answered by `answer`; a StepError it raises ends the list."""
    seen: list[str] = []
    result: object = None
    while True:
        try:
            step = program.send(result)
        except StopIteration:
            return seen
        except StepError as err:
            return [*seen, f"StepError: {err}"]
        match step:
            case Log():
                seen.append(f"Log {step.message}")
            case mpsdaemons.AskMps():
                seen.append(f"AskMps {step.command}")
            case mpsdaemons.LaunchMps():
                seen.append(f"LaunchMps@{step.point} multi-user={step.multi_user}")
            case _:
                seen.append(type(step).__name__)
        result = answer(step)


def _daemon(
    pid: int | None, answers: dict[str, str] | None = None
) -> Callable[[Step[mpsdaemons.MpsRunner]], object]:
    """A node whose daemon runs as `pid` (None: none runs; a launch starts 42) and answers thus."""

    def answer(step: Step[mpsdaemons.MpsRunner]) -> object:
        match step:
            case mpsdaemons.MpsDaemonPid():
                return pid
            case mpsdaemons.LaunchMps():
                return 42
            case mpsdaemons.AskMps():
                return (answers or {}).get(step.command, "")
        return None

    return answer


def test_a_claim_starts_its_daemon_and_sets_its_limits_each_read_back() -> None:
    claim = _claim("a", GPU_0, GPU_1, percentage=50, limit="8192M")
    answers = {
        "set_default_active_thread_percentage 50": "50.0",
        "get_default_device_pinned_mem_limit 0": "8G",
        "get_default_device_pinned_mem_limit 1": "8G",
    }
    assert _run(mpsdaemons.start(claim), _daemon(None, answers)) == [
        "MpsDaemonPid",
        "LaunchMps@mps-daemon-started multi-user=False",
        f"Log started MPS control daemon 42 ({KEY}) for claim a",
        "AskMps set_default_active_thread_percentage 50",
        "AskMps set_default_device_pinned_mem_limit 0 8192M",
        "AskMps get_default_device_pinned_mem_limit 0",
        "AskMps set_default_device_pinned_mem_limit 1 8192M",
        "AskMps get_default_device_pinned_mem_limit 1",
    ]


def test_a_claim_joins_a_running_daemon_and_a_shared_one_gets_no_defaults() -> None:
    claim = _claim("b", GPU_0, GPU_1, share="s-1", percentage=50, limit="8192M")
    assert _run(mpsdaemons.start(claim), _daemon(7)) == [
        "MpsDaemonPid",
        f"Log claim b uses MPS control daemon 7 ({KEY})",
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
        mpsdaemons.start(_claim("a", GPU_0, GPU_1, percentage=50, limit="8192M")), _daemon(7, answers)
    )
    assert seen[-1] == f"StepError: MPS control daemon {KEY} {refusal}"


def test_the_last_claim_of_a_daemon_stops_it_and_start_up_stops_those_no_claim_uses() -> None:
    mine, theirs = _claim("a", GPU_0, GPU_1), _claim("b", GPU_0, GPU_1, share="s-1")
    assert _run(mpsdaemons.release(mine, {"b": theirs}), _daemon(7)) == [
        f"Log MPS control daemon {KEY} stays for claims b"
    ]
    assert _run(mpsdaemons.release(mine, {}), _daemon(7)) == ["StopMps"]
    # A claim without MPS has no daemon to release.
    assert _run(mpsdaemons.release(PreparedClaim("c", "team-a", "c", ()), {}), _daemon(7)) == []
    left = sharing.mps_key([GPU_1])

    def listed(step: Step[mpsdaemons.MpsRunner]) -> object:
        return (KEY, left) if isinstance(step, mpsdaemons.ListMpsDaemons) else None

    assert _run(mpsdaemons.stop_others({"a": mine}), listed) == [
        "ListMpsDaemons",
        f"Log stopping MPS control daemon {left}, which no prepared claim uses",
        "StopMps",
    ]
