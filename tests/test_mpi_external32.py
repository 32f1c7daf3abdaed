"""The external32 representation (pycomm/MPI/external32.py) against the bytes mpi4py
4.1.2 + MPICH 5.0.2 packed on this machine for the same calls (recorded below), and round
trips of the types MPICH does not convert (value/index pairs, structs mixing LONG and
LONG_LONG, WCHAR: MPICH sized the pairs 0 or 1 byte and crashed on CHAR, WCHAR and a
struct). mpi4py's own test_pack passes 6 of 6 (4 before: no external32).
"""

from __future__ import annotations

import numpy as np
import pytest

from pycomm import MPI

EXT32 = "external32"

# (datatype name, values, numpy dtype, Pack_external's bytes under MPICH)
MPICH_BYTES = [
    ("LONG", [1, -2, 2**40 + 3], "l", "00000001fffffffe00000003"),     # 4 bytes: wraps
    ("UNSIGNED_LONG", [1, 2**40 + 3], "L", "0000000100000003"),
    ("LONG_LONG", [1, -2], "q", "0000000000000001fffffffffffffffe"),
    ("AINT", [1, -2], "q", "0000000000000001fffffffffffffffe"),
    ("INT", [1, -2], "i", "00000001fffffffe"),
    ("SHORT", [1, -2], "h", "0001fffe"),
    ("DOUBLE", [1.5, -2.25], "d", "3ff8000000000000c002000000000000"),
    ("FLOAT", [1.5, -2.25], "f", "3fc00000c0100000"),
    ("LONG_DOUBLE", [1.5, -2.25, 0.0, np.inf], "g",
     "3fff8000000000000000000000000000c0002000000000000000000000000000"
     "000000000000000000000000000000007fff0000000000000000000000000000"),
    ("C_DOUBLE_COMPLEX", [1.5 + 2j], "D", "3ff80000000000004000000000000000"),
    ("C_LONG_DOUBLE_COMPLEX", [1.5 + 2j], "G",
     "3fff800000000000000000000000000040000000000000000000000000000000"),
    ("C_BOOL", [True, False], "?", "0100"),
]


@pytest.mark.parametrize("name,values,code,hexed", MPICH_BYTES,
                         ids=[row[0] for row in MPICH_BYTES])
def test_basic_types_pack_to_mpichs_bytes_and_back(name, values, code, hexed):
    dt = getattr(MPI, name)
    data = np.array(values, code)
    size = dt.Pack_external_size(EXT32, len(data))
    assert size == len(hexed) // 2
    buf = bytearray(size + 3)
    assert dt.Pack_external(EXT32, data, buf, 3) == size + 3
    assert buf[3:].hex() == hexed
    out = np.zeros_like(data)
    assert dt.Unpack_external(EXT32, buf, 3, out) == size + 3
    want = data if name not in ("LONG", "UNSIGNED_LONG") else data.astype(
        np.int32 if name == "LONG" else np.uint32)
    assert out.tolist() == want.tolist()


def test_sizes_as_mpich_reports_them():
    sizes = {"BYTE": 1, "CHAR": 1, "WCHAR": 2, "SHORT": 2, "INT": 4, "LONG": 4,
             "UNSIGNED_LONG": 4, "LONG_LONG": 8, "FLOAT": 4, "DOUBLE": 8,
             "LONG_DOUBLE": 16, "C_BOOL": 1, "AINT": 8, "COUNT": 8, "OFFSET": 8,
             "C_FLOAT_COMPLEX": 8, "C_LONG_DOUBLE_COMPLEX": 32, "INT64_T": 8}
    for name, size in sizes.items():
        dt = getattr(MPI, name)
        assert (dt.Pack_external_size(EXT32, 0), dt.Pack_external_size(EXT32, 3)) == \
            (0, 3 * size), name


def test_a_vector_packs_whole_items_of_the_buffer():
    vec = MPI.INT.Create_vector(2, 1, 2).Commit()            # extent 12 bytes
    data = np.arange(4, dtype="i")                            # 16 bytes: one item
    buf = bytearray(vec.Pack_external_size(EXT32, 1))
    assert vec.Pack_external(EXT32, data, buf, 0) == 8
    assert buf.hex() == "0000000000000002"                    # MPICH's bytes
    out = np.full(4, -1, "i")
    assert vec.Unpack_external(EXT32, buf, 0, out) == 8
    assert out.tolist() == [0, -1, 2, -1]                     # the gaps untouched
    native = bytearray(8)                                     # (Pack counts items so too)
    assert vec.Pack(data, native, 0) == 8 and vec.Unpack(native, 0, out) == 8
    vec.Free()


