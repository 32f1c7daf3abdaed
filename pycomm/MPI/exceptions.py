"""``MPI.Exception``, the ``ERR_*`` error classes and the translation of pycomm's errors.

``MPI.Exception`` derives from :class:`pycomm.CommError`. Every error that leaves a
façade call is an ``MPI.Exception`` *and* keeps its pycomm class: a
:class:`~pycomm.errors.TruncationError` raised by the communicator comes out as an
instance of a class deriving from both (``except MPI.Exception``, ``except
pycomm.TruncationError`` and, for argument errors, ``except ValueError`` all catch it),
with the MPI error class that fits (``ERR_TRUNCATE``). The codes are MPICH's values of
the MPI error classes (MPI-4.0 section 9.4), so programs that print them see familiar
numbers.
"""

from __future__ import annotations

import builtins
import functools

from pycomm.errors import (
    ArgumentError,
    CommError,
    CommTimeoutError,
    InvalidBufferError,
    PeerError,
    ProtocolError,
    TruncationError,
)

__all__ = [
    "ERRORS",
    "ErrhandlerMethods",
    "Add_error_class",
    "Add_error_code",
    "Add_error_string",
    "Remove_error_class",
    "Remove_error_code",
    "Remove_error_string",
    "last_used_code",
    "Exception",
    "Get_error_class",
    "Get_error_string",
    "mpi_error",
    "translate",
    "translating",
]

# (name, code, message) of the MPI error classes (MPICH's numbering)
_CLASSES = [
    ("SUCCESS", 0, "no error"), ("ERR_BUFFER", 1, "invalid buffer pointer"),
    ("ERR_COUNT", 2, "invalid count argument"), ("ERR_TYPE", 3, "invalid datatype"),
    ("ERR_TAG", 4, "invalid tag"), ("ERR_COMM", 5, "invalid communicator"),
    ("ERR_RANK", 6, "invalid rank"), ("ERR_ROOT", 7, "invalid root"),
    ("ERR_GROUP", 8, "invalid group"), ("ERR_OP", 9, "invalid reduce operation"),
    ("ERR_TOPOLOGY", 10, "invalid topology"), ("ERR_DIMS", 11, "invalid dimension argument"),
    ("ERR_ARG", 12, "invalid argument of some other kind"),
    ("ERR_UNKNOWN", 13, "unknown error"), ("ERR_TRUNCATE", 14, "message truncated"),
    ("ERR_OTHER", 15, "other error; the message says more"),
    ("ERR_INTERN", 16, "internal error"), ("ERR_IN_STATUS", 17, "error code is in status"),
    ("ERR_PENDING", 18, "pending request"), ("ERR_REQUEST", 19, "invalid request"),
    ("ERR_ACCESS", 20, "permission denied"), ("ERR_AMODE", 21, "invalid access mode"),
    ("ERR_BAD_FILE", 22, "invalid file name"), ("ERR_CONVERSION", 23, "conversion error"),
    ("ERR_DUP_DATAREP", 24, "duplicate data representation"),
    ("ERR_FILE_EXISTS", 25, "file exists"), ("ERR_FILE_IN_USE", 26, "file in use"),
    ("ERR_FILE", 27, "invalid file"), ("ERR_INFO", 28, "invalid info object"),
    ("ERR_INFO_KEY", 29, "invalid info key"), ("ERR_INFO_VALUE", 30, "invalid info value"),
    ("ERR_INFO_NOKEY", 31, "info key not found"), ("ERR_IO", 32, "I/O error"),
    ("ERR_NAME", 33, "invalid service name"), ("ERR_NO_MEM", 34, "out of memory"),
    ("ERR_NOT_SAME", 35, "collective arguments not identical on all processes"),
    ("ERR_NO_SPACE", 36, "not enough space"), ("ERR_NO_SUCH_FILE", 37, "no such file"),
    ("ERR_PORT", 38, "invalid port"), ("ERR_QUOTA", 39, "quota exceeded"),
    ("ERR_READ_ONLY", 40, "read-only file or file system"),
    ("ERR_SERVICE", 41, "invalid service"), ("ERR_SPAWN", 42, "spawn error"),
    ("ERR_UNSUPPORTED_DATAREP", 43, "unsupported data representation"),
    ("ERR_UNSUPPORTED_OPERATION", 44, "unsupported operation"),
    ("ERR_WIN", 45, "invalid window"), ("ERR_BASE", 46, "invalid base"),
    ("ERR_LOCKTYPE", 47, "invalid lock type"), ("ERR_KEYVAL", 48, "invalid keyval"),
    ("ERR_RMA_CONFLICT", 49, "conflicting RMA accesses"),
    ("ERR_RMA_SYNC", 50, "wrong RMA synchronization"), ("ERR_SIZE", 51, "invalid size"),
    ("ERR_DISP", 52, "invalid displacement"), ("ERR_ASSERT", 53, "invalid assert"),
    ("ERR_ERRHANDLER", 54, "invalid error handler"), ("ERR_SESSION", 55, "invalid session"),
    ("ERR_PROC_ABORTED", 56, "process aborted"),
    ("ERR_VALUE_TOO_LARGE", 57, "value too large to store"),
    ("ERR_RMA_RANGE", 58, "target memory outside the window"),
    ("ERR_RMA_ATTACH", 59, "memory cannot be attached"),
    ("ERR_RMA_SHARED", 60, "memory cannot be shared"),
    ("ERR_RMA_FLAVOR", 61, "wrong window flavor"),
    ("ERR_PROC_FAILED", 62, "process failed"),
    ("ERR_PROC_FAILED_PENDING", 63, "process failed; operation pending"),
    ("ERR_REVOKED", 64, "communicator revoked"), ("ERR_ABI", 65, "MPI ABI error"),
    ("ERR_LASTCODE", 0x3FFFFFFF, "last error code"),
]
ERRORS: dict[str, int] = {name: code for name, code, _ in _CLASSES}
_TEXT = {code: f"MPI_{name}: {text}" for name, code, text in _CLASSES}


