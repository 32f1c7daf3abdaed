"""A PMI-1 client: the process manager's key-value space, as MPI libraries use it.

MPICH's Hydra (``mpiexec``, also Intel MPI's) gives every process it starts a connection to
its proxy on that host: an inherited socket (``PMI_FD``) or an address to dial
(``PMI_PORT``, with ``PMI_ID``). Through it the processes of a job publish key-value pairs
and read each other's after a barrier; MPI libraries exchange their addresses that way. pycomm
needs one pair: rank 0 publishes where its rendezvous store listens, so a multi-host
``mpiexec`` needs no ``MASTER_ADDR`` (see :mod:`pycomm.launch.bootstrap`).

Wire protocol (PMI-1, "simple PMI"; Flux RFC 13 describes it): one ``\\n``-terminated line
per message, ``key=value`` fields separated by spaces, ``cmd`` first; every request gets one
reply, and ``rc=0`` means success::

    -> cmd=init pmi_version=1 pmi_subversion=1   <- cmd=response_to_init rc=0 pmi_version=1 ...
    -> cmd=get_my_kvsname                       <- cmd=my_kvsname rc=0 kvsname=kvs_1_0
    -> cmd=put kvsname=K key=k value=v          <- cmd=put_result rc=0
    -> cmd=barrier_in                           <- cmd=barrier_out
    -> cmd=get kvsname=K key=k                  <- cmd=get_result rc=0 value=v
    -> cmd=finalize                             <- cmd=finalize_ack

Over ``PMI_PORT`` the process first names itself: ``cmd=initack pmiid=ID`` is answered with
``cmd=initack rc=0 rank=R size=N ...`` and three ``cmd=set`` lines (size, rank, debug).
A value may not contain a space (the proxy splits on them): values are sent
``urllib.parse.quote_plus``-encoded, at most :data:`MAX_VALUE` bytes so (Hydra's
``vallen_max``).

:func:`parse` and :func:`encode` are the protocol; :class:`Client` only moves its lines, each
wait bounded by a deadline.
"""

from __future__ import annotations

import os
import socket
import stat
import time
from dataclasses import dataclass
from urllib.parse import quote_plus, unquote_plus

from ..errors import ArgumentError, CommError, CommTimeoutError, ProtocolError

__all__ = ["Client", "Endpoint", "encode", "endpoint_from_env", "fit", "parse"]

MAX_LINE = 4096         # bytes; Hydra's longest reply (a 1024-byte value and its fields) fits
MAX_VALUE = 1024        # bytes of an encoded value: Hydra's vallen_max (cmd=get_maxes)


def fit(text: str, limit: int = MAX_VALUE) -> str:
    """``text`` cut short so that its encoded form takes at most ``limit`` bytes."""
    while len(quote_plus(text, safe="")) > limit:
        text = text[:max(0, min(len(text) - 1, len(text) * limit // len(
            quote_plus(text, safe=""))))]
    return text


def encode(cmd: str, **fields: object) -> bytes:
    """One request line: ``cmd=<cmd> k=v ...\\n``.

    Raises:
        ArgumentError: a field holds a space, ``=`` or a newline (the line would not parse).
    """
    parts = [f"cmd={cmd}"]
    for key, value in fields.items():
        text = str(value)
        if any(c in text for c in " =\n") or any(c in key for c in " =\n"):
            raise ArgumentError(f"PMI {cmd}: field {key}={text!r} holds a space, '=' or a "
                                "newline")
        parts.append(f"{key}={text}")
    return (" ".join(parts) + "\n").encode()


def parse(line: bytes) -> dict[str, str]:
    """A reply line (without its newline) -> its fields, ``cmd`` included.

    Raises:
        ProtocolError: not ASCII ``key=value`` fields, or no ``cmd``.
    """
    try:
        text = line.decode("ascii")
    except UnicodeDecodeError:
        raise ProtocolError(f"PMI: a reply that is not ASCII: {line[:200]!r}") from None
    fields = {}
    for part in text.split():
        key, eq, value = part.partition("=")
        if not eq:
            raise ProtocolError(f"PMI: a field without '=' ({part!r}) in {text[:200]!r}")
        fields[key] = value
    if "cmd" not in fields:
        raise ProtocolError(f"PMI: a reply without cmd: {text[:200]!r}")
    return fields


