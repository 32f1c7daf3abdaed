"""``MPI.Request``; persistent requests (``MPI.Prequest``) are in :mod:`pycomm.MPI.prequest`,
``MPI.Status`` in :mod:`pycomm.MPI.status`, generalized requests in
:mod:`pycomm.MPI.grequest`.

A façade :class:`Request` wraps one :class:`pycomm.Request` and what must run when it
completes (unpacking a receive of a non-contiguous datatype). As in MPI, a completed
request becomes null: after ``Wait`` it compares equal to ``REQUEST_NULL``; ``Request()``
is a null request, and waiting on a null request returns at once with an empty status
(source ``ANY_SOURCE``, tag ``ANY_TAG``, count 0). Completion is driven by the pycomm
engine on ``Wait``/``Test`` (nonblocking collectives run on its progress thread, see
:mod:`pycomm.nbc`).
"""

from __future__ import annotations

import copy

from pycomm.errors import ArgumentError, CommError, TruncationError
from pycomm.p2p import ANY_SOURCE, ANY_TAG
from pycomm.request import Request as _Inner

from .exceptions import ERRORS, translate, translate_methods
from .status import UNDEFINED, Status

__all__ = ["REQUEST_NULL", "UNDEFINED", "Request", "Status", "completed"]


def _null(call: str):
    from pycomm.errors import ArgumentError

    from .exceptions import mpi_error
    return mpi_error(ArgumentError, "ERR_REQUEST", f"Request.{call}: REQUEST_NULL")


def _clear(status) -> None:
    """An empty status (MPI-4.0 3.7.3): what waiting on a null request reports."""
    if status is not None:
        status.source, status.tag, status.count = ANY_SOURCE, ANY_TAG, 0
        status.error, status.cancelled = 0, False


def _nth(statuses, i: int):
    """``statuses[i]``, or None past the end of ``statuses`` (a tuple shorter than the
    requests: mpi4py fills what there is) or when there are none."""
    return statuses[i] if statuses is not None and i < len(statuses) else None


def _extend(statuses, n: int) -> None:
    """Grow a list of statuses to ``n`` with new Status objects (mpi4py's Waitall,
    Waitsome...)."""
    if isinstance(statuses, list):
        statuses.extend(Status() for _ in range(n - len(statuses)))


def handle_of_kind(cls: type, request, what: str):
    """What ``cls(request)`` makes another handle of (:class:`pycomm.MPI.prequest.
    Prequest`, :class:`pycomm.MPI.grequest.Grequest`): ``request``; None for a null
    request of any class (``Prequest(REQUEST_NULL)`` is null, as under mpi4py + MPICH).

    Raises:
        TypeError: ``request`` is a live request of another class, or no request.
    """
    if isinstance(request, Request) and not isinstance(request, cls) and not request:
        return None
    if request is not None and not isinstance(request, cls):
        raise TypeError(f"{cls.__name__}({request!r}): expected a {what}")
    return request


def _in_status(reqs, statuses, exc: CommError) -> CommError:
    """What MPI_Waitall reports when a request fails: ``ERR_IN_STATUS`` (as mpi4py +
    MPICH raise it). Each request that completed has its status filled, with its error
    class in ``error`` (0: none), and becomes null (a truncated receive into a packed
    datatype unpacks what fit, as in :meth:`Request.Wait`); a request still pending stays,
    ``ERR_PENDING`` in its status's ``error``."""
    for i, r in enumerate(reqs):
        st, x = _nth(statuses, i), r._r
        if x is None:
            _clear(st)
        elif x.done:
            x._status(st)
            if st is not None:
                st.error = 0 if x.error is None else translate(x.error).error_code
            fin, r._r, r._finish = r._finish, None, None
            if fin is not None and (x.error is None or isinstance(x.error, TruncationError)):
                fin()
        elif st is not None:
            st.error = ERRORS["ERR_PENDING"]
    out = copy.copy(exc)            # (``exc`` stays what its request holds)
    out.mpi_error = "ERR_IN_STATUS"
    return out


