"""dra.kubeletplugin.claimstatus: status.devices written off the request path, once, or given up on."""

from __future__ import annotations

import threading
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from dra.adapters.kube import KubeError, NotFoundError, UnreachableError
from dra.kubeletplugin import claimstatus
from dra.kubeletplugin.claimstatus import ClaimStatusWriter
from dra.model.prepared import PreparedClaim, PreparedDevice
from tests.unit.helpers import DRIVER, NODE, inventory

pytestmark = pytest.mark.anyio

INVENTORY = inventory("mixed")
GPU = INVENTORY.gpus[0]
CLAIM = PreparedClaim(
    "uid-1", "team", "train", (PreparedDevice(("gpu",), NODE, GPU.name, ("cdi",), uuid=GPU.uuid),)
)


class FakeServer:
    """Answers applies as told; keeps this driver's entries per claim as a server would."""

    def __init__(self, keeps: bool = True) -> None:
        self.keeps = keeps
        self.calls: list[tuple[str, list[dict[str, Any]], str]] = []
        self.failures: list[KubeError] = []
        self.stored: dict[str, list[dict[str, Any]]] = {}
        #: The threads the applies were made on.
        self.threads: set[int] = set()

    def write_resource_claim_devices(
        self, namespace: str, name: str, uid: str, devices: list[dict[str, Any]], field_manager: str
    ) -> dict[str, Any]:
        self.calls.append((uid, devices, field_manager))
        self.threads.add(threading.get_ident())
        if self.failures:
            raise self.failures.pop(0)
        self.stored[uid] = devices if self.keeps else []
        return {"status": {"devices": self.stored[uid]}}


@pytest.fixture(autouse=True)
def _no_lull(monkeypatch: pytest.MonkeyPatch) -> None:
    """Writes start at once unless a test waits for the lull itself."""
    monkeypatch.setattr(claimstatus, "QUIET", 0.0)
    monkeypatch.setattr(claimstatus, "MOST_DELAY", 0.0)


async def _drain(writer: ClaimStatusWriter) -> None:
    """Run the writer until what is queued is written (the applies run on a worker thread)."""
    async with anyio.create_task_group() as group:
        group.start_soon(writer.run)
        with anyio.fail_after(5):
            await anyio.lowlevel.checkpoint()
            # Polled: the writer has no event for "done", and a test needs none.
            while writer._pending or writer._writing:  # noqa: ASYNC110
                await anyio.sleep(0.001)
        await anyio.lowlevel.checkpoint()
        group.cancel_scope.cancel()


async def test_prepare_writes_the_entries_once_and_unprepare_writes_nothing() -> None:
    server = FakeServer()
    writer = ClaimStatusWriter(server, DRIVER, NODE)
    writer.prepared(CLAIM, INVENTORY)
    await _drain(writer)
    [(uid, devices, manager)] = server.calls
    assert (uid, manager) == ("uid-1", f"{DRIVER}/{NODE}")
    assert devices[0]["data"]["uuid"] == GPU.uuid
    # The kubelet's retry of the same prepare: nothing new to write.
    writer.prepared(CLAIM, INVENTORY)
    await _drain(writer)
    assert len(server.calls) == 1
    # The entries go when the claim is deallocated: the API server drops them itself.
    writer.unprepared("uid-1")
    await _drain(writer)
    assert len(server.calls) == 1


async def test_a_claim_prepared_again_after_its_unprepare_is_written_again() -> None:
    # Deallocated and allocated anew in between, the claim lost its entries on the server.
    server = FakeServer()
    writer = ClaimStatusWriter(server, DRIVER, NODE)
    writer.prepared(CLAIM, INVENTORY)
    await _drain(writer)
    writer.unprepared("uid-1")
    writer.prepared(CLAIM, INVENTORY)
    await _drain(writer)
    assert [uid for uid, _, _ in server.calls] == ["uid-1", "uid-1"]