# user-defined error classes and codes (Add_error_class/code): code -> its class, and
# the strings Add_error_string attached; numbered from ERR_LASTCODE + 1 upwards
_USER_CLASS: dict[int, int] = {}
_USER_TEXT: dict[int, str] = {}
_LAST = [ERRORS["ERR_LASTCODE"]]


def Get_error_string(errorcode: int) -> str:
    """The text of an error code or class (``"MPI_ERR_TRUNCATE: message truncated"``;
    for a user-defined one, what ``Add_error_string`` set, else ``""``).

    Raises:
        ValueError: not a known code.
    """
    try:
        code = int(errorcode)
        return _USER_TEXT.get(code, "") if code in _USER_CLASS else _TEXT[code]
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"Get_error_string: {errorcode!r} is not an MPI error code") \
            from None


def Get_error_class(errorcode: int) -> int:
    """The error class of a code: pycomm's own codes are the classes themselves."""
    Get_error_string(errorcode)
    return _USER_CLASS.get(int(errorcode), int(errorcode))


def last_used_code() -> int:
    """The largest error code in use (the ``LASTUSEDCODE`` attribute)."""
    return _LAST[0]


def Add_error_class() -> int:
    """A new error class (above ``ERR_LASTCODE``), which is its own first code."""
    _LAST[0] += 1
    _USER_CLASS[_LAST[0]] = _LAST[0]
    return _LAST[0]


def Add_error_code(errorclass: int) -> int:
    """A new error code of ``errorclass`` (predefined or user-defined)."""
    Get_error_string(errorclass)
    _LAST[0] += 1
    _USER_CLASS[_LAST[0]] = Get_error_class(errorclass)
    return _LAST[0]


def Add_error_string(errorcode: int, string: str) -> None:
    """Attach ``string`` to a user-defined code or class."""
    _user(errorcode, "Add_error_string")
    _USER_TEXT[int(errorcode)] = str(string)


def _user(errorcode: int, call: str) -> int:
    code = int(errorcode)
    if code not in _USER_CLASS:
        raise Exception(ERRORS["ERR_ARG"], f"{call}: {errorcode!r} is not a user-defined "
                        "error code")
    return code


