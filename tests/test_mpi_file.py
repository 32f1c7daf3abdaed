"""``MPI.File`` (MPI-IO over a shared POSIX file system) against numpy and the file's bytes.

The view code (:class:`pycomm.MPI.fileview.View`) is checked without ranks against a
byte-mask model of the tiled filetype. The rest runs on worlds of 1, 2 and 3 ranks: each
rank writes through a view with a derived filetype (collective and independent calls,
explicit offsets, individual and shared pointers, ordered calls, nonblocking and split
collectives), the test process then reads the file with numpy and compares; reads are
checked against numpy on the ranks. Errors: every MPI error class the module promises,
raised before anything moved (the file's size and bytes unchanged), on every rank.
"""

from __future__ import annotations

import os
import pickle
import sys

import cloudpickle
import numpy as np
import pytest

from conftest import World
from pycomm import MPI
from pycomm.MPI.fileview import View

cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="session", params=[(1, "shm"), (2, "shm"), (3, "shm")],
                ids=lambda p: f"n{p[0]}-{p[1]}")
def world(request) -> World:
    """One, two and three ranks (shared pointers need more than one to mean anything)."""
    return World(*request.param)


# -- the view, without ranks ------------------------------------------------------------

def _filetypes():
    i4 = MPI.INT32_T
    return {
        "contiguous": i4.Create_contiguous(3).Commit(),
        "vector": i4.Create_vector(3, 2, 5).Commit(),
        "indexed": i4.Create_indexed([1, 3, 2], [0, 2, 9]).Commit(),
        "subarray": i4.Create_subarray([4, 6], [2, 3], [1, 2]).Commit(),
        "struct-gap": MPI.Datatype.Create_struct([1, 2], [4, 16], [i4, i4]).Commit(),
        "resized": i4.Create_vector(2, 1, 3).Create_resized(0, 40).Commit(),
        "hvector-bytes": MPI.BYTE.Create_hvector(4, 3, 7).Commit(),
    }


def _mask_model(ft, disp: int, tiles: int) -> np.ndarray:
    """File byte of every data byte of ``tiles`` tiles, from the flat type map."""
    sizes = np.array([d.itemsize for d in ft._dtypes])[ft._codes]
    one = np.concatenate([np.arange(d, d + s) for d, s in zip(ft._disps, sizes)])
    return np.concatenate([disp + t * ft.extent + one for t in range(tiles)])


