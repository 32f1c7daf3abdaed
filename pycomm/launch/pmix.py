"""A PMIx client (ctypes): the process manager's key-value space under Open MPI 5.

Open MPI 5's ``mpirun`` (PRRTE's ``prterun``, its ``prted`` daemons on the other hosts)
starts every process as a PMIx client: it sets ``PMIX_NAMESPACE``, ``PMIX_RANK`` and the
local server's URI (``PMIX_SERVER_URI*``), and the process reaches that server through the
PMIx library. Open MPI's own ranks exchange their addresses that way (the "modex": each
rank ``PMIx_Put``\\ s its endpoints, ``PMIx_Commit``\\ s them, a ``PMIx_Fence`` with data
collection spreads them to every host, and ``PMIx_Get`` reads a peer's). pycomm needs one
pair: rank 0 publishes where its rendezvous store listens, so a multi-host Open MPI 5 job
needs no ``MASTER_ADDR`` (Open MPI 4 names mpirun's host in ``OMPI_MCA_orte_hnp_uri``; 5
has no such variable). See :mod:`pycomm.launch.bootstrap` (``_pmi_rendezvous``).

Protocol (the PMIx Standard v4/v5, chapters "Initialization and Finalization", "Data
Access and Sharing"; OpenPMIx's ``pmix.h``)::

    PMIx_Init(&me, NULL, 0)                           me = {nspace, rank}
    rank 0: PMIx_Put(PMIX_GLOBAL, key, &string); PMIx_Commit()
    every rank: PMIx_Fence(NULL, 0, {pmix.collect=true, pmix.timeout=T}, 2)
    every rank: PMIx_Get(&{nspace, 0}, key, {pmix.timeout=T}, 1, &value); PMIx_Value_free
    PMIx_Finalize(NULL, 0)

The structures are those of ``pmix_common.h`` (PMIx 4 and 5 agree; the stable ABI of
OpenPMIx 5.0, which Open MPI 5.0 ships): ``pmix_proc_t`` is ``char nspace[256]`` and a
``uint32_t`` rank (260 bytes); ``pmix_value_t`` a ``uint16_t`` type and a union whose
largest member, ``pmix_envar_t``, takes 24 bytes (32 bytes in all, the union at offset
8); ``pmix_info_t`` a ``char key[512]``, ``uint32_t`` flags and a value (552 bytes, the
value at 520). The tests check these sizes and a round trip through the real library.

The library: ``libpmix.so*`` of the job's own PMIx, looked for (:func:`find_library`)
under ``PMIX_PREFIX`` and ``OPAL_PREFIX`` (both set by Open MPI 5's launcher for its
ranks; ``lib``, ``lib64`` and their ``openmpi`` folders, where Open MPI bundles it) and
``OMPI_LIBDIR_LOC``, then where the dynamic linker finds ``libpmix`` (an Open MPI built
against the system's PMIx). When none is found or it does not load, the error says to set
``MASTER_ADDR`` (and ``MASTER_PORT``) instead.

Every blocking call runs in a helper thread that the caller waits for at most its
deadline: PMIx's fence and get are also given PMIx's own ``pmix.timeout``, so a rank that
never arrives becomes ``PMIX_ERR_TIMEOUT`` (a :class:`~pycomm.errors.CommTimeoutError`
naming what was waited for); a call that does not return even then raises the same error
and the library is left alone (not finalized) from then on.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import math
import os
import threading
from dataclasses import dataclass

from ..errors import ArgumentError, CommError, CommTimeoutError, ProtocolError

__all__ = ["Client", "Endpoint", "Info", "Proc", "Value", "bind", "decode",
           "endpoint_from_env", "find_library", "make_info", "make_proc", "string_value"]

# -- pmix_common.h ---------------------------------------------------------------------------
MAX_NSLEN = 255                 # PMIX_MAX_NSLEN: pmix_nspace_t is char[256]
MAX_KEYLEN = 511                # PMIX_MAX_KEYLEN: pmix_key_t is char[512]
SUCCESS = 0                     # PMIX_SUCCESS
ERR_TIMEOUT = -24               # PMIX_ERR_TIMEOUT
ERR_NOT_FOUND = -46             # PMIX_ERR_NOT_FOUND
GLOBAL = 3                      # PMIX_GLOBAL (pmix_scope_t): every process, any host
COLLECT_DATA = b"pmix.collect"  # PMIX_COLLECT_DATA (bool), a fence's info
TIMEOUT = b"pmix.timeout"       # PMIX_TIMEOUT (int, seconds), a fence's or get's info

# pmix_data_type_t values (uint16_t) and the union member each is read from
BOOL, BYTE, STRING, SIZE, PID, INT, INT8, INT16, INT32, INT64 = range(1, 11)
UINT, UINT8, UINT16, UINT32, UINT64, FLOAT, DOUBLE = range(11, 18)
STATUS, PROC_RANK = 20, 40
_MEMBER = {BOOL: "flag", BYTE: "byte", SIZE: "size", PID: "pid", INT: "integer",
           INT8: "int8", INT16: "int16", INT32: "int32", INT64: "int64", UINT: "uint",
           UINT8: "uint8", UINT16: "uint16", UINT32: "uint32", UINT64: "uint64",
           FLOAT: "fval", DOUBLE: "dval", STATUS: "status", PROC_RANK: "rank"}


class Proc(ctypes.Structure):
    """``pmix_proc_t``: a process's namespace and rank."""

    _fields_ = [("nspace", ctypes.c_char * (MAX_NSLEN + 1)), ("rank", ctypes.c_uint32)]