@dataclass(frozen=True)
class Endpoint:
    """Where this process's PMI connection is: an inherited socket or an address to dial."""

    fd: int | None = None
    address: tuple[str, int] | None = None
    pmi_id: str | None = None       # PMI_ID: names this process on a dialled connection

    def __str__(self) -> str:
        if self.fd is not None:
            return f"PMI_FD={self.fd}"
        return f"PMI_PORT={self.address[0]}:{self.address[1]}"


def endpoint_from_env(env: dict[str, str]) -> Endpoint | None:
    """This process's PMI connection from ``PMI_FD`` or ``PMI_PORT`` + ``PMI_ID``; None if
    neither is set. ``PMI_FD`` must be an open socket of this process (checked, not used).

    Raises:
        ArgumentError: a variable is malformed, or ``PMI_FD`` is not an open socket here
            (the message says why; it names the variable).
    """
    if env.get("PMI_FD") is not None:
        text = env["PMI_FD"]
        try:
            fd = int(text)
            mode = os.fstat(fd).st_mode
        except ValueError:
            raise ArgumentError(f"PMI_FD={text!r} is not a file descriptor number") from None
        except OSError as exc:
            raise ArgumentError(f"PMI_FD={text} is not open in this process "
                                f"({exc.strerror})") from None
        if not stat.S_ISSOCK(mode):
            raise ArgumentError(f"PMI_FD={text} is open in this process but not a socket")
        return Endpoint(fd=fd)
    if env.get("PMI_PORT") is not None:
        host, _, port = env["PMI_PORT"].rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ArgumentError(f"PMI_PORT={env['PMI_PORT']!r} is not HOST:PORT")
        if env.get("PMI_ID") is None:
            raise ArgumentError("PMI_PORT is set but PMI_ID (this process's id) is not")
        return Endpoint(address=(host.strip("[]"), int(port)), pmi_id=env["PMI_ID"])
    return None


