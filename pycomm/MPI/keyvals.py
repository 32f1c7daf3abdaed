"""Attribute caching: keyvals with copy and delete callbacks (MPI-4.1 section 7.7).

``Comm.Create_keyval(copy_fn=None, delete_fn=None, nopython=False)`` (and the same class
method of ``Datatype`` and ``Win``) makes a key for values cached on objects of that kind
with ``Set_attr``; ``Get_attr`` reads them (None when unset), ``Delete_attr`` removes them.
The callbacks, as in mpi4py:

* ``copy_fn(obj, keyval, value)`` runs for each cached value when ``obj`` is duplicated
  (``Comm.Dup``/``Idup``, ``Datatype.Dup``; no other constructor copies): its result is the
  duplicate's value, or ``NotImplemented`` for none. ``None`` or ``False`` copy nothing
  (``MPI_COMM_NULL_COPY_FN``), ``True`` the same value (``MPI_COMM_DUP_FN``).
* ``delete_fn(obj, keyval, value)`` runs when a value is deleted, replaced by
  ``Set_attr`` or when ``obj`` is freed.

An exception in a callback is printed to stderr and the call raises ``MPI.Exception``
(``ERR_OTHER``), as mpi4py does. A key of another kind, a predefined key in ``Set_attr``
or ``Delete_attr``, an unknown key and ``KEYVAL_INVALID`` are ``ERR_KEYVAL`` (MPICH's
answers). ``Free_keyval`` returns ``KEYVAL_INVALID``; values cached under a freed key stay
readable and are deleted (with the callback) as usual, but no new value can be set; the key
itself is forgotten once its last value is deleted (each key counts the values it holds).
``nopython=True`` is accepted for mpi4py's sake: values are Python objects either way.
"""

from __future__ import annotations

import itertools
import sys
import traceback
import weakref
from typing import Any, Callable

from pycomm.errors import ArgumentError, CommError

from .exceptions import mpi_error

__all__ = ["KEYVAL_INVALID", "check_keyval", "copy_attrs", "create_keyval", "delete_attr",
           "free_attrs", "free_keyval", "install", "set_attr", "type_attrs", "user_attr"]

KEYVAL_INVALID = -1


class _Keyval:
    __slots__ = ("copy_fn", "delete_fn", "freed", "kind", "values")

    def __init__(self, kind: str, copy_fn, delete_fn):
        self.kind, self.copy_fn, self.delete_fn, self.freed = kind, copy_fn, delete_fn, False
        self.values = 0                 # values cached under this key, on all objects


_KEYVALS: dict[int, _Keyval] = {}
# above every predefined key (TAG_UB... are small; the WIN_* keys are 1711276033 and up)
_NEXT = itertools.count(1 << 31)


def _held(keyval: int, change: int) -> None:
    """Count ``change`` more values cached under ``keyval``; forget a freed key that holds
    none (so creating and freeing keys in a loop does not grow the table)."""
    key = _KEYVALS.get(keyval)
    if key is None:
        return
    key.values += change
    if key.freed and key.values <= 0:
        del _KEYVALS[keyval]


def _keyval_error(call: str, text: str) -> Exception:
    return mpi_error(ArgumentError, "ERR_KEYVAL", f"{call}: {text}")


def check_keyval(keyval, call: str) -> int:
    """``keyval`` as an int.

    Raises:
        MPI.Exception (ERR_KEYVAL): ``KEYVAL_INVALID``.
    """
    if keyval == KEYVAL_INVALID:
        raise _keyval_error(call, "KEYVAL_INVALID is not a key")
    return int(keyval)


def create_keyval(kind: str, copy_fn=None, delete_fn=None, nopython: bool = False) -> int:
    """A new key for attributes of objects of ``kind`` (``"Comm"``, ``"Datatype"``,
    ``"Win"``).

    Args:
        copy_fn: None/False (not copied), True (copied as is) or ``fn(obj, keyval, value)``
            returning the duplicate's value (``NotImplemented``: none).
        delete_fn: None or ``fn(obj, keyval, value)``.
        nopython: accepted as in mpi4py (no effect).

    Raises:
        TypeError: a callback that is neither of the above.
    """
    if not (copy_fn is None or isinstance(copy_fn, bool) or callable(copy_fn)):
        raise TypeError(f"{kind}.Create_keyval: copy_fn must be None, a bool or a "
                        f"callable, got {copy_fn!r}")
    if not (delete_fn is None or callable(delete_fn)):
        raise TypeError(f"{kind}.Create_keyval: delete_fn must be None or a callable, "
                        f"got {delete_fn!r}")
    keyval = next(_NEXT)
    _KEYVALS[keyval] = _Keyval(kind, copy_fn, delete_fn)
    return keyval


def free_keyval(kind: str, keyval) -> int:
    """Free ``keyval``; returns ``KEYVAL_INVALID``.

    Raises:
        MPI.Exception (ERR_KEYVAL): not a live key of ``kind``.
    """
    _user_keyval(kind, keyval, f"{kind}.Free_keyval", setting=True).freed = True
    _held(int(keyval), 0)
    return KEYVAL_INVALID


def _user_keyval(kind: str, keyval, call: str, setting: bool = False) -> _Keyval:
    key = _KEYVALS.get(check_keyval(keyval, call))
    if key is None or key.kind != kind:
        raise _keyval_error(call, f"{keyval} is not a key made by {kind}.Create_keyval "
                                  "(predefined keys can only be read)")
    if setting and key.freed:
        raise _keyval_error(call, f"key {keyval} has been freed (Free_keyval)")
    return key


