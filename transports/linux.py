"""The Linux system calls the transports make through ctypes.

``futex`` (FUTEX_WAIT / FUTEX_WAKE on a 32-bit word of a shared mapping): a rank with
nothing to do sleeps on its doorbell and whoever gives it work wakes it.
``process_vm_readv`` / ``process_vm_writev`` (cross-memory attach, as MPICH's and Open
MPI's CMA paths): the receiver of a large message reads the sender's buffer directly, one
copy (shared memory), and the emulated NIC reads and writes registered regions of its
peers' processes.
"""

from __future__ import annotations

import ctypes
import errno
import platform

__all__ = ["allow_reads_by_peers", "futex_wait", "futex_wake", "copy_remote"]

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
_SYS_FUTEX = {"x86_64": 202, "aarch64": 98, "arm64": 98}.get(platform.machine(), 202)
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1
_PR_SET_PTRACER, _PR_SET_PTRACER_ANY = 0x59616D61, ctypes.c_ulong(-1)   # linux/prctl.h


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _IOVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


_byref = ctypes.byref
_vm = {}
for _name in ("process_vm_readv", "process_vm_writev"):
    _f = getattr(_libc, _name)
    _f.restype = ctypes.c_ssize_t
    _f.argtypes = [ctypes.c_int, ctypes.POINTER(_IOVec), ctypes.c_ulong,
                   ctypes.POINTER(_IOVec), ctypes.c_ulong, ctypes.c_ulong]
    _vm[_name] = _f


def futex_wake(addr: ctypes.c_void_p) -> None:
    """Wake every thread sleeping on the 32-bit word at ``addr``."""
    _syscall(_SYS_FUTEX, addr, _FUTEX_WAKE, 0x7FFFFFFF, None, None, 0)


def futex_wait(addr: ctypes.c_void_p, expected: int, timeout: float) -> None:
    """Sleep while the word at ``addr`` equals ``expected``, at most ``timeout`` seconds
    (returns at once if it differs; wake-ups may be spurious: re-check after)."""
    ts = _Timespec(int(timeout), int((timeout % 1.0) * 1e9))
    _syscall(_SYS_FUTEX, addr, _FUTEX_WAIT, ctypes.c_uint(expected), ctypes.byref(ts),
             None, 0)


def copy_remote(write: bool, pid: int, local: list, remote: list) -> int:
    """Copy between this process's and process ``pid``'s memory, scatter-gather.

    Args:
        write: True writes ``local`` into ``remote`` (``process_vm_writev``), False reads.
        pid: the other process.
        local, remote: ``(address, length)`` lists of the same total length.

    Returns:
        0, or the errno of the failed call.
    """
    fn = _vm["process_vm_writev" if write else "process_vm_readv"]
    if len(local) == 1 and len(remote) == 1:
        # one range each (every direct read of pycomm.shmdirect, paid per read): two
        # structs passed by reference, not two arrays built through _skip
        (at, total), (there, _) = local[0], remote[0]
        done = 0
        while done < total:
            n = fn(pid, _byref(_IOVec(at + done, total - done)), 1,
                   _byref(_IOVec(there + done, total - done)), 1, 0)
            if n <= 0:
                return ctypes.get_errno() or errno.EIO
            done += n
        return 0
    total = sum(n for _, n in local)
    done = 0
    while done < total:
        lo, ro = _skip(local, done), _skip(remote, done)
        la = (_IOVec * len(lo))(*[_IOVec(a, n) for a, n in lo])
        ra = (_IOVec * len(ro))(*[_IOVec(a, n) for a, n in ro])
        n = fn(pid, la, len(lo), ra, len(ro), 0)
        if n <= 0:
            return ctypes.get_errno() or errno.EIO
        done += n
    return 0


def _skip(iovs: list, n: int) -> list:
    """``iovs`` past their first ``n`` bytes, at most IOV_MAX (1024) entries."""
    out = []
    for a, ln in iovs:
        if n >= ln:
            n -= ln
            continue
        out.append((a + n, ln - n))
        n = 0
    return out[:1024]


def allow_reads_by_peers() -> bool:
    """Let this user's other processes read this one's memory with ``process_vm_readv``
    under Yama's ``ptrace_scope`` 1 (Ubuntu's and Fedora's default), which otherwise
    allows it only to an ancestor: ranks are siblings. ``prctl(PR_SET_PTRACER,
    PR_SET_PTRACER_ANY)``, as Open MPI's cross-memory attach does for its ranks; scope 0
    allows it anyway, scopes 2 and 3 still refuse. Returns whether the kernel took it
    (False without Yama, which then does not restrict)."""
    return _libc.prctl(_PR_SET_PTRACER, _PR_SET_PTRACER_ANY, 0, 0, 0) == 0