class _ByteObject(ctypes.Structure):           # pmix_byte_object_t
    _fields_ = [("bytes", ctypes.c_void_p), ("size", ctypes.c_size_t)]


class _Envar(ctypes.Structure):                # pmix_envar_t: the union's largest member
    _fields_ = [("envar", ctypes.c_void_p), ("value", ctypes.c_void_p),
                ("separator", ctypes.c_char)]


class _TimeVal(ctypes.Structure):              # struct timeval
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_usec", ctypes.c_long)]


class _Data(ctypes.Union):
    """``pmix_value_t``'s union: its scalar members, the pointer ones as ``ptr``/``string``
    and the by-value structs that set its size (``bo``, ``envar``, ``tv``)."""

    _fields_ = [("flag", ctypes.c_bool), ("byte", ctypes.c_uint8),
                ("string", ctypes.c_void_p), ("size", ctypes.c_size_t),
                ("pid", ctypes.c_int32), ("integer", ctypes.c_int),
                ("int8", ctypes.c_int8), ("int16", ctypes.c_int16),
                ("int32", ctypes.c_int32), ("int64", ctypes.c_int64),
                ("uint", ctypes.c_uint), ("uint8", ctypes.c_uint8),
                ("uint16", ctypes.c_uint16), ("uint32", ctypes.c_uint32),
                ("uint64", ctypes.c_uint64), ("fval", ctypes.c_float),
                ("dval", ctypes.c_double), ("tv", _TimeVal), ("status", ctypes.c_int),
                ("rank", ctypes.c_uint32), ("ptr", ctypes.c_void_p), ("bo", _ByteObject),
                ("envar", _Envar)]


class Value(ctypes.Structure):
    """``pmix_value_t``: a ``uint16_t`` type and the union holding the value."""

    _fields_ = [("type", ctypes.c_uint16), ("data", _Data)]


class Info(ctypes.Structure):
    """``pmix_info_t``: a key, directives (``PMIX_INFO_REQD``...) and a value."""

    _fields_ = [("key", ctypes.c_char * (MAX_KEYLEN + 1)), ("flags", ctypes.c_uint32),
                ("value", Value)]


# -- marshalling ------------------------------------------------------------------------------
def _key(key: str | bytes) -> bytes:
    raw = key.encode() if isinstance(key, str) else key
    if not raw or len(raw) > MAX_KEYLEN or b"\0" in raw:
        raise ArgumentError(f"PMIx key {key!r}: 1..{MAX_KEYLEN} bytes without NUL")
    return raw


def make_proc(nspace: str | bytes, rank: int) -> Proc:
    """A ``pmix_proc_t``.

    Raises:
        ArgumentError: the namespace is longer than PMIx allows (255 bytes).
    """
    raw = nspace.encode() if isinstance(nspace, str) else nspace
    if len(raw) > MAX_NSLEN or b"\0" in raw:
        raise ArgumentError(f"PMIx namespace {nspace!r}: at most {MAX_NSLEN} bytes")
    return Proc(raw, rank)


