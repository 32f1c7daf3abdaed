"""File views (MPI-4.1 section 14.3): which bytes of a file a rank sees, in etype units.

A view is ``(disp, etype, filetype, datarep)``. The filetype is tiled from byte ``disp``
of the file, one copy every ``filetype.extent`` bytes; the bytes its type map covers are
the rank's *data*, the rest are holes. Offsets and file pointers count etypes of that
data: offset ``k`` is data byte ``k * etype.size``, wherever in the file it lies.

A :class:`View` flattens the filetype once into *runs*: the byte ranges one tile covers,
in type-map order, adjacent elements merged (``run_off``, ``run_len``, and ``run_cum``,
the data bytes before each run). An access of ``n`` data bytes from data byte ``p`` is
then a list of file segments (:meth:`View.segments`): tiles ``p // size .. (p + n) //
size`` times the runs, clipped at both ends and merged where they touch, with numpy
array operations (no Python loop over elements or tiles). A contiguous filetype (one run
as long as the extent, every predefined type) is one segment. Sans-I/O: nothing here
touches a file.

Refused (MPI's rules for filetypes, 14.3): displacements that are negative or decrease
(the file is read and written in type-map order), a filetype whose size is not a whole
number of etypes, and an etype or filetype that is null, freed, not committed or empty.
"""

from __future__ import annotations

import numpy as np

from pycomm.errors import ArgumentError

from .datatypes import Datatype
from .exceptions import mpi_error

__all__ = ["View"]


def _type_error(message: str):
    return mpi_error(ArgumentError, "ERR_TYPE", message)


def _usable(dt, arg: str, where: str) -> Datatype:
    """``dt`` if it can describe file data (a committed Datatype with data), else raise."""
    if not isinstance(dt, Datatype):
        raise TypeError(f"{where}: {arg} must be an MPI.Datatype, got {type(dt).__name__}")
    if not dt or dt._data is None:
        raise _type_error(f"{where}: {arg} is DATATYPE_NULL or was freed")
    if not dt._committed:
        raise _type_error(f"{where}: {arg} {dt!r} was not committed (call .Commit() first)")
    if dt.Get_size() <= 0:
        raise _type_error(f"{where}: {arg} {dt!r} holds no data (size 0)")
    return dt