async def test_a_claim_unprepared_before_its_entries_were_written_needs_no_write() -> None:
    server = FakeServer()
    writer = ClaimStatusWriter(server, DRIVER, NODE)
    writer.prepared(CLAIM, INVENTORY)
    writer.unprepared("uid-1")
    await _drain(writer)
    assert server.calls == []


async def test_after_a_restart_a_claim_unprepared_before_its_resync_needs_no_write() -> None:
    server = FakeServer()
    writer = ClaimStatusWriter(server, DRIVER, NODE)
    writer.resync([CLAIM], INVENTORY)
    writer.unprepared("uid-1")
    await _drain(writer)
    assert server.calls == []


async def test_an_apply_the_claim_was_unprepared_during_is_not_remembered() -> None:
    class UnpreparedMeanwhile(FakeServer):
        """The kubelet unprepares the claim while its first apply is on the way."""

        def write_resource_claim_devices(
            self, namespace: str, name: str, uid: str, devices: list[dict[str, Any]], field_manager: str
        ) -> dict[str, Any]:
            if not self.calls:
                writer.unprepared(uid)
            return super().write_resource_claim_devices(namespace, name, uid, devices, field_manager)

    server = UnpreparedMeanwhile()
    writer = ClaimStatusWriter(server, DRIVER, NODE)
    writer.prepared(CLAIM, INVENTORY)
    await _drain(writer)
    assert len(server.calls) == 1
    # Prepared again (the server may have dropped the entries at a deallocation): written again.
    writer.prepared(CLAIM, INVENTORY)
    await _drain(writer)
    assert len(server.calls) == 2


async def test_an_unanswered_apply_of_a_claim_unprepared_meanwhile_is_not_tried_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(claimstatus, "_RETRY_SECONDS", (0.0,))

    class UnpreparedMeanwhile(FakeServer):
        def write_resource_claim_devices(
            self, namespace: str, name: str, uid: str, devices: list[dict[str, Any]], field_manager: str
        ) -> dict[str, Any]:
            writer.unprepared(uid)
            self.calls.append((uid, devices, field_manager))
            raise UnreachableError("no answer")

    server = UnpreparedMeanwhile()
    writer = ClaimStatusWriter(server, DRIVER, NODE)
    writer.prepared(CLAIM, INVENTORY)
    await _drain(writer)
    assert len(server.calls) == 1


async def test_writes_wait_for_a_lull_in_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(claimstatus, "QUIET", 0.2)
    monkeypatch.setattr(claimstatus, "MOST_DELAY", 10.0)
    server = FakeServer()
    writer = ClaimStatusWriter(server, DRIVER, NODE)
    async with anyio.create_task_group() as group:
        group.start_soon(writer.run)
        writer.prepared(CLAIM, INVENTORY)
        await anyio.sleep(0.05)
        assert server.calls == []
        await anyio.sleep(0.4)
        assert len(server.calls) == 1
        group.cancel_scope.cancel()


