"""Point-to-point calls on buffers: ``Isend``, ``Send``, ``Issend``, ``Ssend``, ``Irecv``,
``Irecv_alloc``, ``Recv``, ``Sendrecv``, ``Iprobe``, ``Probe`` (mpi4py names, MPI's
semantics: the MPI standard's point-to-point chapter).

Each call validates its arguments before any byte moves, translates ranks to world ranks
and hands the message to the process's p2p engine (:mod:`pycomm.p2p`: matching, the eager
protocol) on the communicator's point-to-point context (``3*cid``, see
:mod:`pycomm.comm`); messages above ``PYCOMM_EAGER_LIMIT`` bytes go by rendezvous
(:mod:`pycomm.rendezvous`). ``Send`` and ``Recv`` of a small message take the engine's
request-free path when nothing else is pending (what :meth:`pycomm.p2p.Engine.send_now`
and :meth:`~pycomm.p2p.Engine.recv_now` do, inlined with the general path's checks: they
write or take the frame through the peer's transport, ``Engine.direct``, themselves),
with each tag's eager header made once per communicator. A blocking call that times out
withdraws what it posted (``_wait_posted``): a receive left posted would swallow a later
message, and a large send's buffer, handed back to the caller, must not be read
afterwards.
"""

from __future__ import annotations

import numpy as np

from transports import TransportError

from . import trace as _trace
from .buffers import _CASTABLE, as_array, byte_view
from .errors import ArgumentError, CommError, CommTimeoutError, TruncationError
from .p2p import ANY_SOURCE, ANY_TAG, PROC_NULL, Request, null_request
from .request import sent_request
from .status import Status, fill as _fill
from .wire import EAGER, _pack

__all__ = ["PointToPointMethods", "TAG_UB"]

TAG_UB = 2**31 - 1

_NO_HEADERS: dict = {}      # a communicator's eager headers until its first (never written)


