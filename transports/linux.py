"""The two Linux system calls the shared-memory transport makes through ctypes.

``futex`` (FUTEX_WAIT / FUTEX_WAKE on a 32-bit word of a shared mapping): a rank with
nothing to do sleeps on its doorbell and whoever gives it work wakes it.
``process_vm_readv`` (cross-memory attach, as MPICH's and Open MPI's CMA paths): the
receiver of a large message reads the sender's buffer directly, one copy.
"""

from __future__ import annotations

import ctypes
import platform

__all__ = ["futex_wait", "futex_wake", "read_remote"]

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
_SYS_FUTEX = {"x86_64": 202, "aarch64": 98, "arm64": 98}.get(platform.machine(), 202)
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _IOVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


_process_vm_readv = _libc.process_vm_readv
_process_vm_readv.restype = ctypes.c_ssize_t
_process_vm_readv.argtypes = [ctypes.c_int, ctypes.POINTER(_IOVec), ctypes.c_ulong,
                              ctypes.POINTER(_IOVec), ctypes.c_ulong, ctypes.c_ulong]


def futex_wake(addr: ctypes.c_void_p) -> None:
    """Wake every thread sleeping on the 32-bit word at ``addr``."""
    _syscall(_SYS_FUTEX, addr, _FUTEX_WAKE, 0x7FFFFFFF, None, None, 0)


def futex_wait(addr: ctypes.c_void_p, expected: int, timeout: float) -> None:
    """Sleep while the word at ``addr`` equals ``expected``, at most ``timeout`` seconds
    (returns at once if it differs; wake-ups may be spurious: re-check after)."""
    ts = _Timespec(int(timeout), int((timeout % 1.0) * 1e9))
    _syscall(_SYS_FUTEX, addr, _FUTEX_WAIT, ctypes.c_uint(expected), ctypes.byref(ts),
             None, 0)


def read_remote(pid: int, local: int, remote: int, nbytes: int) -> int:
    """Copy ``nbytes`` from address ``remote`` of process ``pid`` to address ``local`` of
    this one; return the bytes copied (may be fewer), or -1 with ``ctypes.get_errno()``
    set (e.g. EPERM where ptrace restrictions refuse it, ESRCH when ``pid`` is gone)."""
    lv, rv = _IOVec(local, nbytes), _IOVec(remote, nbytes)
    return _process_vm_readv(pid, ctypes.byref(lv), 1, ctypes.byref(rv), 1, 0)
