"""Generalized requests: ``MPI.Grequest.Start`` and ``Grequest.Complete`` (MPI-4.0 13.2).

A generalized request is one the program completes itself, typically from another thread
that does the work: ``Grequest.Start(query_fn, free_fn, cancel_fn, args, kwargs)`` makes
an active request; ``Wait``/``Test``/``Waitall``... treat it as any other and return once
``Complete()`` was called. At completion ``query_fn(status, *args, **kwargs)`` fills the
status (it starts empty: ``ANY_SOURCE``, ``ANY_TAG``, count 0); ``free_fn(*args,
**kwargs)`` runs when the request is freed (after the wait that completes it, or at
``Complete`` if ``Free`` came first); ``Cancel`` calls ``cancel_fn(completed, *args,
**kwargs)``. An exception from a callback is printed and leaves the call as an
``MPI.Exception`` (its own error class if it is one, ``ERR_OTHER`` otherwise), as in
mpi4py. Waiting on a request nothing completes ends with pycomm's timeout error.
"""

from __future__ import annotations

import sys
import traceback

from pycomm.p2p import ANY_TAG
from pycomm.request import Request as _Inner

from .exceptions import ERRORS
from .exceptions import Exception as MPIException
from .exceptions import translate_methods
from .request import Request, handle_of_kind
from .status import Status

__all__ = ["Grequest"]


def _call(fn, *args, **kwargs) -> None:
    """Run a user callback; an exception becomes an MPI.Exception, printed first."""
    try:
        fn(*args, **kwargs)
    except MPIException:
        traceback.print_exc(file=sys.stderr)
        raise
    except BaseException as exc:
        traceback.print_exc(file=sys.stderr)
        raise MPIException(ERRORS["ERR_OTHER"], f"Grequest callback {fn!r} raised "
                           f"{type(exc).__name__}: {exc}") from exc


class _Pending(_Inner):
    """The engine-side request of a Grequest: done when the program says so."""

    __slots__ = ("args", "cancel_fn", "free_fn", "freed", "kwargs", "query_fn")

    def _status(self, status) -> None:
        st = Status()
        if self.query_fn is not None:
            _call(self.query_fn, st, *self.args, **self.kwargs)
            if self.cancel_fn is None:
                st.cancelled = False
        if status is not None:
            status.source, status.tag, status.count = st.source, st.tag, st.count
            status.error, status.cancelled = st.error, st.cancelled

    def Cancel(self) -> None:
        if self.cancel_fn is not None:
            _call(self.cancel_fn, self.done, *self.args, **self.kwargs)

    def free(self) -> None:
        """Run free_fn once."""
        if not self.freed:
            self.freed = True
            if self.free_fn is not None:
                _call(self.free_fn, *self.args, **self.kwargs)


@translate_methods
class Grequest(Request):
    """A request the program completes (mpi4py's ``MPI.Grequest``); ``Grequest()`` is
    null, ``Grequest(greq)`` a second handle to ``greq`` (any other request is a
    TypeError)."""

    __slots__ = ("_g",)

    def __init__(self, request: Request | None = None):
        request = handle_of_kind(Grequest, request, "generalized request")
        super().__init__(request)
        self._g = getattr(request, "_g", None)

    @classmethod
    def Start(cls, query_fn=None, free_fn=None, cancel_fn=None, args=None,
              kwargs=None) -> Grequest:
        """An active generalized request (see the module docstring).

        Args:
            query_fn: ``query_fn(status, *args, **kwargs)``, fills the status at
                completion; None leaves it empty.
            free_fn: ``free_fn(*args, **kwargs)``, run when the request is freed.
            cancel_fn: ``cancel_fn(completed, *args, **kwargs)``, run by ``Cancel``.
            args, kwargs: extra arguments of the three callbacks.
        """
        import pycomm
        world = pycomm.init()
        inner = _Pending(world._engine, None, -1, -1, ANY_TAG)
        inner.query_fn, inner.free_fn, inner.cancel_fn = query_fn, free_fn, cancel_fn
        inner.args = tuple(args) if args is not None else ()
        inner.kwargs = dict(kwargs) if kwargs is not None else {}
        inner.freed = False
        out = cls._wrap(inner, inner.free)
        out._g = inner
        return out

    def Complete(self) -> None:
        """Mark the request complete: a thread waiting on it returns (with the status
        query_fn gives).

        Raises:
            MPI.Exception (ERR_REQUEST): a null request or one already completed.
        """
        g = self._g
        if g is None or g.done:
            raise MPIException(ERRORS["ERR_REQUEST"], "Grequest.Complete: the request is "
                               "null or already complete")
        g._complete()
        if g.freed is None:                 # Free came first: free at completion
            g.freed = False
            g.free()
        g.engine.notify()

    def complete(self, obj=None) -> None:
        """Object form of :meth:`Complete`: ``wait()`` then returns ``obj``."""
        if self._g is not None:
            self._g.obj, self._g.post = obj, (lambda x: x)
        self.Complete()

    def Free(self) -> None:
        """Forget the request; free_fn runs now if it is complete, else at Complete.

        Raises:
            MPI.Exception (ERR_REQUEST): a null request.
        """
        g = self._r
        super().Free()
        if isinstance(g, _Pending):
            if g.done:
                g.free()
            elif not g.freed:
                g.freed = None              # free at completion