def string_value(text: str) -> tuple[Value, ctypes.Array]:
    """A ``PMIX_STRING`` value and the buffer it points to (keep both alive while used)."""
    buf = ctypes.create_string_buffer(text.encode())
    value = Value(STRING)
    value.data.string = ctypes.addressof(buf)
    return value, buf


def make_info(*pairs: tuple[bytes, bool | int]) -> ctypes.Array:
    """An array of ``pmix_info_t`` from (key, value) pairs: bool -> ``PMIX_BOOL``, int ->
    ``PMIX_INT`` (the types the PMIx standard gives ``pmix.collect`` and ``pmix.timeout``).

    Raises:
        ArgumentError: a value of another type, or a key too long.
    """
    infos = (Info * len(pairs))()
    for info, (key, value) in zip(infos, pairs):
        info.key = _key(key)
        if isinstance(value, bool):
            info.value.type, info.value.data.flag = BOOL, value
        elif isinstance(value, int):
            info.value.type, info.value.data.integer = INT, value
        else:
            raise ArgumentError(f"PMIx info {key!r}: {type(value).__name__} values are not "
                                "supported (bool, int)")
    return infos


def decode(value: Value) -> object:
    """A ``pmix_value_t`` as Python: ``PMIX_STRING`` -> str, the integer and float types ->
    int / float / bool.

    Raises:
        ProtocolError: a type this client does not read (named by its number).
    """
    if value.type == STRING:
        return ctypes.string_at(value.data.string).decode() if value.data.string else ""
    member = _MEMBER.get(value.type)
    if member is None:
        raise ProtocolError(f"PMIx: a value of data type {value.type}, which pycomm does "
                            "not read (it reads strings and numbers)")
    return getattr(value.data, member)


# -- where the library is ------------------------------------------------------------------
def _candidates(env: dict[str, str]) -> list[str]:
    dirs = []
    for var in ("PMIX_PREFIX", "OPAL_PREFIX"):
        if env.get(var):
            dirs += [os.path.join(env[var], sub) for sub in
                     ("lib", "lib64", "lib/openmpi", "lib64/openmpi")]
    if env.get("OMPI_LIBDIR_LOC"):
        dirs += [env["OMPI_LIBDIR_LOC"], os.path.join(env["OMPI_LIBDIR_LOC"], "openmpi")]
    return list(dict.fromkeys(dirs))


def find_library(env: dict[str, str]) -> tuple[str | None, list[str]]:
    """``libpmix.so*`` for this job: (path or None, the places looked in).

    The prefixes Open MPI 5 gives its ranks first (``PMIX_PREFIX``, ``OPAL_PREFIX``,
    ``OMPI_LIBDIR_LOC``; in ``lib``, ``lib64`` and their ``openmpi`` folders), the
    unversioned name before versioned ones; then the dynamic linker's ``libpmix``.
    """
    looked = []
    for folder in _candidates(env):
        looked.append(folder)
        found = sorted(glob.glob(os.path.join(folder, "libpmix.so*")),
                       key=lambda p: (len(p), p))
        for path in found:
            if os.path.isfile(path):
                return path, looked
    looked.append("the dynamic linker's libpmix")
    return ctypes.util.find_library("pmix"), looked


@dataclass(frozen=True)
class Endpoint:
    """This process's PMIx server, as the launcher's variables describe it."""

    library: str
    nspace: str
    rank: int

    def __str__(self) -> str:
        return f"PMIx namespace {self.nspace} rank {self.rank}, {self.library}"


def endpoint_from_env(env: dict[str, str]) -> Endpoint | None:
    """The PMIx connection of a process Open MPI 5 (PRRTE) started; None when
    ``PMIX_NAMESPACE`` is not set. Reads variables and looks for the library; loads nothing.

    Raises:
        ArgumentError: no ``libpmix.so*`` found (the message names the places looked in).
    """
    if not env.get("PMIX_NAMESPACE"):
        return None
    path, looked = find_library(env)
    if path is None:
        raise ArgumentError(f"no libpmix.so* found (looked in {', '.join(looked)}; "
                            "PMIX_PREFIX / OPAL_PREFIX name Open MPI's prefix)")
    try:
        rank = int(env.get("PMIX_RANK", "-1"))
    except ValueError:
        raise ArgumentError(f"PMIX_RANK={env['PMIX_RANK']!r} is not a number") from None
    return Endpoint(path, env["PMIX_NAMESPACE"], rank)