@translate_methods
class Request:
    """A pending operation (mpi4py's ``MPI.Request``); ``Request()`` is a null request."""

    __slots__ = ("__weakref__", "_finish", "_p", "_r")
    _PERSISTENT = False             # a Prequest (pycomm.MPI.prequest) says True

    def __init__(self, request: Request | None = None):
        if isinstance(request, Request):
            self._r, self._finish = request._r, request._finish
            self._p = request._ident() if request._PERSISTENT else None
        elif request is None:
            self._r, self._finish, self._p = None, None, None
        else:
            raise TypeError(f"Request({request!r}): expected an MPI.Request or nothing")

    def _ident(self):
        """What this handle names: its pending operation, or the persistent request it
        was made from (``Request(prequest) == prequest``); None when null."""
        p = getattr(self, "_p", None)     # unset in the requests _wrap makes
        return self._r if p is None else p

    @classmethod
    def _wrap(cls, inner: _Inner, finish=None) -> Request:
        out = object.__new__(cls)       # the hot path: no copy made first
        out._r, out._finish = inner, finish
        return out

    def _completed(self) -> None:
        """Run the completion action once and become null (the inner request is kept for
        the object forms until then)."""
        fin, self._finish = self._finish, None
        self._r = None
        if fin is not None:
            fin()

    def _run(self, call, status):
        """``call(status)`` on the pending operation. One that ended with an error (a
        truncated receive) is over all the same: the status gets the source, tag and
        count it reports and the request becomes null before the error leaves, as
        MPI_Wait and MPI_Test do (mpi4py + MPICH 5.0.2: a truncated receive fills source
        and tag, and the request is REQUEST_NULL after ERR_TRUNCATE). A truncated receive
        into a packed datatype still runs its completion: what fit is unpacked into the
        buffer, as MPICH leaves it."""
        r = self._r
        try:
            return call(status)
        except CommError as exc:
            if r.done and r.error is not None:
                r._status(status)
                fin, self._r, self._finish = self._finish, None, None
                if fin is not None and isinstance(exc, TruncationError):
                    fin()
            raise

    def __bool__(self) -> bool:
        return self._r is not None

    def __eq__(self, other) -> bool:
        if not isinstance(other, Request):
            return NotImplemented
        return self._ident() is other._ident()

    def __hash__(self) -> int:
        return id(self._ident())

    def __repr__(self) -> str:
        return "<MPI.Request null>" if self._r is None else f"<MPI.Request {self._r!r}>"

    # -- one request ----------------------------------------------------------------------
    def Wait(self, status=None) -> bool:
        """Block until the operation completes; fill ``status``. Returns True."""
        r = self._r
        if r is None:
            _clear(status)
            return True
        self._run(r.Wait, status)
        self._completed()
        return True

    def Test(self, status=None) -> bool:
        """Make progress once; True (``status`` filled) when complete or null."""
        r = self._r
        if r is None:
            _clear(status)
            return True
        if not self._run(r.Test, status):
            return False
        self._completed()
        return True

    def Get_status(self, status=None) -> bool:
        """Whether the operation is complete, without completing the request."""
        r = self._r
        if r is None:
            _clear(status)
            return True
        if not r.done:
            r.engine.progress()
        if r.done:
            r._status(status)
        return r.done

    def Cancel(self) -> None:
        """Cancel a receive that has not matched, or a large send not yet handed over.

        Raises:
            MPI.Exception (ERR_REQUEST): a null request.
        """
        if self._r is None:
            raise _null("Cancel")
        self._r.Cancel()

    def Free(self) -> None:
        """Forget the request (the operation still completes); it becomes null.

        Raises:
            MPI.Exception (ERR_REQUEST): a null request.
        """
        if self._r is None:
            raise _null("Free")
        self._r, self._finish = None, None

    def wait(self, status=None):
        """Object form: wait and return the received object (None for sends)."""
        r = self._r
        if r is None:
            _clear(status)
            return None
        obj = self._run(r.wait, status)
        self._completed()
        return obj

    def test(self, status=None):
        """Object form: ``(done, object or None)``."""
        r = self._r
        if r is None:
            _clear(status)
            return True, None
        done, obj = self._run(r.test, status)
        if done:
            self._completed()
        return done, obj

    # -- many requests --------------------------------------------------------------------
    @classmethod
    def Waitall(cls, requests, statuses=None) -> bool:
        """Wait for every request; fill ``statuses`` (one per request; a list shorter than
        ``requests`` is extended with new Status objects, as in mpi4py)."""
        reqs = requests if type(requests) is list else list(requests)
        _extend(statuses, len(reqs))
        active = [x for r in reqs if (x := r._r) is not None]
        if active:
            try:
                _Inner.Waitall(active)
            except CommError as exc:
                if not any(x.done and x.error is not None for x in active):
                    raise               # no request failed: the wait did (a timeout)
                raise _in_status(reqs, statuses, exc) from None
        if statuses is None:
            for r in reqs:
                if r._r is not None:
                    r._completed()
            return True
        for i, r in enumerate(reqs):
            st = _nth(statuses, i)
            if r._r is None:
                _clear(st)
            else:
                r._r._status(st)
                r._completed()
        return True

    @classmethod
    def waitall(cls, requests, statuses=None) -> list:
        """Object form of Waitall: the received objects (None for sends)."""
        reqs = list(requests)
        _extend(statuses, len(reqs))
        return [r.wait(_nth(statuses, i)) for i, r in enumerate(reqs)]

    @classmethod
    def Testall(cls, requests, statuses=None) -> bool:
        """True (and every request completed) when all are complete."""
        reqs = list(requests)
        active = [r._r for r in reqs if r._r is not None]
        if active and not _Inner.Testall(active):
            return False
        cls.Waitall(reqs, statuses)
        return True

    @classmethod
    def testall(cls, requests, statuses=None):
        """Object form: ``(True, objects)`` when all are complete, else ``(False, None)``."""
        reqs = list(requests)
        active = [r._r for r in reqs if r._r is not None]
        if active and not _Inner.Testall(active):
            return False, None
        return True, cls.waitall(reqs, statuses)

    @classmethod
    def _ready(cls, reqs) -> list[int]:
        active = [r._r for r in reqs if r._r is not None]
        if active:
            active[0].engine.progress()
        return [i for i, r in enumerate(reqs) if r._r is not None and r._r.done]

    @classmethod
    def Waitany(cls, requests, status=None) -> int:
        """Wait until one request completes; its index (``UNDEFINED`` if all are null)."""
        reqs = list(requests)
        active = [r._r for r in reqs if r._r is not None]
        if not active:
            _clear(status)
            return UNDEFINED
        i = _Inner.Waitany(active)
        index = next(k for k, r in enumerate(reqs) if r._r is active[i])
        reqs[index].Wait(status)
        return index

    @classmethod
    def waitany(cls, requests, status=None) -> tuple[int, object]:
        """Object form of Waitany: ``(index, object)`` (``(UNDEFINED, None)`` if all null)."""
        reqs = list(requests)
        active = [r._r for r in reqs if r._r is not None]
        if not active:
            _clear(status)
            return UNDEFINED, None
        i = _Inner.Waitany(active)
        index = next(k for k, r in enumerate(reqs) if r._r is active[i])
        return index, reqs[index].wait(status)

    @classmethod
    def Testany(cls, requests, status=None) -> tuple[int, bool]:
        """``(index, True)`` for a completed request, ``(UNDEFINED, False)`` if none is,
        ``(UNDEFINED, True)`` when all are null."""
        reqs = list(requests)
        if all(r._r is None for r in reqs):
            _clear(status)
            return UNDEFINED, True
        ready = cls._ready(reqs)
        if not ready:
            return UNDEFINED, False
        reqs[ready[0]].Wait(status)
        return ready[0], True

    @classmethod
    def Waitsome(cls, requests, statuses=None) -> list[int] | None:
        """Wait until at least one completes; the indices completed (None if all null)."""
        reqs = list(requests)
        active = [r._r for r in reqs if r._r is not None]
        if not active:
            return None
        active[0].engine.wait_until(lambda: any(r.done for r in active), None, "Waitsome")
        return cls.Testsome(reqs, statuses)

    @classmethod
    def Testsome(cls, requests, statuses=None) -> list[int] | None:
        """The indices of the requests completed now (None if all are null)."""
        reqs = list(requests)
        if all(r._r is None for r in reqs):
            return None
        ready = cls._ready(reqs)
        _extend(statuses, len(ready))
        for k, i in enumerate(ready):
            reqs[i].Wait(_nth(statuses, k))
        return ready

    @classmethod
    def testany(cls, requests, status=None) -> tuple[int, bool, object]:
        """Object form of Testany: ``(index, flag, object)``."""
        reqs = list(requests)
        if all(r._r is None for r in reqs):
            _clear(status)
            return UNDEFINED, True, None
        ready = cls._ready(reqs)
        if not ready:
            return UNDEFINED, False, None
        return ready[0], True, reqs[ready[0]].wait(status)

    @classmethod
    def waitsome(cls, requests, statuses=None) -> tuple[list[int] | None, list | None]:
        """Object form of Waitsome: ``(indices, objects)`` (``(None, None)`` if all null)."""
        reqs = list(requests)
        active = [r._r for r in reqs if r._r is not None]
        if not active:
            return None, None
        active[0].engine.wait_until(lambda: any(r.done for r in active), None, "waitsome")
        return cls.testsome(reqs, statuses)

    @classmethod
    def testsome(cls, requests, statuses=None) -> tuple[list[int] | None, list | None]:
        """Object form of Testsome: ``(indices, objects)`` completed now."""
        reqs = list(requests)
        if all(r._r is None for r in reqs):
            return None, None
        ready = cls._ready(reqs)
        _extend(statuses, len(ready))
        objs = [reqs[i].wait(_nth(statuses, k)) for k, i in enumerate(ready)]
        return ready, objs

    @classmethod
    def Get_status_all(cls, requests, statuses=None) -> bool:
        """Whether every request is complete, without completing them.

        Args:
            requests: a sequence of requests.
            statuses: None, or statuses to fill: a list shorter than ``requests`` is
                extended with new Status objects, as in mpi4py. When all are complete
                each gets its request's status, else each is left empty (source
                ``ANY_SOURCE``, tag ``ANY_TAG``), as mpi4py over MPICH gives.

        Returns:
            bool: True when every request is complete (or null).
        """
        reqs = list(requests)
        _extend(statuses, len(reqs))
        sts = [_nth(statuses, i) for i in range(len(reqs))]
        flag = all([r.Get_status(st) for r, st in zip(reqs, sts)])
        if not flag:
            for st in sts:
                _clear(st)
        return flag

    @classmethod
    def Get_status_any(cls, requests, status=None) -> tuple[int, bool]:
        """``(index, True)`` of a complete request (not completed), else
        ``(UNDEFINED, False)``; ``(UNDEFINED, True)`` when all are null."""
        reqs = list(requests)
        if all(r._r is None for r in reqs):
            _clear(status)
            return UNDEFINED, True
        ready = cls._ready(reqs)
        if not ready:
            return UNDEFINED, False
        reqs[ready[0]]._r._status(status)
        return ready[0], True

    @classmethod
    def Get_status_some(cls, requests, statuses=None) -> list[int] | None:
        """The indices of the complete requests (not completed); None if all are null."""
        reqs = list(requests)
        if all(r._r is None for r in reqs):
            return None
        ready = cls._ready(reqs)
        _extend(statuses, len(ready))
        for k, i in enumerate(ready):
            if statuses is not None and k < len(statuses):
                reqs[i]._r._status(statuses[k])
        return ready

    @classmethod
    def get_status_all(cls, requests, statuses=None) -> bool:
        return cls.Get_status_all(requests, statuses)

    @classmethod
    def get_status_any(cls, requests, status=None) -> tuple[int, bool]:
        return cls.Get_status_any(requests, status)

    @classmethod
    def get_status_some(cls, requests, statuses=None) -> list[int] | None:
        return cls.Get_status_some(requests, statuses)

    def cancel(self) -> None:
        """Object form of :meth:`Cancel`."""
        self.Cancel()

    def get_status(self, status=None) -> bool:
        """Object form of :meth:`Get_status`."""
        return self.Get_status(status)

    def Start(self) -> None:
        """Only persistent requests (``Send_init``...) can be started."""
        raise ArgumentError("Request.Start: only a persistent request (Prequest) can be "
                            "started")

    @classmethod
    def Startall(cls, requests) -> None:
        """Start every persistent request of ``requests``."""
        for r in requests:
            r.Start()


REQUEST_NULL = Request()


def completed(engine, source: int = ANY_SOURCE, tag: int = ANY_TAG, count: int = 0,
              error: BaseException | None = None, data: bytes | None = None,
              post=None) -> Request:
    """A live request whose operation is already complete (a buffered send, whose data
    was copied; the receive of a message already here): not null until a Wait or Test,
    which fills the status with ``source``, ``tag`` and ``count`` (bytes) and raises
    ``error`` if given, as MPI's requests do.

    Args:
        engine: the pycomm engine that Waitall/Waitany drive along with it.
        source, tag, count: what the status reports (ranks of the communicator).
        error: an exception the completion raises (``ERR_TRUNCATE``...), or None.
        data, post: the object form: ``wait()`` returns ``post(data)``.

    Returns:
        Request: not null; its Test is True at once.
    """
    inner = _Inner(engine, None, -1, source, tag)
    inner.source, inner.count, inner.error = source, count, error
    inner.obj, inner.post = data, post
    inner._complete()
    return Request._wrap(inner)