class Client:
    """A PMI-1 connection: ``init`` on construction, then :meth:`put`, :meth:`barrier`,
    :meth:`get`; :meth:`close` finalizes it.

    Args:
        endpoint: where the connection is (:func:`endpoint_from_env`).
        timeout: seconds any one exchange may take (a barrier waits for every process of
            the job, so give it the job's start-up timeout).

    Raises:
        CommError: the connection cannot be made or the process manager refuses ``init``;
            CommTimeoutError: no reply within ``timeout``.

    After construction ``rank`` and ``size`` are known when the connection was dialled
    (``PMI_PORT``; the proxy says them), else None; ``kvsname`` names the job's space.
    """

    def __init__(self, endpoint: Endpoint, timeout: float):
        self.endpoint, self.timeout = endpoint, float(timeout)
        self.rank = self.size = None
        self._buf = b""
        self._finalized = False
        try:
            if endpoint.fd is not None:
                # Takes the inherited descriptor over: closing the client closes it.
                self._sock = socket.socket(fileno=endpoint.fd)
            else:
                self._sock = socket.create_connection(endpoint.address,
                                                      timeout=min(self.timeout, 10.0))
        except OSError as exc:
            raise CommError(f"PMI: cannot use the process manager's connection "
                            f"({endpoint}): {exc}") from exc
        try:
            if endpoint.pmi_id is not None:
                ack = self._request(encode("initack", pmiid=endpoint.pmi_id), "initack")
                self.rank, self.size = int(ack["rank"]), int(ack["size"])
                for _ in range(3):          # cmd=set size=, rank=, debug=
                    self._reply("set")
            self._request(encode("init", pmi_version=1, pmi_subversion=1),
                          "response_to_init")
            self.kvsname = self._request(encode("get_my_kvsname"), "my_kvsname")["kvsname"]
        except BaseException:
            self._sock.close()
            raise

    # -- the key-value space --------------------------------------------------------------
    def put(self, key: str, value: str) -> None:
        """Publish ``key`` = ``value`` (any text whose encoded form fits :data:`MAX_VALUE`).

        Raises:
            ArgumentError: the value is too long (:func:`fit` shortens one).
        """
        wire = quote_plus(value, safe="")
        if len(wire) > MAX_VALUE:
            raise ArgumentError(f"PMI put {key!r}: the value takes {len(wire)} bytes encoded, "
                                f"more than the {MAX_VALUE} a process manager must take")
        self._request(encode("put", kvsname=self.kvsname, key=key, value=wire), "put_result")

    def barrier(self) -> None:
        """Wait until every process of the job has called barrier (puts before it are then
        visible to every get after it)."""
        self._request(encode("barrier_in"), "barrier_out")

    def get(self, key: str) -> str:
        """The value published for ``key``.

        Raises:
            CommError: no process published ``key``.
        """
        reply = self._request(encode("get", kvsname=self.kvsname, key=key), "get_result",
                              check=False)
        if reply.get("rc", "0") != "0" or "value" not in reply:
            raise CommError(f"PMI: no process of the job published {key!r} "
                            f"({self.endpoint}, kvs {self.kvsname})")
        return unquote_plus(reply["value"])

    def close(self) -> None:
        """Finalize (tell the proxy this process is done with PMI) and close; idempotent.
        A failed finalize is ignored: the process manager learns of the exit anyway."""
        if self._finalized:
            return
        self._finalized = True
        try:
            self._request(encode("finalize"), "finalize_ack", timeout=min(self.timeout, 5.0))
        except CommError:
            pass
        finally:
            self._sock.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- lines ----------------------------------------------------------------------------
    def _request(self, line: bytes, want: str, check: bool = True,
                 timeout: float | None = None) -> dict[str, str]:
        what = line.split(b" ", 1)[0].decode().removesuffix("\n")
        try:
            self._sock.sendall(line)
        except OSError as exc:
            raise CommError(f"PMI: the process manager's connection ({self.endpoint}) "
                            f"failed on {what}: {exc}") from exc
        reply = self._reply(want, timeout)
        if check and reply.get("rc", "0") != "0":
            raise CommError(f"PMI: the process manager refused {what} "
                            f"({self.endpoint}): {' '.join(f'{k}={v}' for k, v in reply.items())}")
        return reply

    def _reply(self, want: str, timeout: float | None = None) -> dict[str, str]:
        limit = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CommTimeoutError(
                    f"PMI: no {want} from the process manager ({self.endpoint}) within "
                    f"{limit:g} s" + (": a barrier waits for every process of the "
                                             "job to start pycomm" if want == "barrier_out"
                                             else ""))
            self._sock.settimeout(left)
            try:
                data = self._sock.recv(MAX_LINE)
            except socket.timeout:
                continue
            except OSError as exc:
                raise CommError(f"PMI: the process manager's connection ({self.endpoint}) "
                                f"failed waiting for {want}: {exc}") from exc
            if not data:
                raise CommError(f"PMI: the process manager ({self.endpoint}) closed the "
                                f"connection before {want}")
            self._buf += data
            if len(self._buf) > MAX_LINE and b"\n" not in self._buf:
                raise ProtocolError(f"PMI: a reply longer than {MAX_LINE} bytes "
                                    f"({self.endpoint})")
        line, _, self._buf = self._buf.partition(b"\n")
        reply = parse(line)
        if reply["cmd"] != want:
            raise ProtocolError(f"PMI: expected cmd={want} from the process manager "
                                f"({self.endpoint}), got {line[:200].decode('ascii', 'replace')!r}")
        return reply