# -- the client -----------------------------------------------------------------------------
_PTR = ctypes.c_void_p
_PROTOTYPES = {     # name: (restype, argtypes), as pmix.h declares them
    "PMIx_Init": (ctypes.c_int, [ctypes.POINTER(Proc), ctypes.POINTER(Info), ctypes.c_size_t]),
    "PMIx_Finalize": (ctypes.c_int, [ctypes.POINTER(Info), ctypes.c_size_t]),
    "PMIx_Put": (ctypes.c_int, [ctypes.c_uint8, ctypes.c_char_p, ctypes.POINTER(Value)]),
    "PMIx_Commit": (ctypes.c_int, []),
    "PMIx_Fence": (ctypes.c_int, [ctypes.POINTER(Proc), ctypes.c_size_t,
                                  ctypes.POINTER(Info), ctypes.c_size_t]),
    "PMIx_Get": (ctypes.c_int, [ctypes.POINTER(Proc), ctypes.c_char_p, ctypes.POINTER(Info),
                                ctypes.c_size_t, ctypes.POINTER(ctypes.POINTER(Value))]),
    "PMIx_Value_free": (None, [ctypes.POINTER(Value), ctypes.c_size_t]),
    "PMIx_Error_string": (_PTR, [ctypes.c_int]),        # const char *
    "PMIx_Get_version": (_PTR, []),                     # const char *
}


def bind(lib) -> dict:
    """The functions of :data:`_PROTOTYPES` from ``lib``: a loaded ``ctypes.CDLL``, or an
    object with Python callables of those names (a fake, called through the same C
    prototypes, so its arguments are marshalled as the real library's are).

    Raises:
        CommError: the library lacks one of them (not a PMIx 4/5 client library).
    """
    funcs = {}
    for name, (restype, argtypes) in _PROTOTYPES.items():
        proto = ctypes.CFUNCTYPE(restype, *argtypes)
        try:
            funcs[name] = proto((name, lib)) if isinstance(lib, ctypes.CDLL) \
                else proto(getattr(lib, name))
        except AttributeError as exc:
            raise CommError(f"PMIx: the library has no {name} ({exc})") from None
    return funcs