def test_pairs_structs_and_wide_chars_round_trip_in_the_standards_sizes():
    pair = np.dtype([("val", "f8"), ("idx", "i4")], align=True)
    data = np.array([(1.5, 7), (-2.0, -1)], pair)
    assert MPI.DOUBLE_INT.Pack_external_size(EXT32, 2) == 24        # 8 + 4, no padding
    buf = bytearray(24)
    MPI.DOUBLE_INT.Pack_external(EXT32, data, buf, 0)
    assert buf[:12].hex() == "3ff8000000000000" "00000007"
    out = np.zeros_like(data)
    MPI.DOUBLE_INT.Unpack_external(EXT32, buf, 0, out)
    assert out.tolist() == data.tolist()
    lpair = np.dtype([("val", "l"), ("idx", "i4")], align=True)
    assert MPI.LONG_INT.Pack_external_size(EXT32, 1) == 8           # long 4 + int 4
    ld = np.array([(-5, 3)], lpair)
    lbuf = bytearray(8)
    MPI.LONG_INT.Pack_external(EXT32, ld, lbuf, 0)
    assert lbuf.hex() == "fffffffb00000003"
    # a struct mixing LONG (4 bytes in external32) and LONG_LONG (8), equal dtypes here
    st = MPI.Datatype.Create_struct([1, 1, 2], [0, 8, 16],
                                    [MPI.LONG, MPI.LONG_LONG, MPI.DOUBLE]).Commit()
    sd = np.dtype([("a", "l"), ("b", "q"), ("c", "f8", (2,))])
    items = np.array([(-3, -4, (0.5, 1.0)), (5, 6, (2.0, 4.0))], sd)
    assert st.Pack_external_size(EXT32, 2) == 2 * (4 + 8 + 16)
    sbuf = bytearray(56)
    assert st.Pack_external(EXT32, items, sbuf, 0) == 56
    assert sbuf[:12].hex() == "fffffffd" "fffffffffffffffc"
    back = np.zeros_like(items)
    st.Unpack_external(EXT32, sbuf, 0, back)
    assert back.tobytes() == items.tobytes()
    st.Free()
    text = np.array(["a", "\u20ac"], "U1")
    wbuf = bytearray(4)
    MPI.WCHAR.Pack_external(EXT32, text, wbuf, 0)
    assert wbuf.hex() == "006120ac"                                 # UCS-2, big-endian
    wout = np.zeros_like(text)
    MPI.WCHAR.Unpack_external(EXT32, wbuf, 0, wout)
    assert wout.tolist() == ["a", "\u20ac"]


def test_long_double_keeps_its_63_fraction_bits():
    values = np.array([np.pi, -1e300, 1e-4940, np.nextafter(np.longdouble(1), 2)], "g")
    buf = bytearray(64)
    MPI.LONG_DOUBLE.Pack_external(EXT32, values, buf, 0)
    out = np.zeros_like(values)
    MPI.LONG_DOUBLE.Unpack_external(EXT32, buf, 0, out)
    assert out.tobytes()[:10] == values.tobytes()[:10] and (out == values).all()
    assert np.isnan(_round_trip(np.array([np.nan], "g")))[0]


def _round_trip(values):
    buf = bytearray(16 * len(values))
    MPI.LONG_DOUBLE.Pack_external(EXT32, values, buf, 0)
    out = np.zeros_like(values)
    MPI.LONG_DOUBLE.Unpack_external(EXT32, buf, 0, out)
    return out


def test_bad_arguments_are_mpi_errors_before_anything_is_written():
    data = np.arange(4, dtype="i")
    for call in (lambda: MPI.INT.Pack_external("native", data, bytearray(16), 0),
                 lambda: MPI.INT.Pack_external_size("internal", 1),
                 lambda: MPI.INT.Unpack_external("xdr", bytearray(16), 0, data)):
        with pytest.raises(MPI.Exception) as err:
            call()
        assert err.value.Get_error_class() == MPI.ERR_ARG
    small = bytearray(15)
    with pytest.raises(MPI.Exception) as err:
        MPI.INT.Pack_external(EXT32, data, small, 0)
    assert err.value.Get_error_class() == MPI.ERR_BUFFER and small == bytearray(15)
    with pytest.raises(MPI.Exception) as err:
        MPI.INT.Unpack_external(EXT32, bytearray(8), 4, data)
    assert err.value.Get_error_class() == MPI.ERR_BUFFER and data.tolist() == [0, 1, 2, 3]
    with pytest.raises(MPI.Exception) as err:
        MPI.INT.Pack_external_size(EXT32, -1)
    assert err.value.Get_error_class() == MPI.ERR_COUNT


def test_long_doubles_inside_a_struct_round_trip():
    st = MPI.Datatype.Create_struct([2, 1], [0, 32], [MPI.LONG_DOUBLE, MPI.INT]).Commit()
    sd = np.dtype({"names": ["a", "b"], "formats": [("g", (2,)), "i4"], "offsets": [0, 32],
                   "itemsize": st.Get_extent()[1]})
    items = np.zeros(3, sd)
    items["a"] = [[1.5, -2.25], [3.0, 4.0], [5.5, 6.5]]
    items["b"] = [7, 8, 9]
    assert st.Pack_external_size(EXT32, 3) == 3 * (16 + 16 + 4)
    buf = bytearray(108)
    st.Pack_external(EXT32, items, buf, 0)
    assert buf[:36].hex() == "3fff8000000000000000000000000000" \
        "c0002000000000000000000000000000" "00000007"
    back = np.zeros_like(items)
    st.Unpack_external(EXT32, buf, 0, back)
    assert back["a"].tolist() == items["a"].tolist() and back["b"].tolist() == [7, 8, 9]
    st.Free()
