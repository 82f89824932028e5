"""Fuzzed kubelet calls: anything on the plugin's socket gets per-claim answers or a clean gRPC status.

The real DRA service and gRPC server run on a unix socket (grpcio's
synchronous server, as in the daemon), with the state on real files
and claims from tests.integration.stubkube. Hypothesis sends random,
duplicate and oversized claim batches, odd UIDs, names and namespaces, and
garbage or truncated protobuf bytes; after every example the service must
still answer and the node's state must be consistent (every checkpointed claim
has its CDI spec and nothing else has one; no device handed out twice).
HYPOTHESIS_PROFILE=fuzz-long runs many more examples.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dra.pb.dra.v1 import dra_pb2
from tests.integration.inprocess import Node, serving

DRIVER = "fuzz.dra-gpu.test"
PREPARE = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"
UNPREPARE = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources"
#: Statuses a malformed request may end in: grpcio's synchronous server answers INTERNAL ("Exception
#: deserializing request!") for bytes that do not decode as the request message, and RESOURCE_EXHAUSTED
#: for a message over its 4 MiB receive limit.
CLEAN_STATUSES = {grpc.StatusCode.INTERNAL, grpc.StatusCode.RESOURCE_EXHAUSTED}


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    """The plugin with claims on every device (some sharing one) and one in another node's pool."""
    with serving(DRIVER) as plugin:
        for i in range(12):
            plugin.claim(f"claim-{i}", [f"gpu-{i % 8}"])
        plugin.kube.add_claim("ns", "elsewhere", DRIVER, "another-node", ["gpu-1"])
        yield plugin


def _known(node: Node) -> list[dra_pb2.Claim]:
    """References to the claims the API server holds."""
    return [
        dra_pb2.Claim(namespace=ns, name=name, uid=claim["metadata"]["uid"])
        for (ns, name), claim in node.kube.claims.items()
    ]


def _assert_consistent(node: Node) -> None:
    """Checkpoint and CDI directory agree; no device is held by two claims; the service answers."""
    prepared = node.state.prepared
    assert sorted(prepared) == node.cdi.claim_uids()
    assert not list(node.cdi.root.glob(".*.tmp"))
    held = [(d.pool, d.device) for c in prepared.values() for d in c.devices if not d.admin_access]
    assert len(held) == len(set(held))
    empty = node.stub.NodePrepareResources(dra_pb2.NodePrepareResourcesRequest(), timeout=10)
    assert dict(empty.claims) == {}


_odd_text = st.one_of(
    st.text(max_size=40),
    st.text(alphabet="/.?#%&=\\ \n\x00", max_size=20),
    st.sampled_from(["", ".", "..", "../..", "ns/claim-1", "claim-1?watch=true", "a" * 300]),
    st.text(min_size=5000, max_size=70000).map(lambda s: s or "x"),
)


@st.composite
def _claim_refs(draw: st.DrawFn, known: list[dra_pb2.Claim]) -> dra_pb2.Claim:
    choice = draw(st.sampled_from(["known", "known-bad-uid", "random"]))
    if choice == "random":
        return dra_pb2.Claim(namespace=draw(_odd_text), name=draw(_odd_text), uid=draw(_odd_text))
    ref = draw(st.sampled_from(known))
    if choice == "known":
        return dra_pb2.Claim(namespace=ref.namespace, name=ref.name, uid=ref.uid)
    uid = draw(st.one_of(_odd_text, st.builds(lambda: str(uuid.uuid4()))))
    return dra_pb2.Claim(namespace=ref.namespace, name=ref.name, uid=uid)


@given(data=st.data())
def test_random_batches_get_an_answer_per_claim(node: Node, data: st.DataObject) -> None:
    refs = data.draw(st.lists(_claim_refs(_known(node)), max_size=40))
    # Duplicates: the kubelet never sends them, but a batch must still get one answer per UID.
    refs += data.draw(st.lists(st.sampled_from(refs), max_size=5)) if refs else []
    stub = node.stub
    if data.draw(st.booleans()):
        prepared = stub.NodePrepareResources(dra_pb2.NodePrepareResourcesRequest(claims=refs), timeout=30)
        assert set(prepared.claims) == {r.uid for r in refs}
        for ref in refs:
            answer = prepared.claims[ref.uid]
            assert bool(answer.error) != bool(answer.devices), (ref, answer)
            if ref not in _known(node):
                assert answer.error
    else:
        unprepared = stub.NodeUnprepareResources(
            dra_pb2.NodeUnprepareResourcesRequest(claims=refs), timeout=30
        )
        assert set(unprepared.claims) == {r.uid for r in refs}
        assert all(unprepared.claims[r.uid].error == "" for r in refs)
        assert not set(node.state.prepared) & {r.uid for r in refs}
    _assert_consistent(node)


def _raw_call(node: Node, method: str, payload: bytes) -> None:
    """Send bytes as the request; a decodable answer or a clean status, never a hang or a dead server."""
    call: grpc.UnaryUnaryMultiCallable[bytes, bytes] = node.channel.unary_unary(
        method, request_serializer=None, response_deserializer=None
    )
    future = call.future(payload, timeout=10)
    if future.exception() is not None:
        assert future.code() in CLEAN_STATUSES, future.exception()


@given(method=st.sampled_from([PREPARE, UNPREPARE]), payload=st.binary(max_size=4096))
def test_garbage_bytes_get_a_clean_status(node: Node, method: str, payload: bytes) -> None:
    _raw_call(node, method, payload)
    _assert_consistent(node)


@given(method=st.sampled_from([PREPARE, UNPREPARE]), data=st.data())
def test_truncated_requests_get_a_clean_status(node: Node, method: str, data: st.DataObject) -> None:
    refs = data.draw(st.lists(_claim_refs(_known(node)), min_size=1, max_size=5))
    whole = dra_pb2.NodePrepareResourcesRequest(claims=refs).SerializeToString()
    _raw_call(node, method, whole[: data.draw(st.integers(0, len(whole) - 1))])
    _assert_consistent(node)


def test_a_batch_over_the_message_limit_is_refused_cleanly(node: Node) -> None:
    """gRPC's 4 MiB receive limit answers RESOURCE_EXHAUSTED; the service goes on serving."""
    refs = [dra_pb2.Claim(namespace="ns", name="n" * 1000, uid=str(i)) for i in range(5000)]
    with pytest.raises(grpc.RpcError) as refused:
        node.stub.NodePrepareResources(dra_pb2.NodePrepareResourcesRequest(claims=refs), timeout=30)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    _assert_consistent(node)
