"""``MPI.buffer`` (alias ``MPI.memory``), ``Alloc_mem``/``Free_mem`` and the buffer of
buffered sends (``Attach_buffer``/``Detach_buffer``, ``BUFFER_AUTOMATIC``).

:class:`buffer` is mpi4py's raw-memory object: a 1-D run of bytes (format ``"B"``) with
its ``address``, ``nbytes``, ``readonly`` and exporting ``obj``, indexing by byte (an int,
or a step-1 slice giving a buffer over the same memory), ``cast``, ``tobytes`` and the
buffer protocol. Here it is a numpy ``uint8`` array subclass (Python 3.11 classes cannot
export the buffer protocol themselves), so ``memoryview(buf)``, ``np.frombuffer(buf)``
and every pycomm call read and write its memory in place; it compares by identity, as
mpi4py's does.

pycomm copies each buffered send privately (:class:`BufferPool`), so the attached buffer
only sizes nothing and is handed back by ``Detach_buffer``; ``Attach_buffer(None)`` and
``Attach_buffer(BUFFER_AUTOMATIC)`` attach ``BUFFER_AUTOMATIC`` (MPI 4.1).
"""

from __future__ import annotations

import ctypes

import numpy as np

__all__ = ["BSEND", "BUFFER_AUTOMATIC", "Alloc_mem", "BufferPool", "Free_mem", "buffer"]


def _bytes_of(obj, writable: bool) -> np.ndarray:
    """The bytes of ``obj`` (buffer protocol or ``__array_interface__``), no copy.

    Raises:
        BufferError: not contiguous memory, or read-only when ``writable``.
    """
    try:
        mv = memoryview(obj)
    except TypeError:
        if not hasattr(obj, "__array_interface__"):
            raise TypeError(f"MPI.buffer: {type(obj).__name__} has no buffer "
                            "interface") from None
        arr = np.asarray(obj)
        if not (arr.flags.c_contiguous or arr.flags.f_contiguous):
            raise BufferError("MPI.buffer: the object's memory is not contiguous") \
                from None
        mv = memoryview(arr.reshape(-1, order="A"))
    if not mv.contiguous:
        raise BufferError("MPI.buffer: the object's memory is not contiguous")
    if writable and mv.readonly:
        raise BufferError(f"MPI.buffer: {type(obj).__name__} is read-only")
    raw = np.frombuffer(mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv, np.uint8)
    if not mv.readonly and not raw.flags.writeable:
        raw.flags.writeable = True
    return raw