class Client:
    """A PMIx client: ``PMIx_Init`` on construction, then :meth:`put`, :meth:`barrier`,
    :meth:`get` (the interface of :class:`pycomm.launch.pmi.Client`); :meth:`close`
    finalizes it.

    Args:
        endpoint: from :func:`endpoint_from_env`.
        timeout: seconds each call may take (the fence waits for every rank of the job, so
            give it the job's start-up timeout).
        lib: the loaded library or a fake (:func:`bind`); default: load ``endpoint.library``.

    Raises:
        CommError: the library does not load or PMIx_Init fails, saying to set
            MASTER_ADDR instead; CommTimeoutError: PMIx_Init does not return in time.

    After construction ``rank`` and ``size`` (None: PMIx tells no size here) and
    ``kvsname`` (the namespace) are known.
    """

    def __init__(self, endpoint: Endpoint, timeout: float, lib=None):
        self.endpoint, self.timeout = endpoint, float(timeout)
        self.size = None
        self._initialized = self._wedged = False
        self._keep: list = []
        if lib is None:
            try:
                lib = ctypes.CDLL(endpoint.library)
            except OSError as exc:
                raise CommError(f"PMIx: cannot load {endpoint.library} ({exc}); set "
                                "MASTER_ADDR to rank 0's host and MASTER_PORT to a free port "
                                "on every rank (mpirun -x MASTER_ADDR=node01 -x "
                                "MASTER_PORT=29500 ...)") from exc
        self._f = bind(lib)
        me = Proc()
        try:
            self._call("PMIx_Init", "", ctypes.byref(me), None, 0,
                       what="the local PMIx server (PMIX_SERVER_URI*) to accept this process")
        except CommError as exc:
            raise type(exc)(f"{exc}; set MASTER_ADDR to rank 0's host and MASTER_PORT to a "
                            "free port on every rank instead (mpirun -x MASTER_ADDR=node01 "
                            "-x MASTER_PORT=29500 ...)") from exc
        self._initialized = True
        self.kvsname, self.rank = me.nspace.decode(), me.rank

    def __str__(self) -> str:
        return str(self.endpoint)

    # -- the key-value space --------------------------------------------------------------
    def put(self, key: str, value: str) -> None:
        """Publish ``key`` = ``value`` for every process of the job (``PMIX_GLOBAL``); seen by
        the others after the next :meth:`barrier`."""
        val, buf = string_value(value)
        # kept for the client's life: a PMIx_Put that timed out may still be reading it
        self._keep.append((val, buf))
        self._call("PMIx_Put", key, GLOBAL, _key(key), ctypes.byref(val), what="")

    def barrier(self) -> None:
        """``PMIx_Commit`` this process's puts, then ``PMIx_Fence`` over every process of
        the namespace with data collection (puts before it are then readable everywhere).

        Raises:
            CommTimeoutError: not every process arrived within the timeout.
        """
        self._call("PMIx_Commit", "", what="")
        infos = make_info((COLLECT_DATA, True), (TIMEOUT, self._seconds()))
        self._call("PMIx_Fence", "", None, 0, infos, len(infos),
                   what="every rank of the job to reach the fence (to start pycomm)")

    def get(self, key: str, rank: int = 0) -> str:
        """The string ``rank`` (default 0) published for ``key``.

        Raises:
            CommError: it published none; ProtocolError: not a string.
        """
        peer = make_proc(self.kvsname, rank)
        out = ctypes.POINTER(Value)()
        infos = make_info((TIMEOUT, self._seconds()))
        self._call("PMIx_Get", key, ctypes.byref(peer), _key(key), infos, len(infos),
                   ctypes.byref(out), what=f"rank {rank}'s {key!r}")
        if not out:
            raise CommError(f"PMIx: PMIx_Get({key!r}) succeeded but returned no value "
                            f"({self})")
        try:
            got = decode(out.contents)
        finally:
            self._f["PMIx_Value_free"](out, 1)
        if not isinstance(got, str):
            raise ProtocolError(f"PMIx: rank {rank}'s {key!r} is {got!r}, not a string")
        return got

    def close(self) -> None:
        """``PMIx_Finalize`` (bounded, failure ignored: the server learns of the exit
        anyway); idempotent. Skipped when a call did not return in time."""
        if not self._initialized or self._wedged:
            return
        self._initialized = False
        try:
            self._call("PMIx_Finalize", "", None, 0, what="", limit=min(self.timeout, 10.0))
        except CommError:
            pass

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- calls ----------------------------------------------------------------------------
    def _seconds(self) -> int:
        return max(1, math.ceil(self.timeout))

    def _error_string(self, rc: int) -> str:
        try:
            text = self._f["PMIx_Error_string"](rc)
            return ctypes.string_at(text).decode(errors="replace") if text else f"{rc}"
        except Exception:                   # noqa: BLE001 - only a message
            return str(rc)

    def _call(self, name: str, key: str, *args, what: str, limit: float | None = None):
        """Run ``name(*args)`` in a helper thread, waiting at most the timeout (plus a grace
        for PMIx's own ``pmix.timeout`` to answer first); raise on a non-success status."""
        limit = self.timeout + 5.0 if limit is None else limit
        box: dict = {}

        def run():
            try:
                box["rc"] = self._f[name](*args)
            except BaseException as exc:    # noqa: BLE001 - re-raised below
                box["exc"] = exc
        helper = threading.Thread(target=run, name=f"pycomm-{name}", daemon=True)
        helper.start()
        helper.join(limit)
        step = f"{name}({key!r})" if key else name
        waited = f"; it waited for {what}" if what else ""
        if helper.is_alive():
            self._wedged = True
            raise CommTimeoutError(f"PMIx: {step} did not return within {limit:g} s"
                                   f"{waited} ({self})")
        if "exc" in box:
            raise CommError(f"PMIx: {step} failed: {box['exc']} ({self})") from box["exc"]
        rc = box["rc"]
        if rc is None or rc == SUCCESS:
            return
        if rc == ERR_TIMEOUT:
            raise CommTimeoutError(f"PMIx: {step} timed out after {self._seconds()} s "
                                   f"({self._error_string(rc)}){waited} ({self})")
        if rc == ERR_NOT_FOUND and name == "PMIx_Get":
            raise CommError(f"PMIx: no {what} in the job ({self})")
        raise CommError(f"PMIx: {step} failed: {self._error_string(rc)} ({rc}){waited} "
                        f"({self})")