def Remove_error_string(errorcode: int) -> None:
    """Remove the string of a user-defined code or class (MPI 4.1)."""
    _USER_TEXT.pop(_user(errorcode, "Remove_error_string"), None)


def Remove_error_code(errorcode: int) -> None:
    """Remove a user-defined code that has no string any more (MPI 4.1).

    Raises:
        MPI.Exception (ERR_ARG): not a user-defined code, a class, or one with a string.
    """
    code = _user(errorcode, "Remove_error_code")
    if _USER_CLASS[code] == code or code in _USER_TEXT:
        raise Exception(ERRORS["ERR_ARG"], f"Remove_error_code: {code} is an error class "
                        "or still has a string")
    del _USER_CLASS[code]


def Remove_error_class(errorclass: int) -> None:
    """Remove a user-defined class that has no string and no codes left (MPI 4.1)."""
    code = _user(errorclass, "Remove_error_class")
    if _USER_CLASS[code] != code or code in _USER_TEXT or \
            any(c != code and k == code for c, k in _USER_CLASS.items()):
        raise Exception(ERRORS["ERR_ARG"], f"Remove_error_class: {code} is not a class "
                        "without codes and string")
    del _USER_CLASS[code]


class Exception(CommError):
    """``MPI.Exception``: an MPI error with its code; a :class:`pycomm.CommError`.

    Args:
        ierr: the error code (an ``MPI.ERR_*`` value); default ``ERR_OTHER``.
        message: the text (default: the code's error string).
    """

    error_code = ERRORS["ERR_OTHER"]

    def __init__(self, ierr: int = ERRORS["ERR_OTHER"], message: str | None = None):
        code = int(ierr)
        if code < 0:                # as mpi4py: a negative code is no MPI error code
            code = ERRORS["ERR_UNKNOWN"]
        super().__init__(message if message is not None else _TEXT.get(code, str(code)))
        self.error_code = code

    ierr = property(lambda self: self.error_code)
    error_class = property(lambda self: self.error_code)
    error_string = property(lambda self: _TEXT.get(self.error_code, str(self)))

    def Get_error_code(self) -> int:
        return self.error_code

    def Get_error_class(self) -> int:
        return _USER_CLASS.get(self.error_code, self.error_code)

    def Get_error_string(self) -> str:
        return _TEXT.get(self.error_code, str(self))

    def __int__(self) -> int:
        return self.error_code

    def __repr__(self) -> str:
        return f"MPI.Exception({self.error_code})"

    def __lt__(self, other) -> bool:
        return int(self) < int(other)

    def __le__(self, other) -> bool:
        return int(self) <= int(other)

    def __gt__(self, other) -> bool:
        return int(self) > int(other)

    def __ge__(self, other) -> bool:
        return int(self) >= int(other)

    def __bool__(self) -> bool:
        return self.error_code != 0

    def __eq__(self, other) -> bool:
        if isinstance(other, builtins.Exception) and not isinstance(other, Exception):
            return NotImplemented
        return int(self) == int(other)

    def __hash__(self) -> int:
        return hash(self.error_code)


# pycomm class -> the MPI error class it maps to; argument errors are refined by the
# argument their message names (the communicator's messages say "root=", "tag=", ...).
_BASE_CODES = [(TruncationError, "ERR_TRUNCATE"), (InvalidBufferError, "ERR_BUFFER"),
               (ArgumentError, "ERR_ARG"), (CommTimeoutError, "ERR_PENDING"),
               (PeerError, "ERR_OTHER"), (ProtocolError, "ERR_INTERN"),
               (CommError, "ERR_OTHER")]
_ARG_HINTS = [("root=", "ERR_ROOT"), ("tag=", "ERR_TAG"), ("dest=", "ERR_RANK"),
              ("source=", "ERR_RANK"), ("op ", "ERR_OP"), ("op=", "ERR_OP"),
              ("count", "ERR_COUNT"), ("datatype", "ERR_TYPE"), ("freed", "ERR_COMM")]
_MIXED: dict[type, type] = {}