def user_attr(kind: str, attrs: dict, keyval, call: str):
    """``Get_attr`` of a key made by ``Create_keyval``: the value, or None when unset.

    Raises:
        MPI.Exception (ERR_KEYVAL): not a key of ``kind``.
    """
    _user_keyval(kind, keyval, call)
    return attrs.get(int(keyval))


def _run(fn: Callable, call: str, *args) -> Any:
    try:
        return fn(*args)
    except Exception as exc:            # mpi4py: printed, and the call fails with ERR_OTHER
        traceback.print_exc(file=sys.stderr)
        raise mpi_error(CommError, "ERR_OTHER",
                        f"{call}: an attribute callback raised "
                        f"{type(exc).__name__}: {exc}") from exc


def set_attr(kind: str, obj, attrs: dict, keyval, value, call: str) -> None:
    """Cache ``value`` on ``obj`` under ``keyval`` (a replaced value is deleted first).

    Raises:
        MPI.Exception: ERR_KEYVAL (not a live key of ``kind``), ERR_OTHER (the delete
            callback raised).
    """
    key = _user_keyval(kind, keyval, call, setting=True)
    keyval = int(keyval)
    if keyval in attrs:
        if key.delete_fn is not None:
            _run(key.delete_fn, call, obj, keyval, attrs[keyval])
    else:
        _held(keyval, 1)
    attrs[keyval] = value


def delete_attr(kind: str, obj, attrs: dict, keyval, call: str) -> None:
    """Remove the value cached under ``keyval`` (none: nothing happens), calling the key's
    delete callback.

    Raises:
        MPI.Exception: ERR_KEYVAL (not a key of ``kind``), ERR_OTHER (the callback raised;
            the value is removed all the same).
    """
    key = _user_keyval(kind, keyval, call)
    keyval = int(keyval)
    if keyval in attrs:
        value = attrs.pop(keyval)
        try:
            if key.delete_fn is not None:
                _run(key.delete_fn, call, obj, keyval, value)
        finally:
            _held(keyval, -1)


def copy_attrs(obj, attrs: dict, call: str) -> dict:
    """The attributes a duplicate of ``obj`` gets, by each key's copy callback.

    Raises:
        MPI.Exception (ERR_OTHER): a copy callback raised.
    """
    out: dict = {}
    for keyval, value in list(attrs.items()):
        key = _KEYVALS.get(keyval) if isinstance(keyval, int) else None
        if key is None or key.copy_fn is None or key.copy_fn is False:
            continue
        new = value if key.copy_fn is True else _run(key.copy_fn, call, obj, keyval, value)
        if new is not NotImplemented:
            out[keyval] = new
    for keyval in out:                  # counted once every callback has run
        _held(keyval, 1)
    return out


def free_attrs(obj, attrs: dict, call: str) -> None:
    """Delete every cached value of an object being freed (each key's delete callback).

    Raises:
        MPI.Exception (ERR_OTHER): a callback raised (the other values are deleted first).
    """
    failed = None
    for keyval in [k for k in attrs if isinstance(k, int) and k in _KEYVALS]:
        value = attrs.pop(keyval)
        fn = _KEYVALS[keyval].delete_fn
        try:
            if fn is not None:
                _run(fn, call, obj, keyval, value)
        except Exception as exc:        # noqa: BLE001  (raised once all are deleted)
            failed = failed or exc
        finally:
            _held(keyval, -1)
    if failed is not None:
        raise failed


# datatype -> its attributes; keyed by identity (equal datatypes are distinct handles)
_TYPE_ATTRS: dict[int, dict] = {}


def type_attrs(dt) -> dict:
    """The attribute dict of datatype handle ``dt`` (made on first use)."""
    key = id(dt)
    if key not in _TYPE_ATTRS:
        _TYPE_ATTRS[key] = {}
        weakref.finalize(dt, _forget_type, key)
    return _TYPE_ATTRS[key]


def _forget_type(key: int) -> None:
    """A datatype handle was collected unfreed: its values go (no callbacks, as its
    object is gone) and their keys count them no more."""
    for keyval in _TYPE_ATTRS.pop(key, {}):
        _held(keyval, -1)


def install(classes: dict) -> None:
    """Give the classes of ``classes`` (``{"Comm": Comm, "Datatype": ..., "Win": ...}``)
    ``Create_keyval``/``Free_keyval``, and ``Datatype`` its ``Get_attr``/``Set_attr``/
    ``Delete_attr`` (no predefined keys apply to datatypes)."""
    for kind, cls in classes.items():
        def create(cls, copy_fn=None, delete_fn=None, nopython=False, _kind=kind) -> int:
            return create_keyval(_kind, copy_fn, delete_fn, nopython)

        def free(cls, keyval, _kind=kind) -> int:
            return free_keyval(_kind, keyval)
        create.__doc__ = f"A new key for attributes of {kind} objects (see Set_attr)."
        free.__doc__ = "Free a key made by Create_keyval; returns KEYVAL_INVALID."
        cls.Create_keyval, cls.Free_keyval = classmethod(create), classmethod(free)

    def Get_attr(self, keyval):
        """The attribute stored under ``keyval``, or None."""
        return user_attr("Datatype", type_attrs(self), keyval, "Datatype.Get_attr")

    def Set_attr(self, keyval, attrval) -> None:
        """Cache ``attrval`` under ``keyval`` (a key of ``Datatype.Create_keyval``)."""
        set_attr("Datatype", self, type_attrs(self), keyval, attrval, "Datatype.Set_attr")

    def Delete_attr(self, keyval) -> None:
        """Remove the attribute under ``keyval`` (its delete callback runs)."""
        delete_attr("Datatype", self, type_attrs(self), keyval, "Datatype.Delete_attr")

    datatype = classes["Datatype"]
    for fn in (Get_attr, Set_attr, Delete_attr):
        setattr(datatype, fn.__name__, fn)