async def test_a_change_waits_no_longer_than_the_most_delay(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(claimstatus, "QUIET", 0.05)
    monkeypatch.setattr(claimstatus, "MOST_DELAY", 0.3)
    server = FakeServer()
    writer = ClaimStatusWriter(server, DRIVER, NODE)
    other = PreparedClaim("uid-2", "team", "eval", CLAIM.devices)
    async with anyio.create_task_group() as group:
        group.start_soon(writer.run)
        started = anyio.current_time()
        writer.prepared(CLAIM, INVENTORY)
        # A change every 20 ms never leaves the quiet gap.
        with anyio.fail_after(2):
            while not server.calls:
                writer.unprepared("uid-2")
                writer.prepared(other, INVENTORY)
                await anyio.sleep(0.02)
        assert 0.25 <= anyio.current_time() - started < 1.5
        group.cancel_scope.cancel()


async def test_a_backlog_is_paced_while_changes_keep_coming(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(claimstatus, "QUIET", 0.05)
    monkeypatch.setattr(claimstatus, "MOST_DELAY", 0.0)
    monkeypatch.setattr(claimstatus, "PACE", 0.1)
    server = FakeServer()
    writer = ClaimStatusWriter(server, DRIVER, NODE)
    backlog = [PreparedClaim(f"uid-{i}", "team", f"c{i}", CLAIM.devices) for i in range(10)]
    churn = PreparedClaim("uid-churn", "team", "churn", CLAIM.devices)
    async with anyio.create_task_group() as group:
        for claim in backlog:
            writer.prepared(claim, INVENTORY)
        group.start_soon(writer.run)
        # Calls every 10 ms: the writes go one per PACE, not all at once.
        for _ in range(30):
            writer.prepared(churn, INVENTORY)
            writer.unprepared("uid-churn")
            await anyio.sleep(0.01)
        assert 2 <= len(server.calls) <= 5
        # Once the calls stop, the rest go without a pause.
        await anyio.sleep(0.2)
        assert len(server.calls) == 10
        group.cancel_scope.cancel()


async def test_an_unreachable_server_is_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(claimstatus, "_RETRY_SECONDS", (0.0,))
    server = FakeServer()
    server.failures = [UnreachableError("no answer")]
    writer = ClaimStatusWriter(server, DRIVER, NODE)
    writer.prepared(CLAIM, INVENTORY)
    await _drain(writer)
    assert len(server.calls) == 2
    assert server.stored["uid-1"]


async def test_claims_prepared_on_other_threads_are_written_by_the_writers_own() -> None:
    # The kubelet's calls are served on the gRPC server's threads, which only queue.
    server = FakeServer()
    writer = ClaimStatusWriter(server, DRIVER, NODE)
    threads = [
        threading.Thread(
            target=writer.prepared,
            args=(PreparedClaim(f"uid-{n}", "team", f"c{n}", CLAIM.devices), INVENTORY),
        )
        for n in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    await _drain(writer)
    assert sorted(server.stored) == [f"uid-{n}" for n in range(8)]
    [writer_thread] = server.threads
    assert writer_thread != threading.get_ident()


async def test_a_deleted_claim_is_dropped() -> None:
    server = FakeServer()
    server.failures = [NotFoundError("gone", 404)]
    writer = ClaimStatusWriter(server, DRIVER, NODE)
    writer.prepared(CLAIM, INVENTORY)
    await _drain(writer)
    assert len(server.calls) == 1
    assert writer.enabled
    assert not writer._written


async def test_a_role_without_claim_status_ends_the_writing(caplog: pytest.LogCaptureFixture) -> None:
    server = FakeServer()
    server.failures = [KubeError('cannot patch resource "resourceclaims/status"', 403)]
    writer = ClaimStatusWriter(server, DRIVER, NODE)
    writer.prepared(CLAIM, INVENTORY)
    await _drain(writer)
    assert not writer.enabled
    assert "no permission to write ResourceClaim status" in caplog.text
    writer.prepared(PreparedClaim("uid-2", "team", "eval", CLAIM.devices), INVENTORY)
    assert not writer._pending


async def test_a_server_that_drops_status_devices_ends_the_writing(caplog: pytest.LogCaptureFixture) -> None:
    writer = ClaimStatusWriter(FakeServer(keeps=False), DRIVER, NODE)
    writer.prepared(CLAIM, INVENTORY)
    await _drain(writer)
    assert not writer.enabled
    assert "DRAResourceClaimDeviceStatus off" in caplog.text


async def test_a_refused_claim_is_said_and_the_others_still_written(caplog: pytest.LogCaptureFixture) -> None:
    server = FakeServer()
    server.failures = [KubeError("status.devices: Invalid value: not allocated", 422)]
    writer = ClaimStatusWriter(server, DRIVER, NODE)
    writer.prepared(CLAIM, INVENTORY)
    await _drain(writer)
    assert writer.enabled
    assert "cannot write the status of ResourceClaim team/train" in caplog.text