class PointToPointMethods:
    """Mixin of the communicator: sends, receives and probes of buffers (see the module
    docstring; the attributes and checks it uses are :mod:`pycomm.comm`'s)."""

    # tag -> the eager header (pycomm.wire) of this communicator's point-to-point messages
    # with that tag, made on first use (_eager_header): Send and Recv look it up by tag
    _eager_headers: dict[int, bytes] = _NO_HEADERS

    def _eager_header(self, tag: int) -> bytes:
        headers = self._eager_headers
        if headers is _NO_HEADERS or len(headers) >= 4096:  # bounded: tags may be many
            headers = self._eager_headers = {}
        hdr = headers[tag] = _pack((EAGER, self._pctx, tag))
        return hdr

    def _status_of(self, req: Request, status: Status | None) -> None:
        if status is not None:
            status.source = self._from_world.get(req.source, req.source)
            status.tag, status.count, status.cancelled = req.tag, req.count, req.cancelled

    def Isend(self, buf, dest: int, tag: int = 0, *, synchronous: bool = False) -> Request:
        """Start a standard-mode send of ``buf`` to ``dest`` (MPI_Isend).

        Small messages (<= ``PYCOMM_EAGER_LIMIT`` bytes) are copied out eagerly; larger ones use
        rendezvous, so the buffer must stay untouched until the request completes.
        ``synchronous=True`` (:meth:`Issend`) takes the rendezvous at every size: the request
        completes only once the matching receive has started.

        Args:
            buf: a C-contiguous numpy array of a numeric or bool dtype (any shape), any
                buffer-protocol object, or ``[buf, datatype]`` / ``[buf, count, datatype]``;
                its bytes are sent (``buf.nbytes`` of them).
            dest: destination rank in this communicator, or PROC_NULL (nothing is sent).
            tag: message tag, 0..TAG_UB (default 0).
            synchronous: keyword-only; complete only once the matching receive has started.

        Returns:
            Request: complete once ``buf`` may be reused; its ``Wait`` raises PeerError if
            ``dest`` dies first.

        Raises:
            ArgumentError: invalid ``dest`` or ``tag``.
            InvalidBufferError: ``buf`` is not a contiguous numeric buffer, or its count or
                datatype does not fit it.
            PeerError: the connection to ``dest`` has already failed.
            CommError: the communicator has been freed.
        """
        if not synchronous and self._sent_now(buf, dest, tag, None):
            # a small message the transport took at once: the request is complete already,
            # as MPICH's eager send to a shared-memory peer is
            return sent_request(self._engine, self._pctx, self._world[dest], tag,
                                buf.nbytes)
        return self._isend(buf, dest, tag, synchronous)

    def _isend(self, buf, dest, tag, synchronous: bool = False) -> Request:
        """:meth:`Isend` past its request-free path: check, then post."""
        if self._freed:
            raise CommError(f"rank {self.rank}: {self.name} has been freed")
        arr = as_array(buf, self.rank, "buf")
        dest = self._check_rank(dest, "dest")
        tag = self._check_tag(tag, "tag")
        if dest == PROC_NULL:
            return null_request(self._engine)
        return self._engine.isend(byte_view(arr), self._world[dest], self._pctx, tag,
                                  None, synchronous)

    def Send(self, buf, dest: int, tag: int = 0, *, timeout: float | None = None) -> None:
        """Send ``buf`` to ``dest``; return once ``buf`` may be reused (MPI_Send).

        A small message returns as soon as the transport has copied it, a large (rendezvous) one
        once the receiver has taken it. See :meth:`Isend`.

        Args:
            buf: the data, as for :meth:`Isend`.
            dest: destination rank, or PROC_NULL.
            tag: message tag, 0..TAG_UB (default 0).
            timeout: keyword-only; seconds to wait (None: ``PYCOMM_TIMEOUT``).

        Returns:
            None.

        Raises:
            ArgumentError, InvalidBufferError: as :meth:`Isend`, before anything is sent.
            CommTimeoutError: not handed over within ``timeout`` seconds; a large (rendezvous)
                message is then withdrawn, so a receive posted later never reads ``buf`` (see
                :mod:`pycomm.rendezvous`).
            PeerError: ``dest`` died or its connection dropped.
            CommError: the communicator has been freed.
        """
        if not self._sent_now(buf, dest, tag):
            self._wait_posted([self._isend(buf, dest, tag)], timeout)

    def _sent_now(self, buf, dest, tag, op: str | None = "Send") -> bool:
        """Send ``buf`` without a request (:meth:`Send`, :meth:`Sendrecv`, :meth:`Isend`);
        True when sent, False (nothing done) where :meth:`Isend`'s general path must run.
        ``op``: the name the flight recorder gives the call, None for none (an Isend is
        recorded by the wait on its request)."""
        eng = self._engine
        # The common case, a small numpy array that the transport takes at once, needs no
        # request: the checks the general path makes (with their messages) are inlined,
        # read off the buffer's memoryview (one export, C attributes) rather than the
        # array's flags and dtype objects, which numpy builds afresh on each access; and
        # so is Engine.send_now, the transport (eng.direct) written to from here.
        if type(buf) is np.ndarray and type(dest) is int and type(tag) is int and \
                0 <= dest < self.size and 0 <= tag <= TAG_UB and not eng._threaded and \
                not self._freed:
            try:
                mv = buf.data
            except ValueError:      # a dtype no buffer carries (datetime): Isend says so
                mv = None
            nbytes = mv.nbytes if mv is not None else 0
            if 0 < nbytes <= eng.eager_limit and mv.c_contiguous:
                w = self._world[dest]
                t = eng.direct[w]
                fmt = mv.format
                if t is not None and (fmt == "B" or fmt in _CASTABLE) and \
                        not (eng.aborted and (self._pctx, tag) in eng.aborted):
                    hdr = self._eager_headers.get(tag)
                    if hdr is None:
                        hdr = self._eager_header(tag)
                    try:
                        # a 1-D uint8 array's memoryview is already the flat byte view
                        sent = t.send_now(w, hdr, mv if fmt == "B" and mv.ndim == 1
                                          else mv.cast("B"), True)
                    except TransportError as exc:
                        raise eng._peer_error(exc) from None
                    if sent:
                        eng.sent_bytes += nbytes
                        eng.sent_messages += 1
                        if op is not None:
                            _trace.instant(op, self, tag, nbytes, w)
                        return True
        return False

    def Issend(self, buf, dest: int, tag: int = 0) -> Request:
        """Start a synchronous-mode send, complete once the matching receive has started.

        Args:
            buf: the data, as for :meth:`Isend`.
            dest: destination rank, or PROC_NULL.
            tag: message tag, 0..TAG_UB (default 0).

        Returns:
            Request: complete once ``dest`` has started the matching receive.

        Raises:
            ArgumentError, InvalidBufferError, PeerError, CommError: as :meth:`Isend`.
        """
        return self._isend(buf, dest, tag, True)

    def Ssend(self, buf, dest: int, tag: int = 0, *, timeout: float | None = None) -> None:
        """Send ``buf`` synchronously: return once ``dest`` has started the matching receive.

        Args:
            buf: the data, as for :meth:`Isend`.
            dest: destination rank, or PROC_NULL.
            tag: message tag, 0..TAG_UB (default 0).
            timeout: keyword-only; seconds to wait (None: ``PYCOMM_TIMEOUT``).

        Returns:
            None.

        Raises:
            ArgumentError, InvalidBufferError: as :meth:`Isend`, before anything is sent.
            CommTimeoutError: no matching receive started within ``timeout`` seconds; the
                message is then withdrawn, as in :meth:`Send`.
            PeerError: ``dest`` died or its connection dropped.
            CommError: the communicator has been freed.
        """
        self._wait_posted([self._isend(buf, dest, tag, True)], timeout)

    def Irecv(self, buf, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Request:
        """Post a receive of a message into ``buf`` (MPI_Irecv).

        Args:
            buf: a writable C-contiguous numeric buffer (or ``[buf, datatype]`` / ``[buf,
                count, datatype]``); the message may fill up to ``buf.nbytes`` bytes.
            source: sending rank, ANY_SOURCE (default) or PROC_NULL (completes at once, with
                count 0).
            tag: message tag, or ANY_TAG (default).

        Returns:
            Request: after its ``Wait``, a Status gives source, tag and count (bytes); ``Wait``
            raises TruncationError if the message was larger than ``buf``.

        Raises:
            ArgumentError: invalid ``source`` or ``tag``.
            InvalidBufferError: ``buf`` is not a contiguous numeric buffer, or is read-only.
            PeerError: the connection to ``source`` has already failed.
            CommError: the communicator has been freed.
        """
        view = self._recv_view(buf, source, tag)
        if view is not None:
            req = self._engine.irecv(view, self._world[source] if source >= 0
                                     else ANY_SOURCE, self._pctx, tag)
            req.comm = self
            return req
        if self._freed:
            raise CommError(f"rank {self.rank}: {self.name} has been freed")
        arr = as_array(buf, self.rank, "buf", writable=True)
        source = self._check_rank(source, "source", allow_any=True)
        tag = self._check_tag(tag, "tag", allow_any=True)
        if source == PROC_NULL:
            return null_request(self._engine)
        src = self._world[source] if source >= 0 else ANY_SOURCE
        req = self._engine.irecv(byte_view(arr), src, self._pctx, tag)
        req.comm = self
        return req

    def Irecv_alloc(self, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Request:
        """Post a receive whose buffer is allocated, at the message's size, on match.

        A message of any size is taken: the receive of a matched probe (MPI_Mprobe +
        MPI_Mrecv) in one call. The object API receives with it.

        Args:
            source: sending rank, ANY_SOURCE (default) or PROC_NULL (completes at once,
                with no data).
            tag: message tag, or ANY_TAG (default).

        Returns:
            Request: after its ``Wait``, ``req.obj`` is a ``bytearray`` of the message
            (``None`` from PROC_NULL) and a Status gives source, tag and count (bytes).

        Raises:
            ArgumentError: invalid ``source`` or ``tag``.
            PeerError: the connection to ``source`` has already failed.
            CommError: the communicator has been freed.
        """
        if self._freed:
            raise CommError(f"rank {self.rank}: {self.name} has been freed")
        source = self._check_rank(source, "source", allow_any=True)
        tag = self._check_tag(tag, "tag", allow_any=True)
        if source == PROC_NULL:
            return null_request(self._engine)
        req = self._engine.irecv(None, self._world[source] if source >= 0 else ANY_SOURCE,
                                 self._pctx, tag)
        req.comm = self
        return req

    def Recv(self, buf, source: int = ANY_SOURCE, tag: int = ANY_TAG,
             status: Status | None = None, *, timeout: float | None = None) -> None:
        """Receive a message into ``buf``, blocking until it has arrived (MPI_Recv).

        Args:
            buf: a writable C-contiguous numeric buffer, as for :meth:`Irecv`.
            source: sending rank, ANY_SOURCE (default) or PROC_NULL.
            tag: message tag, or ANY_TAG (default).
            status: a Status to fill (source, tag, count in bytes), or None.
            timeout: keyword-only; seconds to wait (None: ``PYCOMM_TIMEOUT``).

        Returns:
            None.

        Raises:
            ArgumentError, InvalidBufferError: as :meth:`Irecv`, before anything is posted.
            TruncationError: the message is larger than ``buf`` (as in MPI, what fits is
                received: ``buf`` holds the message's head, ``status`` its source, tag and
                the bytes received).
            CommTimeoutError: nothing matched within ``timeout`` seconds (the receive is then
                withdrawn).
            PeerError: ``source`` died or its connection dropped.
            CommError: the communicator has been freed, or the sender withdrew a large message
                this receive had matched (its Send timed out).
        """
        eng = self._engine
        view = self._recv_view(buf, source, tag)
        if view is not None and not eng._threaded:
            if source >= 0 and tag >= 0:
                # A small message from a named rank: take it straight from the transport
                # when it is the next frame from there and nothing this rank holds could
                # match first (Engine.recv_now, inlined; the transport checks that no other
                # peer's frames wait), spinning a while for it; else (another frame first,
                # or none in time) post a receive.
                w = self._world[source]
                t = eng.direct[w]
                if t is not None and not (eng.posted or eng.unexpected or eng._incoming or
                                          eng.outbox):
                    hdr = self._eager_headers.get(tag)
                    if hdr is None:
                        hdr = self._eager_header(tag)
                    try:
                        n = t.recv_now(w, hdr, view, eng.spin_s, True)
                    except TransportError as exc:
                        raise eng._peer_error(exc) from None
                    if n >= 0:
                        _trace.instant("Recv", self, tag, n, w)
                        if status is not None:
                            status.source, status.tag, status.count = source, tag, n
                            status.cancelled = False
                        return
            req = eng.irecv(view, self._world[source] if source >= 0 else ANY_SOURCE,
                            self._pctx, tag)
            req.comm = self
            if req.done and req.error is None:      # taken from the unexpected queue
                _trace.instant("Recv", self, tag, req.count, req.source)
            else:                                   # _wait_posted and record_wait, inlined
                n = _trace.begin("Recv", self, tag, req.nbytes, None, req.peer)
                try:
                    eng.wait(req, timeout)
                except BaseException as exc:
                    _trace.fail(n, exc)
                    if isinstance(exc, CommTimeoutError):
                        eng.cancel(req)     # unmatched: it must not swallow a later message
                    self._status_of_truncated(req, exc, status)
                    raise
                _trace.end(n)
        else:
            req = self.Irecv(buf, source, tag)
            try:
                self._wait_posted([req], timeout)
            except TruncationError as exc:
                self._status_of_truncated(req, exc, status)
                raise
        if status is not None:
            self._status_of(req, status)

    def _recv_view(self, buf, source, tag) -> memoryview | None:
        """The flat byte view of ``buf`` for a receive whose arguments pass
        :meth:`Irecv`'s checks, made without them in the common case (a writable
        contiguous numpy array of a castable dtype, int source and tag in range): the
        checks read the buffer's memoryview (one export, C attributes) rather than the
        array's flags and dtype objects, which numpy builds afresh on each access. None
        where the general path must run (and raise, if the arguments are bad)."""
        try:
            mv = buf.data if type(buf) is np.ndarray else None
        except ValueError:          # a dtype no buffer carries (datetime): Irecv says so
            return None
        if mv is not None and type(source) is int and type(tag) is int and \
                (0 <= source < self.size or source == ANY_SOURCE) and \
                (0 <= tag <= TAG_UB or tag == ANY_TAG) and \
                mv.nbytes and mv.c_contiguous and not mv.readonly and \
                ((fmt := mv.format) == "B" or fmt in _CASTABLE) and not self._freed:
            # a 1-D uint8 array's memoryview is already the flat byte view
            return mv if fmt == "B" and mv.ndim == 1 else mv.cast("B")
        return None

    def _status_of_truncated(self, req: Request, exc: BaseException, status) -> None:
        """A truncated receive still received what fits: ``status`` says from whom and how
        many bytes, as MPI's does (MPICH, Open MPI)."""
        if status is not None and isinstance(exc, TruncationError) and req.error is exc:
            self._status_of(req, status)

    def Sendrecv(self, sendbuf, dest: int, sendtag: int = 0, recvbuf=None,
                 source: int = ANY_SOURCE, recvtag: int = ANY_TAG,
                 status: Status | None = None, *, timeout: float | None = None) -> None:
        """Send ``sendbuf`` to ``dest`` and receive into ``recvbuf``; both progress together.

        A small send that the transport takes at once completes first, without a request,
        and the receive follows as :meth:`Recv` (the flight recorder shows the two).

        Args:
            sendbuf: the data to send, as ``buf`` of :meth:`Isend`.
            dest: destination rank, or PROC_NULL.
            sendtag: tag of the message sent, 0..TAG_UB (default 0).
            recvbuf: a writable numeric buffer for the message received (required).
            source: sending rank, ANY_SOURCE (default) or PROC_NULL.
            recvtag: tag to receive, or ANY_TAG (default).
            status: a Status to fill for the receive, or None.
            timeout: keyword-only; seconds to wait for both (None: ``PYCOMM_TIMEOUT``).

        Returns:
            None.

        Raises:
            ArgumentError: ``recvbuf`` is None, or a rank or tag is invalid (the send side is
                checked before the receive is posted).
            InvalidBufferError: a buffer is unusable (``recvbuf`` read-only).
            TruncationError: the message received is larger than ``recvbuf`` (its head
                is received and ``status`` filled, as :meth:`Recv`).
            CommTimeoutError: not complete within ``timeout`` seconds (both are withdrawn).
            PeerError: a peer died or its connection dropped.
            CommError: the communicator has been freed.
        """
        if recvbuf is None:
            raise ArgumentError(f"rank {self.rank}: Sendrecv needs a recvbuf")
        # The common case, small numpy arrays: where the receive's arguments pass Recv's
        # own checks and the transport takes the message at once (Send's request-free
        # path), the send is done, needing nothing from the peer, and a Recv follows. Two
        # requests and a wait for both cost several times that (benchmarks/README.md,
        # "Sendrecv without requests").
        if self._recv_view(recvbuf, source, recvtag) is not None and \
                self._sent_now(sendbuf, dest, sendtag):
            self.Recv(recvbuf, source, recvtag, status, timeout=timeout)
            return
        # Check the send side before the receive is posted: a receive left posted by a
        # call that raised would swallow a later message.
        sendbuf = as_array(sendbuf, self.rank, "sendbuf")
        self._check_rank(dest, "dest")
        self._check_tag(sendtag, "sendtag")
        r = self.Irecv(recvbuf, source, recvtag)
        s = self.Isend(sendbuf, dest, sendtag)
        try:
            self._wait_posted([s, r], timeout)
        except TruncationError as exc:
            self._status_of_truncated(r, exc, status)
            raise
        self._status_of(r, status)

    def Iprobe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG,
               status: Status | None = None) -> bool:
        """Return whether a message that a receive (``source``, ``tag``) would match has arrived.

        Makes progress once and does not receive the message.

        Args:
            source: sending rank, ANY_SOURCE (default) or PROC_NULL (always True, count 0).
            tag: message tag, or ANY_TAG (default).
            status: a Status filled with the message's source, tag and count (bytes) when
                True, or None.

        Returns:
            bool: True when such a message is waiting.

        Raises:
            ArgumentError: invalid ``source`` or ``tag``.
            PeerError: a link failed while making progress.
            CommError: the communicator has been freed.
        """
        self._check_alive()
        source = self._check_rank(source, "source", allow_any=True)
        tag = self._check_tag(tag, "tag", allow_any=True)
        if source == PROC_NULL:         # MPI: succeeds at once, as a receive from it would
            _fill(status, PROC_NULL, ANY_TAG, 0)
            return True
        src = self._world[source] if source >= 0 else ANY_SOURCE
        u = self._engine.iprobe(src, self._pctx, tag)
        if u is None:
            return False
        _fill(status, self._from_world.get(u.src, u.src), u.tag, u.nbytes)
        return True

    def Probe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG,
              status: Status | None = None, *, timeout: float | None = None) -> bool:
        """Block until a message that a receive (``source``, ``tag``) would match has arrived.

        Args:
            source: sending rank, ANY_SOURCE (default) or PROC_NULL.
            tag: message tag, or ANY_TAG (default).
            status: a Status filled with the message's source, tag and count (bytes), or None.
            timeout: keyword-only; seconds to wait (None: ``PYCOMM_TIMEOUT``).

        Returns:
            True (mpi4py's convention).

        Raises:
            ArgumentError: invalid ``source`` or ``tag``.
            CommTimeoutError: no such message within ``timeout`` seconds.
            PeerError: a peer died or its connection dropped.
            CommError: the communicator has been freed.
        """
        st = Status() if status is None else status
        self._check_alive()
        src = self._check_rank(source, "source", allow_any=True)
        self._engine.wait_until(lambda: self.Iprobe(source, tag, st), timeout,
                                f"Probe(source={source}, tag={tag})",
                                awaits=self._world[src] if src >= 0 else None)
        return True
