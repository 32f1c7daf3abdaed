"""``MPI.Pickle`` and ``MPI.pickle``: mpi4py's serializer object.

As mpi4py's (``MPI.src/msgpickle.pxi``): ``Pickle(dumps=None, loads=None, protocol=None,
threshold=None)``; ``dumps(obj)`` calls ``dumps(obj, PROTOCOL)`` (``dumps(obj)`` when the
protocol is None), ``loads(data)`` calls ``loads(data)``. ``PROTOCOL`` defaults to
pickle's highest for the default serializer and to None for another; ``THRESHOLD`` (the
smallest buffer sent out of band, 256 KiB by default) too; setting either to None gives
the default back. ``dumps_oob(obj)`` pickles with protocol 5 at least and returns
``(bytes, [MPI.buffer, ...])``: every buffer of ``threshold`` bytes or more travels out of
band, the others stay in the stream; ``loads_oob(data, buffers)`` is its inverse.
``mpi4py.util.pkl5`` sends objects this way. ``MPI4PY_PICKLE_PROTOCOL`` and
``MPI4PY_PICKLE_THRESHOLD`` set the defaults when ``mpi4py.MPI`` is imported
(:func:`configure`).

The default serializer is pickle with cloudpickle as fallback (for lambdas and local
classes, as pycomm's object methods do). pycomm's own object methods serialize with
:mod:`pycomm.objects`; changing ``MPI.pickle`` does not change them.
"""

from __future__ import annotations

import operator
import pickle as _pickle

import cloudpickle

from .membuf import buffer

__all__ = ["Pickle", "configure", "pickle"]

_DEFAULTS = {"protocol": _pickle.HIGHEST_PROTOCOL, "threshold": 1024 ** 2 // 4}


def _dumps(obj, protocol: int | None = None, *, buffer_callback=None) -> bytes:
    """pickle's ``dumps``, cloudpickle's when pickle cannot (a lambda, a local class)."""
    try:
        return _pickle.dumps(obj, protocol, buffer_callback=buffer_callback)
    except (_pickle.PicklingError, AttributeError, TypeError):
        return cloudpickle.dumps(obj, protocol, buffer_callback=buffer_callback)


def _loads(data, *, buffers=None):
    return _pickle.loads(data, buffers=buffers)


def _int_or_none(value, what: str) -> int | None:
    if value is None:
        return None
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"Pickle.{what}: expected an int or None, got "
                        f"{type(value).__name__}") from None


class Pickle:
    """Pickle/unpickle Python objects (mpi4py's ``MPI.Pickle``).

    Args:
        dumps: ``dumps(obj, protocol)`` (or ``dumps(obj)`` when the protocol is None)
            returning bytes; None: pickle (cloudpickle as fallback).
        loads: ``loads(data)``, the inverse; None: pickle's.
        protocol: the protocol ``dumps`` gets; None: pickle's highest for the default
            ``dumps``, none for another.
        threshold: the smallest buffer (bytes) ``dumps_oob`` takes out of band; None:
            the default (256 KiB, or ``MPI4PY_PICKLE_THRESHOLD``).

    Raises:
        TypeError: ``protocol`` or ``threshold`` is neither an int nor None.
    """

    __slots__ = ("_PROTOCOL", "_THRESHOLD", "_dumps", "_loads")

    def __init__(self, dumps=None, loads=None, protocol: int | None = None,
                 threshold: int | None = None) -> None:
        self._dumps = _dumps if dumps is None else dumps
        self._loads = _loads if loads is None else loads
        self.PROTOCOL = protocol
        self.THRESHOLD = threshold

    @property
    def PROTOCOL(self) -> int | None:  # noqa: N802  (mpi4py's name)
        """Protocol version (None: ``dumps`` is called without one)."""
        return self._PROTOCOL

    @PROTOCOL.setter
    def PROTOCOL(self, protocol: int | None) -> None:  # noqa: N802
        protocol = _int_or_none(protocol, "PROTOCOL")
        if protocol is None and self._dumps is _dumps:
            protocol = _DEFAULTS["protocol"]
        self._PROTOCOL = protocol

    @property
    def THRESHOLD(self) -> int:  # noqa: N802
        """Out-of-band threshold in bytes (see :meth:`dumps_oob`)."""
        return self._THRESHOLD

    @THRESHOLD.setter
    def THRESHOLD(self, threshold: int | None) -> None:  # noqa: N802
        threshold = _int_or_none(threshold, "THRESHOLD")
        self._THRESHOLD = _DEFAULTS["threshold"] if threshold is None else threshold

    def dumps(self, obj) -> bytes:
        """Serialize ``obj`` to a pickle data stream.

        Returns:
            bytes: what ``dumps`` gave.
        """
        if self._PROTOCOL is None:
            return self._dumps(obj)
        return self._dumps(obj, self._PROTOCOL)

    def loads(self, data):
        """Deserialize an object from a pickle data stream (any buffer)."""
        return self._loads(data)

    def dumps_oob(self, obj) -> tuple[bytes, list[buffer]]:
        """Serialize ``obj`` to a pickle data stream and out-of-band buffers.

        Pickles with ``max(PROTOCOL, 5)`` (pickle's highest when PROTOCOL is None); each
        buffer the object gives (a NumPy array's data, a ``PickleBuffer``) of
        ``THRESHOLD`` bytes or more is left out of the stream.

        Returns:
            tuple: ``(data, buffers)``: the stream and a list of :class:`MPI.buffer`
            over the object's own memory (read-only where the object is), in order.

        Raises:
            pickle.PicklingError, TypeError: ``dumps`` cannot serialize ``obj``.
        """
        protocol = self._PROTOCOL if self._PROTOCOL is not None else _DEFAULTS["protocol"]
        buffers: list[buffer] = []
        threshold = self._THRESHOLD

        def keep_apart(pickle_buffer) -> bool:
            buf = buffer(pickle_buffer)
            if buf.nbytes >= threshold:
                buffers.append(buf)
                return False                # out of band
            return True                     # in the stream
        data = self._dumps(obj, max(protocol, 5), buffer_callback=keep_apart)
        return data, buffers

    def loads_oob(self, data, buffers):
        """Deserialize an object from a pickle data stream and out-of-band buffers.

        Args:
            data: the stream of :meth:`dumps_oob`.
            buffers: an iterable of its buffers (any objects with the buffer protocol), in
                order.

        Raises:
            pickle.UnpicklingError: the stream needs buffers that were not given.
        """
        return self._loads(data, buffers=buffers)


def configure(protocol: int | None = None, threshold: int | None = None) -> None:
    """Set the defaults of ``PROTOCOL`` and ``THRESHOLD`` (None: leave as is) and give
    them to ``MPI.pickle``, as ``MPI4PY_PICKLE_PROTOCOL``/``_THRESHOLD`` do when
    ``mpi4py.MPI`` is imported.

    Raises:
        TypeError: a value is neither an int nor None.
    """
    for key, value in (("protocol", protocol), ("threshold", threshold)):
        value = _int_or_none(value, key.upper())
        if value is not None:
            _DEFAULTS[key] = value
    if protocol is not None:
        pickle.PROTOCOL = _DEFAULTS["protocol"]
    if threshold is not None:
        pickle.THRESHOLD = _DEFAULTS["threshold"]


pickle = Pickle()