def _mixed(cls: type) -> type:
    """The class deriving from both ``MPI.Exception`` and the pycomm class ``cls``."""
    out = _MIXED.get(cls)
    if out is None:
        out = type(cls.__name__, (Exception, cls), {"__module__": "pycomm.MPI"})
        out.__init__ = Exception.__init__
        _MIXED[cls] = out
    return out


def translate(exc: CommError) -> Exception:
    """``exc`` as an ``MPI.Exception`` of the same pycomm class, message and attributes."""
    if isinstance(exc, Exception):
        return exc
    code = next(ERRORS[name] for cls, name in _BASE_CODES if isinstance(exc, cls))
    if getattr(exc, "mpi_error", None):
        code = ERRORS[exc.mpi_error]
    elif isinstance(exc, ArgumentError) and not isinstance(exc, InvalidBufferError):
        text = str(exc)
        code = next((ERRORS[name] for hint, name in _ARG_HINTS if hint in text), code)
    cls = _mixed(type(exc))
    out = cls.__new__(cls, *exc.args)
    out.args = exc.args
    out.__dict__.update(exc.__dict__)
    out.error_code = code
    return out


def mpi_error(cls: type, code: str, message: str) -> Exception:
    """A new error of pycomm class ``cls`` and MPI error class ``code`` (``"ERR_TYPE"``)."""
    return _mixed(cls)(ERRORS[code], message)


def translating(fn):
    """Decorate a façade method so that pycomm errors leave it as ``MPI.Exception``, or go
    to the user-defined error handler of the object it was called on (which then
    returns None: :mod:`pycomm.MPI.errhandlers`)."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except CommError as exc:
            error = exc if isinstance(exc, Exception) else translate(exc)
            if args and not isinstance(args[0], type):
                from .errhandlers import user_handled
                if user_handled(args[0], error):
                    return None
            if error is exc:
                raise
            raise error.with_traceback(exc.__traceback__) from None
    return call


def translate_methods(cls: type) -> type:
    """Class decorator: wrap every public method of ``cls`` with :func:`translating`."""
    for name, value in list(vars(cls).items()):
        # (a classmethod object is not callable itself: Request.Waitall and the like)
        wrapped = isinstance(value, (staticmethod, classmethod))
        if name.startswith("_") or not (callable(value) or wrapped) or \
                isinstance(value, type):
            continue
        if isinstance(value, (staticmethod, classmethod)):
            setattr(cls, name, type(value)(translating(value.__func__)))
        else:
            setattr(cls, name, translating(value))
    return cls


@translate_methods
class ErrhandlerMethods:
    """The error-handler calls of a handle (a session, a window) whose ``_state(call)``
    returns its state, a dict with an ``"errhandler"`` entry; ``_ERRH_KIND`` names the
    kind of user-defined handler it takes (see :mod:`pycomm.MPI.errhandlers`)."""

    _ERRH_KIND = ""

    def _current_errhandler(self):
        """The handler set (its shared part), or None: read by failing calls."""
        try:
            eh = self._state("Get_errhandler")["errhandler"]
        except CommError:
            return None
        return eh._handle if eh is not None else None

    def Get_errhandler(self):
        """A new handle to the error handler (the default unless one was set)."""
        from . import Errhandler, default_errhandler
        return Errhandler(self._state("Get_errhandler")["errhandler"] or
                          default_errhandler())

    def Set_errhandler(self, errhandler) -> None:
        """Set the error handler of this object.

        Raises:
            TypeError: not an Errhandler.
            MPI.Exception: ERR_ERRHANDLER (ERRHANDLER_NULL), ERR_ARG (a user-defined
                handler of another kind).
        """
        from .errhandlers import checked
        kind = self._ERRH_KIND
        state = self._state("Set_errhandler")
        state["errhandler"] = checked(kind, errhandler, f"{kind}.Set_errhandler")

    def Call_errhandler(self, errorcode: int) -> None:
        """Run the error handler on ``errorcode`` (see
        :func:`pycomm.MPI.errhandlers.call_errhandler`)."""
        from . import default_errhandler
        from .errhandlers import call_errhandler
        eh = self._state("Call_errhandler")["errhandler"] or default_errhandler()
        call_errhandler(self, eh, int(errorcode))
