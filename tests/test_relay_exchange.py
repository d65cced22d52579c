"""dmatmul._route.exchange on every rank of a simulated communicator: each
rank's block re-laid from one Sharded to another through one buffer-based
``Alltoallv`` of bytes (no pickling ``alltoall``: the fake communicator has
none), for dtypes MPI has no type for, uneven layouts and ranks that get
nothing, against numpy. tests/mpi/sharded.py runs it under mpiexec."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

import dmatmul as dm
from dmatmul._route import Route, as_nd, exchange
from dmatmul._spec import numpy_dtype

MESH = dm.ProcessMesh((2, 2), ("x", "y"))


class _Wire:
    """What the simulated ranks share: one Alltoallv at a time, met at a barrier."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.barrier = threading.Barrier(size, timeout=30)
        self.sent: list[Any] = [None] * size
        self.calls: list[tuple[int, np.ndarray, np.ndarray]] = []  # (rank, bytes sent per rank, got per rank)
        self.lock = threading.Lock()


class _Comm:
    """One rank's communicator with only the buffer-based ``Alltoallv``
    (mpi4py's ``[buffer, (counts, displacements)]`` form)."""

    def __init__(self, wire: _Wire, rank: int) -> None:
        self.wire, self.rank = wire, rank

    def Alltoallv(self, sendbuf: Any, recvbuf: Any) -> None:  # noqa: N802 - mpi4py's name
        (send, (s_counts, s_displs)), (recv, (r_counts, r_displs)) = sendbuf, recvbuf
        for buf in (send, recv):  # bytes: exact for every dtype, and a type every MPI has
            assert isinstance(buf, np.ndarray) and buf.dtype == np.uint8 and buf.flags.c_contiguous
        wire, me = self.wire, self.rank
        with wire.lock:
            wire.calls.append((me, np.array(s_counts), np.array(r_counts)))
            wire.sent[me] = (send, np.array(s_counts), np.array(s_displs))
        wire.barrier.wait()
        for src in range(wire.size):
            buf, counts, displs = wire.sent[src]
            assert counts[me] == r_counts[src], (src, me, counts[me], r_counts[src])
            recv[r_displs[src]:r_displs[src] + r_counts[src]] = buf[displs[me]:displs[me] + counts[me]]
        wire.barrier.wait()  # (no rank's send buffer is reused before every rank has read it)


def _run_all(route: Route, blocks: list[np.ndarray], dtype: Any) -> tuple[list[np.ndarray], _Wire]:
    """``exchange`` on every rank at once, each in a thread of its own."""
    size = len(blocks)
    wire = _Wire(size)
    got: list[Any] = [None] * size
    errors: list[BaseException] = []

    def rank(r: int) -> None:
        try:
            got[r] = exchange(blocks[r], route, r, _Comm(wire, r), dtype)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)
            wire.barrier.abort()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return got, wire


def _global(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    rng = np.random.default_rng(len(shape) * 100 + shape[-1])
    x = rng.standard_normal(shape) * 8
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rng.standard_normal(shape) * 8
    return x.astype(dtype)


# (source spec, destination spec, global shape): uneven splits, ranks that hold or get nothing
ROUTES = [
    (("x", None), (("y", "x"), None), (7, 5)),
    ((None, ("y", "x")), ("x", "y"), (6, 3)),  # 3 columns over 4 ranks: rank 3 holds none of them
    ((("x", "y"), None), (None, None), (3, 4)),  # to replicated: every rank gets the rows it lacks
    (("y", None), ((("x", "y")), None), (3, 4)),  # 3 rows over 4 ranks: one rank gets nothing
    (("x", None, "y"), (None, ("y", "x"), None), (3, 5, 6)),  # a batch split, re-laid to its rows
]


@pytest.mark.parametrize("dtype", ["float64", "bfloat16", "complex64", "float8_e4m3fn"])
@pytest.mark.parametrize("case", range(len(ROUTES)))
def test_exchange_relays_every_ranks_block_through_one_alltoallv_of_bytes(case, dtype):
    src_spec, dst_spec, shape = ROUTES[case]
    dt = numpy_dtype(dtype)
    src, dst = dm.Sharded(MESH, src_spec), dm.Sharded(MESH, dst_spec)
    x = _global(shape, dt)
    size = MESH.size
    route = Route.of(as_nd(src, len(shape), size), as_nd(dst, len(shape), size), shape, size)
    blocks = [x[np.ix_(*src.global_indices(r, shape))] for r in range(size)]
    got, wire = _run_all(route, blocks, dt)
    for r in range(size):
        want = x[np.ix_(*dst.global_indices(r, shape))]
        assert got[r].dtype == dt and got[r].shape == want.shape
        np.testing.assert_array_equal(got[r].view(np.uint8), want.view(np.uint8))  # bit for bit
    # one call per rank; each sends exactly the elements the route says the others lack, none to itself
    assert sorted(r for r, _, _ in wire.calls) == list(range(size))
    for r, sent, received in wire.calls:
        assert sent[r] == 0 and received[r] == 0
        assert received.sum() == route.received(r) * dt.itemsize
    if any(route.received(r) == 0 for r in range(size)):
        assert any(received.sum() == 0 for _, _, received in wire.calls)


def test_a_route_where_no_rank_lacks_anything_calls_no_collective():
    shape = (8, 4)
    d = dm.Sharded(MESH, ("x", "y"))
    route = Route.of(d, dm.Sharded(MESH, ("x", "y")), shape, MESH.size)
    x = _global(shape, np.float32)
    blocks = [x[np.ix_(*d.global_indices(r, shape))] for r in range(MESH.size)]
    got, wire = _run_all(route, blocks, np.float32)
    assert wire.calls == []
    for r in range(MESH.size):
        np.testing.assert_array_equal(got[r], blocks[r])