class buffer(np.ndarray):
    """Raw memory (mpi4py's ``MPI.buffer``): ``buffer()`` is empty, ``buffer(obj)`` the
    bytes of ``obj`` (read-only when ``obj`` is)."""

    def __new__(cls, *args):
        if not args:                    # the null buffer: address 0, as mpi4py's
            out = cls._of(np.empty(0, np.uint8), None)
            out._gone = True
            return out
        if args[0] is None:
            raise TypeError("MPI.buffer(None): expected an object with the buffer "
                            "interface")
        return cls._of(_bytes_of(args[0], writable=False), args[0])

    @classmethod
    def _of(cls, raw: np.ndarray, obj, readonly: bool | None = None) -> buffer:
        out = raw.view(cls)
        out._obj = obj
        if readonly:
            out.flags.writeable = False
        return out

    @staticmethod
    def allocate(nbytes: int, clear: bool = False) -> buffer:
        """``nbytes`` of new memory (zeroed: Python's allocator always clears it).

        Raises:
            ValueError: ``nbytes`` is negative.
        """
        if int(nbytes) < 0:
            raise ValueError(f"MPI.buffer.allocate: nbytes={nbytes} is negative")
        mem = bytearray(int(nbytes))
        return buffer._of(np.frombuffer(mem, np.uint8), mem)

    @staticmethod
    def frombuffer(obj, readonly: bool = False) -> buffer:
        """The bytes of ``obj``; writable unless ``readonly``.

        Raises:
            BufferError: ``obj`` is read-only and ``readonly`` is false.
        """
        return buffer._of(_bytes_of(obj, writable=not readonly), obj, readonly)

    @staticmethod
    def fromaddress(address: int, nbytes: int, readonly: bool = False) -> buffer:
        """The ``nbytes`` bytes at ``address`` (the caller keeps them alive, as in C).

        Raises:
            ValueError: a negative size, or a null address for a non-empty buffer.
        """
        address, nbytes = int(address), int(nbytes)
        if nbytes < 0:
            raise ValueError(f"MPI.buffer.fromaddress: nbytes={nbytes} is negative")
        if nbytes and not address:
            raise ValueError("MPI.buffer.fromaddress: a null address")
        raw = np.frombuffer((ctypes.c_ubyte * nbytes).from_address(address), np.uint8) \
            if nbytes else np.empty(0, np.uint8)
        return buffer._of(raw, None, readonly)

    def __array_finalize__(self, parent) -> None:
        self._obj = getattr(parent, "_obj", None)
        self._gone = False

    address = property(lambda self: 0 if self._gone else
                       int(self.__array_interface__["data"][0]),
                       doc="The address of the first byte (0: null or released).")
    obj = property(lambda self: None if self._gone else self._obj,
                   doc="The object whose memory this is.")
    nbytes = property(lambda self: 0 if self._gone else self.size)
    readonly = property(lambda self: not self._gone and not self.flags.writeable)

    def __len__(self) -> int:
        return self.nbytes

    def __delitem__(self, item) -> None:
        raise NotImplementedError("MPI.buffer: subscript deletion not supported")
    format = property(lambda self: "B")

    def cast(self, format: str, shape=...) -> memoryview:
        """A memoryview of the bytes as ``format`` (and ``shape``)."""
        mv = memoryview(self)
        return mv.cast(format) if shape is Ellipsis else mv.cast(format, shape)

    def toreadonly(self) -> buffer:
        """A read-only buffer over the same memory."""
        return buffer._of(self.view(np.ndarray), self._obj, True)

    def release(self) -> None:
        """Release the memory: the buffer reads as empty from now on (address 0, no
        bytes, no object), as mpi4py's; views already taken keep the memory alive."""
        self._gone, self._obj = True, None

    def tobytes(self, order: str | None = None) -> bytes:
        """A copy of the bytes (``order`` is ignored: the memory is one run)."""
        return b"" if self._gone else np.ndarray.tobytes(self)

    def __getitem__(self, item):
        """A byte (int) or, for a step-1 slice, a buffer over those bytes."""
        if isinstance(item, slice):
            if item.step not in (None, 1):
                raise IndexError("MPI.buffer: slice with step not supported")
            return np.ndarray.__getitem__(self, item)
        if isinstance(item, (int, np.integer)):
            return int(np.ndarray.__getitem__(self, item))
        if isinstance(item, tuple) or item is Ellipsis:     # numpy's own machinery
            return np.ndarray.__getitem__(self.view(np.ndarray), item)
        raise TypeError("MPI.buffer: index must be integer or slice")

    def __setitem__(self, item, value) -> None:
        if self.readonly:
            raise TypeError("MPI.buffer: buffer is read-only")
        if isinstance(item, slice):
            if item.step not in (None, 1):
                raise IndexError("MPI.buffer: slice with step not supported")
            target = np.ndarray.__getitem__(self, item)
            if not isinstance(value, (int, np.integer)):
                value = _bytes_of(value, writable=False)
                if value.size != target.size:
                    raise ValueError("MPI.buffer: slice length does not match buffer")
            np.ndarray.__setitem__(self, item, value)
        elif isinstance(item, (int, np.integer)):
            np.ndarray.__setitem__(self, item, value)
        else:
            raise TypeError("MPI.buffer: index must be integer or slice")

    __eq__ = object.__eq__
    __ne__ = object.__ne__
    __hash__ = object.__hash__

    def __bool__(self) -> bool:
        return True

    def __repr__(self) -> str:
        return f"<MPI.buffer address=0x{self.address:x} nbytes={self.nbytes}>"

    __str__ = __repr__


memory = buffer


class _BufferAutomatic:
    """``MPI.BUFFER_AUTOMATIC``: buffered sends allocate what they need (MPI 4.1)."""

    def __repr__(self) -> str:
        return "BUFFER_AUTOMATIC"

    __str__ = __repr__

    def __reduce__(self) -> str:
        return "BUFFER_AUTOMATIC"


BUFFER_AUTOMATIC = _BufferAutomatic()


def Alloc_mem(size: int, info=None) -> buffer:
    """``size`` bytes of zeroed memory (an :class:`buffer`).

    Raises:
        ValueError: ``size`` is negative.
    """
    return buffer.allocate(size, clear=True)


def Free_mem(mem) -> None:
    """Release a buffer from Alloc_mem (it reads as empty from now on; Python frees the
    memory once nothing refers to it)."""
    if isinstance(mem, buffer):
        mem.release()


class BufferPool:
    """The buffer attached for ``Bsend`` (``MPI.Attach_buffer``): pending buffered sends
    hold private copies of their data; ``Detach_buffer`` waits for them."""

    def __init__(self) -> None:
        self.buffer = None
        self.pending: list = []

    def add(self, request) -> None:
        self.pending = [r for r in self.pending if not r.done]
        self.pending.append(request)

    def drain(self) -> None:
        if self.pending:
            self.pending[0].engine.wait_all(self.pending)
        self.pending = []

    def attach(self, buf) -> None:
        """Keep ``buf`` (None: ``BUFFER_AUTOMATIC``) to hand back on detach.

        Raises:
            BufferError: ``buf`` is read-only (MPI writes into an attached buffer).
        """
        if buf is not None and buf is not BUFFER_AUTOMATIC:
            _bytes_of(buf, writable=True)
        self.buffer = BUFFER_AUTOMATIC if buf is None else buf

    def detach(self):
        """Wait for every pending buffered send; return the attached buffer."""
        self.drain()
        buf, self.buffer = self.buffer, None
        return buf


BSEND = BufferPool()