class View:
    """One rank's file view: ``disp`` (bytes), ``etype``, ``filetype``, ``datarep``.

    Attributes: ``esize`` (etype size, bytes), ``size`` and ``extent`` (the filetype's
    data bytes and extent: one tile), ``run_off``/``run_len``/``run_cum`` (int64 arrays,
    see the module docstring), ``contiguous`` (the file data has no holes).
    """

    __slots__ = ("contiguous", "datarep", "disp", "esize", "etype", "extent", "filetype",
                 "run_cum", "run_len", "run_off", "size")

    def __init__(self, disp: int, etype: Datatype, filetype: Datatype, datarep: str,
                 where: str = "File.Set_view"):
        """Check and flatten a view.

        Args:
            disp: byte displacement of the first tile (>= 0).
            etype: the elementary datatype (offsets count these).
            filetype: the tiled datatype (a whole number of etypes).
            datarep: the data representation's name (checked by the caller).
            where: the call, for error messages.

        Raises:
            ArgumentError: MPI.Exception ERR_TYPE for a null, freed, uncommitted or
                empty etype or filetype, a filetype of a fractional number of etypes,
                negative or decreasing displacements, or a non-positive filetype extent;
                ERR_ARG for a negative ``disp``.
            TypeError: etype or filetype is not a Datatype.
        """
        etype, filetype = _usable(etype, "etype", where), _usable(filetype, "filetype", where)
        if disp < 0:
            raise mpi_error(ArgumentError, "ERR_ARG", f"{where}: disp={disp} is negative")
        self.disp, self.datarep = int(disp), datarep
        # private handles: the program may free its own after Set_view (MPI 14.3)
        self.etype, self.filetype = Datatype(etype), Datatype(filetype)
        self.esize, self.size, self.extent = etype.Get_size(), filetype.Get_size(), \
            filetype.extent
        if self.size % self.esize:
            raise _type_error(f"{where}: filetype of {self.size} data bytes is not a whole "
                              f"number of etypes of {self.esize} bytes")
        if self.extent <= 0:
            raise _type_error(f"{where}: filetype extent {self.extent} must be positive "
                              "(its copies are tiled one extent apart)")
        tmap = filetype._data
        if tmap.run is not None:                # one dtype, back to back: one run
            off, lens = np.array([tmap.run], np.int64), np.array([self.size], np.int64)
        else:
            disps = filetype._disps
            sizes = np.array([d.itemsize for d in filetype._dtypes],
                             np.int64)[filetype._codes]
            if disps.size and (disps[0] < 0 or (np.diff(disps) < 0).any()):
                raise _type_error(f"{where}: filetype displacements must be non-negative "
                                  "and non-decreasing (MPI-4.1 14.3); this one's are not")
            ends = disps + sizes
            brk = np.ones(disps.size, bool)
            brk[1:] = disps[1:] != ends[:-1]
            first = np.flatnonzero(brk)
            off, lens = disps[first], np.add.reduceat(sizes, first)
        if off.size and off[0] < 0:
            raise _type_error(f"{where}: filetype displacements must be non-negative")
        self.run_off, self.run_len = off, lens
        self.run_cum = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
        self.contiguous = bool(off.size == 1 and off[0] == 0 and lens[0] == self.extent)

    def segments(self, pos: int, nbytes: int) -> tuple[np.ndarray, np.ndarray]:
        """The file segments of ``nbytes`` data bytes from data byte ``pos``.

        Args:
            pos: the first data byte (offset in etypes times ``esize``), >= 0.
            nbytes: data bytes to access, >= 0.

        Returns:
            tuple: ``(offsets, lengths)``, int64 arrays of file byte offsets and lengths,
            in data order (file offsets increasing), adjacent segments merged.

        Raises:
            Nothing.
        """
        if nbytes <= 0:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        if self.contiguous:
            return np.array([self.disp + pos], np.int64), np.array([nbytes], np.int64)
        end = pos + nbytes
        t0, t1 = pos // self.size, -(-end // self.size)
        tiles = np.arange(t0, t1, dtype=np.int64)[:, None]
        dstart = (tiles * self.size + self.run_cum[None, :]).reshape(-1)
        fstart = (self.disp + tiles * self.extent + self.run_off[None, :]).reshape(-1)
        dend = dstart + np.tile(self.run_len, tiles.shape[0])
        keep = (dend > pos) & (dstart < end)
        dstart, dend, fstart = dstart[keep], dend[keep], fstart[keep]
        lo, hi = np.maximum(dstart, pos), np.minimum(dend, end)
        offs, lens = fstart + (lo - dstart), hi - lo
        return _merge(offs, lens)

    def data_before(self, fbytes: int) -> int:
        """Data bytes of the view that lie before file byte ``fbytes`` (the end of file).

        Args:
            fbytes: a file size in bytes.

        Returns:
            int: how many of the view's data bytes are at file offsets below ``fbytes``.

        Raises:
            Nothing.
        """
        rel = fbytes - self.disp
        lo, hi = int(self.run_off[0]), int((self.run_off + self.run_len).max())
        if rel <= lo:
            return 0
        # a tile's data lies at [lo, hi) from its start (not [0, extent): lb may be > 0)
        full = max(0, (rel - hi) // self.extent + 1)
        out, t = full * self.size, full
        while t * self.extent + lo < rel:           # the tiles the end of file cuts
            out += int(np.clip(rel - t * self.extent - self.run_off, 0, self.run_len).sum())
            t += 1
        return int(out)

    def byte_offset(self, offset: int) -> int:
        """The file byte of view offset ``offset`` (etypes): ``MPI_File_get_byte_offset``.

        Args:
            offset: a view offset in etypes, >= 0.

        Returns:
            int: the absolute byte position in the file.

        Raises:
            Nothing.
        """
        tile, rem = divmod(offset * self.esize, self.size)
        k = int(np.searchsorted(self.run_cum, rem, side="right")) - 1
        return int(self.disp + tile * self.extent + self.run_off[k] + rem - self.run_cum[k])


def _merge(offs: np.ndarray, lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge segments that touch (one ends where the next starts)."""
    if offs.size <= 1:
        return offs, lens
    brk = np.ones(offs.size, bool)
    brk[1:] = offs[1:] != offs[:-1] + lens[:-1]
    first = np.flatnonzero(brk)
    return offs[first], np.add.reduceat(lens, first)