@pytest.mark.parametrize("name", sorted(_filetypes()))
def test_view_segments_are_the_tiled_type_map(name):
    ft = _filetypes()[name]
    etype = MPI.BYTE if name == "hvector-bytes" else MPI.INT32_T
    view = View(12, etype, ft, "native")
    model = _mask_model(ft, 12, 6)
    rng = np.random.default_rng(7)
    cases = [(0, 0), (0, ft.size), (0, 3 * ft.size)] + \
        [tuple(sorted(rng.integers(0, 4 * ft.size, 2))) for _ in range(40)]
    for lo, hi in cases:
        lo, hi = lo - lo % view.esize, hi - hi % view.esize
        offs, lens = view.segments(lo, hi - lo)
        got = np.concatenate([np.arange(o, o + n) for o, n in zip(offs, lens)]) \
            if offs.size else np.empty(0, int)
        assert got.tolist() == model[lo:hi].tolist(), (name, lo, hi)
        assert (offs[1:] > offs[:-1] + lens[:-1]).all()          # merged where they touch
    for k in range(0, 3 * ft.size, view.esize):
        assert view.byte_offset(k // view.esize) == model[k]
    for fsize in range(0, int(model[3 * ft.size]) + 2):
        assert view.data_before(fsize) == int((model < fsize).sum())


def test_view_refuses_what_mpi_calls_erroneous():
    i4 = MPI.INT32_T
    bad = {
        "decreasing": (i4.Create_hindexed([1, 1], [8, 0]).Commit(), "ERR_TYPE"),
        "fraction": (MPI.BYTE.Create_contiguous(6).Commit(), "ERR_TYPE"),
        "uncommitted": (i4.Create_contiguous(2), "ERR_TYPE"),
        "empty": (i4.Create_contiguous(0).Commit(), "ERR_TYPE"),
    }
    for what, (ft, code) in bad.items():
        with pytest.raises(MPI.Exception) as info:
            View(0, i4, ft, "native")
        assert info.value.Get_error_class() == getattr(MPI, code), what
        assert "filetype" in str(info.value), what
    with pytest.raises(MPI.Exception) as info:
        View(-4, i4, i4, "native")
    assert info.value.Get_error_class() == MPI.ERR_ARG and "disp=-4" in str(info.value)


@pytest.mark.parametrize("kind", ["strided", "irregular", "large"])
def test_segment_moves_match_slicing_and_stop_at_eof(kind, tmp_path):
    from pycomm.MPI.fileio import read_segments, write_segments
    rng = np.random.default_rng({"strided": 1, "irregular": 2, "large": 3}[kind])
    if kind == "strided":                           # one strided view (sieved)
        offs, lens = np.arange(3, 3000, 10), np.full(300, 4)
    elif kind == "irregular":                       # one index (sieved)
        lens = rng.integers(1, 9, 200)
        offs = 5 + np.cumsum(lens + rng.integers(1, 6, 200)) - lens
    else:                                           # segment by segment
        lens = rng.integers(5000, 9000, 20)
        offs = np.cumsum(lens + rng.integers(1, 60000, 20)) - lens
    path = str(tmp_path / "segs")
    base = rng.integers(0, 256, int(offs[-1] + lens[-1]) + 7, dtype=np.uint8)
    base.tofile(path)
    data = rng.integers(0, 256, int(lens.sum()), dtype=np.uint8)
    want = base.copy()
    for o, n, start in zip(offs, lens, np.cumsum(lens) - lens):
        want[o:o + n] = data[start:start + n]
    fd = os.open(path, os.O_RDWR)
    try:
        for sieve in (True, False):
            base.tofile(path)
            assert write_segments(fd, offs, lens, data, sieve=sieve) == data.size
            assert np.fromfile(path, np.uint8).tolist() == want.tolist()
        out = np.zeros(data.size, np.uint8)
        assert read_segments(fd, offs, lens, out) == data.size
        assert out.tolist() == data.tolist()
        cut = int(offs[len(offs) // 2] + 1)         # the end of file inside a segment
        os.ftruncate(fd, cut)
        out = np.zeros(data.size, np.uint8)
        n = read_segments(fd, offs, lens, out)
        assert n == int(np.clip(cut - offs, 0, lens).sum())
        assert out[:n].tolist() == data[:n].tolist()
    finally:
        os.close(fd)


# -- on ranks -----------------------------------------------------------------------------

def _open(path: str, amode: int):
    return MPI.File.Open(MPI.COMM_WORLD, path, amode)


def _rank_subarray_collective(path: str):
    """Each rank writes its rows of a (size*2, 5) int32 array through a subarray view
    (Write_all, then Write_at_all into a second copy after it), reads them back through the
    same view (Read_all) and a column of every rank through a vector view (Read_at_all)."""
    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    rows, cols = 2 * size, 5
    fh = _open(path, MPI.MODE_RDWR | MPI.MODE_CREATE)
    ft = MPI.INT32_T.Create_subarray([rows, cols], [2, cols], [2 * rank, 0]).Commit()
    fh.Set_view(8, MPI.INT32_T, ft)
    mine = np.arange(2 * cols, dtype=np.int32) + 100 * rank
    fh.Write_all(mine)
    fh.Write_at_all(2 * cols, mine + 1)            # the next tile: the second copy
    back = np.zeros_like(mine)
    st = MPI.Status()
    fh.Seek(0)
    fh.Read_all(back, st)
    out = {"read": back.tolist(), "count": st.Get_count(MPI.INT32_T),
           "pos": fh.Get_position()}
    col = MPI.INT32_T.Create_vector(rows, 1, cols).Commit()
    fh.Set_view(8 + 4, MPI.INT32_T, col)           # from the second column
    column = np.zeros(rows, np.int32)
    fh.Read_at_all(0, column)                       # every rank's rows
    out["column"] = column.tolist()
    fh.Close()
    return out


def test_subarray_view_collective_write_gives_the_global_array(world, tmp_path):
    path = str(tmp_path / "grid")
    res = world.run(_rank_subarray_collective, path)
    size, cols = world.size, 5
    glob = np.concatenate([np.arange(2 * cols) + 100 * r for r in range(size)]) \
        .reshape(2 * size, cols)
    data = np.fromfile(path, np.int32)
    assert os.path.getsize(path) == 8 + 2 * 4 * glob.size
    assert data[2:2 + glob.size].tolist() == glob.ravel().tolist()
    assert data[2 + glob.size:].tolist() == (glob + 1).ravel().tolist()
    for r, out in enumerate(res):
        assert out["read"] == (np.arange(2 * cols) + 100 * r).tolist()
        assert out["count"] == 2 * cols and out["pos"] == 2 * cols
        assert out["column"] == glob[:, 1].tolist()


def _rank_interleaved(path: str):
    """Every rank writes int32 items cyclically interleaved with the others' (a sieved
    read-modify-write per rank, all at once), then reads them back, and one tile past
    the end of file."""
    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    fh = _open(path, MPI.MODE_RDWR | MPI.MODE_CREATE)
    ft = MPI.INT32_T.Create_resized(0, 4 * size).Commit()
    fh.Set_view(4 * rank, MPI.INT32_T, ft)
    mine = np.arange(20000, dtype=np.int32) * size + rank
    ok = []
    for _ in range(6):          # every rank at once: a stale hole put back shows as a 0
        fh.Set_size(0)
        fh.Write_at_all(0, mine)
        comm.Barrier()
        back = np.zeros(20001, np.int32)
        st = MPI.Status()
        fh.Read_at_all(0, back, st)
        ok.append(back[:20000].tolist() == mine.tolist())
        comm.Barrier()
    fh.Close()
    return all(ok), st.Get_count(MPI.INT32_T)


def test_interleaved_items_written_at_once_by_every_rank(world, tmp_path):
    path = str(tmp_path / "cyclic")
    assert world.run(_rank_interleaved, path) == [(True, 20000)] * world.size
    assert np.fromfile(path, np.int32).tolist() == list(range(20000 * world.size))


def _rank_independent(path: str):
    """Explicit offsets with a strided memory datatype, the individual pointer, statuses in
    etypes and a read that meets the end of file."""
    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    fh = _open(path, MPI.MODE_RDWR | MPI.MODE_CREATE)
    pair = MPI.DOUBLE.Create_contiguous(2).Commit()
    fh.Set_view(0, pair)                            # etype: two doubles
    mem = np.arange(12, dtype=np.float64) + 1000 * rank
    every_other = MPI.DOUBLE.Create_vector(3, 2, 4).Commit()    # doubles 0,1,4,5,8,9
    st = MPI.Status()
    fh.Write_at(3 * rank, [mem, 1, every_other], st)
    out = {"wcount": st.Get_count(pair), "welems": st.Get_elements(MPI.DOUBLE)}
    comm.Barrier()
    fh.Seek(3 * ((rank + 1) % size))
    got = np.full(6, -1.0)
    fh.Read(got, st)
    out["read"], out["pos"] = got.tolist(), fh.Get_position()
    out["byte"] = fh.Get_byte_offset(2)
    fh.Seek(-1, MPI.SEEK_END)
    tail = np.full(6, -1.0)
    fh.Read(tail, st)                               # one etype left before EOF
    out["tail"], out["tailcount"] = tail.tolist(), st.Get_count(pair)
    out["endpos"] = fh.Get_position()
    comm.Barrier()
    fh.Close()
    return out


def test_explicit_offsets_and_individual_pointers(world, tmp_path):
    path = str(tmp_path / "indep")
    res = world.run(_rank_independent, path)
    size = world.size
    pick = [0, 1, 4, 5, 8, 9]
    want = np.concatenate([np.arange(12.0)[pick] + 1000 * r for r in range(size)])
    assert np.fromfile(path, np.float64).tolist() == want.tolist()
    for r, out in enumerate(res):
        nxt = (r + 1) % size
        assert (out["wcount"], out["welems"]) == (3, 6)
        assert out["read"] == (np.arange(12.0)[pick] + 1000 * nxt).tolist()
        assert out["pos"] == 3 * nxt + 3 and out["byte"] == 32
        assert out["tail"] == want[-2:].tolist() + [-1.0] * 4
        assert out["tailcount"] == 1 and out["endpos"] == 3 * size


def _rank_shared(path: str):
    """Write_shared (any order), Write_ordered (rank order), Read_ordered and the shared
    pointer's position, Seek_shared, through a view that starts at byte 4."""
    comm = MPI.COMM_WORLD
    rank = comm.rank
    fh = _open(path, MPI.MODE_RDWR | MPI.MODE_CREATE)
    fh.Set_view(4, MPI.INT16_T)
    block = np.full(rank + 1, rank, np.int16)
    fh.Write_shared(block)
    comm.Barrier()
    after_shared = fh.Get_position_shared()
    fh.Write_ordered(block + 10)
    comm.Barrier()
    after_ordered = fh.Get_position_shared()
    fh.Seek_shared(after_shared)
    back = np.zeros(rank + 1, np.int16)
    fh.Read_ordered(back)
    req = fh.Iwrite_shared(np.array([77], np.int16))
    st = MPI.Status()
    req.Wait(st)
    out = {"shared": after_shared, "ordered": after_ordered, "back": back.tolist(),
           "icount": st.Get_count(MPI.INT16_T), "done": req == MPI.REQUEST_NULL}
    comm.Barrier()
    out["final"] = fh.Get_position_shared()
    fh.Close()
    return out


def test_shared_pointer_and_ordered_calls(world, tmp_path):
    path = str(tmp_path / "shared")
    res = world.run(_rank_shared, path)
    size = world.size
    n = size * (size + 1) // 2
    data = np.fromfile(path, np.int16, offset=4)
    shared, ordered, extra = data[:n], data[n:2 * n], data[2 * n:]
    # Write_shared: each rank's block once, contiguous, in some order
    runs = [shared[shared == r].size for r in range(size)]
    assert runs == [r + 1 for r in range(size)]
    assert ordered.tolist() == [10 + r for r in range(size) for _ in range(r + 1)]
    assert sorted(extra.tolist()) == [77] * size
    for r, out in enumerate(res):
        assert (out["shared"], out["ordered"]) == (n, 2 * n)
        assert out["back"] == [10 + r] * (r + 1)
        assert out["icount"] == 1 and out["done"] and out["final"] == 2 * n + size


def _rank_split_and_nonblocking(path: str):
    comm = MPI.COMM_WORLD
    rank = comm.rank
    fh = _open(path, MPI.MODE_RDWR | MPI.MODE_CREATE | MPI.MODE_DELETE_ON_CLOSE)
    fh.Set_view(0, MPI.INT64_T)
    w = np.arange(4, dtype=np.int64) + 10 * rank
    fh.Write_at_all_begin(4 * rank, w)
    errs = []
    for call in (lambda: fh.Read_all_begin(np.zeros(4, np.int64)),   # one in progress
                 lambda: fh.Write_all_end(w)):                       # not the one begun
        try:
            call()
        except MPI.Exception as exc:
            errs.append(exc.Get_error_class())
    st = MPI.Status()
    fh.Write_at_all_end(w, st)
    comm.Barrier()
    r = np.zeros(4, np.int64)
    fh.Iread_at_all(4 * rank, r).Wait(st)
    s = np.zeros(4, np.int64)
    fh.Seek(4 * rank)
    fh.Read_all_begin(s)
    fh.Read_all_end(s, st)
    try:
        fh.Read_all_end(s)
    except MPI.Exception as exc:
        errs.append(exc.Get_error_class())
    out = {"errs": errs, "r": r.tolist(), "s": s.tolist(), "count": st.Get_count(MPI.INT64_T)}
    fh.Close()
    comm.Barrier()
    out["gone"] = not os.path.exists(path)
    return out


def test_split_collectives_and_nonblocking_calls(world, tmp_path):
    path = str(tmp_path / "split")
    for r, out in enumerate(world.run(_rank_split_and_nonblocking, path)):
        assert out["errs"] == [MPI.ERR_IO] * 3
        assert out["r"] == out["s"] == [10 * r + i for i in range(4)]
        assert out["count"] == 4 and out["gone"]


def _code(fn) -> int | None:
    try:
        fn()
    except MPI.Exception as exc:
        return exc.Get_error_class()
    return None


def _raises(cls: type, fn) -> bool:
    try:
        fn()
    except cls:
        return True
    return False


def _rank_errors(path: str):
    """Every promised error class, and that nothing moved."""
    comm = MPI.COMM_WORLD
    missing = path + ".missing"
    got = {
        "amode-none": _code(lambda: _open(path, MPI.MODE_CREATE)),
        "amode-rdonly-create": _code(lambda: _open(path, MPI.MODE_RDONLY | MPI.MODE_CREATE)),
        "amode-rdwr-seq": _code(lambda: _open(path, MPI.MODE_RDWR | MPI.MODE_SEQUENTIAL)),
        "missing": _code(lambda: _open(missing, MPI.MODE_RDONLY)),
        "delete-missing": _code(lambda: MPI.File.Delete(missing)) if comm.rank == 0 else 37,
    }
    fh = _open(path, MPI.MODE_RDWR | MPI.MODE_CREATE)
    fh.Set_view(0, MPI.INT32_T)
    fh.Write_at_all(comm.rank, np.array([comm.rank], np.int32))
    comm.Barrier()
    size = fh.Get_size()
    got["exists"] = _code(lambda: _open(path, MPI.MODE_RDWR | MPI.MODE_CREATE |
                                        MPI.MODE_EXCL))
    got["fraction"] = _code(lambda: fh.Write_at(0, np.zeros(3, np.int8)))
    got["negative"] = _code(lambda: fh.Write_at(-1, np.zeros(1, np.int32)))
    got["buffer"] = _code(lambda: fh.Read_at(0, b"abcd"))            # read-only buffer
    got["datarep"] = _code(lambda: fh.Set_view(0, MPI.INT32_T, datarep="external32"))
    got["whence"] = _code(lambda: fh.Seek(0, 12345))
    got["seek-neg"] = _code(lambda: fh.Seek(-5, MPI.SEEK_CUR))
    got["unchanged"] = fh.Get_size() == size
    fh.Close()
    got["closed"] = _code(lambda: fh.Get_size())
    got["null"] = _code(lambda: MPI.FILE_NULL.Write(np.zeros(1)))
    ro = _open(path, MPI.MODE_RDONLY)
    got["read-only"] = _code(lambda: ro.Write_at(0, np.zeros(1, np.uint8)))
    got["ro-size"] = _code(lambda: ro.Set_size(0))
    ro.Close()
    wo = _open(path, MPI.MODE_WRONLY | MPI.MODE_SEQUENTIAL)
    got["write-only"] = _code(lambda: wo.Read_shared(np.zeros(1, np.uint8)))
    got["sequential"] = _code(lambda: wo.Write_at(0, np.zeros(1, np.uint8)))
    wo.Close()
    comm.Barrier()
    got["bytes"] = np.fromfile(path, np.int32).tolist()
    got["world-ok"] = comm.allreduce(1) == comm.size
    return got


def test_errors_have_mpi_classes_and_move_nothing(world, tmp_path):
    path = str(tmp_path / "errs")
    want = {"amode-none": MPI.ERR_AMODE, "amode-rdonly-create": MPI.ERR_AMODE,
            "amode-rdwr-seq": MPI.ERR_AMODE, "missing": MPI.ERR_NO_SUCH_FILE,
            "delete-missing": MPI.ERR_NO_SUCH_FILE, "exists": MPI.ERR_FILE_EXISTS,
            "fraction": MPI.ERR_TYPE, "negative": MPI.ERR_ARG, "buffer": MPI.ERR_BUFFER,
            "datarep": MPI.ERR_UNSUPPORTED_DATAREP, "whence": MPI.ERR_ARG,
            "seek-neg": MPI.ERR_ARG, "unchanged": True, "closed": MPI.ERR_FILE,
            "null": MPI.ERR_FILE, "read-only": MPI.ERR_READ_ONLY,
            "ro-size": MPI.ERR_READ_ONLY, "write-only": MPI.ERR_ACCESS,
            "sequential": MPI.ERR_UNSUPPORTED_OPERATION,
            "bytes": list(range(world.size)), "world-ok": True}
    for got in world.run(_rank_errors, path):
        assert got == want


def _rank_sizes_modes_and_handles(path: str):
    comm = MPI.COMM_WORLD
    out = {}
    fh = _open(path, MPI.MODE_RDWR | MPI.MODE_CREATE)
    fh.Preallocate(64)
    out["pre"] = fh.Get_size()
    fh.Preallocate(8)
    out["pre-small"] = fh.size
    fh.Set_size(10)
    out["set"] = fh.Get_size()
    fh.Set_atomicity(True)
    fh.Write_at_all(comm.rank, np.array([65 + comm.rank], np.uint8))
    out["atomic"] = fh.atomicity
    out["group"] = MPI.Group.Compare(fh.Get_group(), comm.Get_group()) == MPI.IDENT
    out["amode"] = fh.amode == MPI.MODE_RDWR | MPI.MODE_CREATE
    out["same"] = MPI.File.fromhandle(fh.handle) == fh and MPI.File(fh) == fh
    out["pickle"] = _raises(ValueError, lambda: pickle.dumps(fh))
    fh.Close()
    app = _open(path, MPI.MODE_WRONLY | MPI.MODE_APPEND)
    out["append"] = (app.Get_position(), app.Get_position_shared())
    comm.Barrier()                                  # every rank read it before any writes
    app.Write_shared(np.array([90], np.uint8))
    app.free()
    out["free"] = not app
    out["null"] = (pickle.loads(pickle.dumps(MPI.FILE_NULL)) is MPI.FILE_NULL,
                   MPI.File() == MPI.FILE_NULL, not MPI.FILE_NULL,
                   _raises(TypeError, lambda: hash(MPI.FILE_NULL)))
    comm.Barrier()
    return out


def test_sizes_modes_and_handles(world, tmp_path):
    path = str(tmp_path / "sizes")
    for out in world.run(_rank_sizes_modes_and_handles, path):
        assert (out["pre"], out["pre-small"], out["set"]) == (64, 64, 10)
        assert out["atomic"] and out["group"] and out["amode"] and out["same"]
        assert out["pickle"] and out["append"] == (10, 10) and out["free"]
        assert out["null"] == (True, True, True, True)
    data = open(path, "rb").read()
    size = world.size
    assert data[:size] == bytes(65 + r for r in range(size))
    assert data[size:10] == bytes(10 - size) and data[10:] == bytes([90] * size)
