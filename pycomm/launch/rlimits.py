"""The open-files limit of a launcher and of its ranks.

A launcher holds two pipes per rank (its output and errors); a rank holds a socket per
peer it reaches over TCP, its store and control sockets, and the segment of each peer on
its host (:mod:`transports.shmring`). The usual soft limit, 1024 files, is far below the
usual hard one, so a job of a few hundred ranks ran out of descriptors with an
``OSError`` from deep inside the launcher. :func:`raise_open_files_limit` lifts the soft
limit to the hard one, as Go's runtime and the JVM do for every process they start;
:func:`out_of_files` is the error where even that is not enough.
"""

from __future__ import annotations

import errno

__all__ = ["out_of_files", "raise_open_files_limit"]

# The soft limit asked for where the hard limit is unlimited (Linux's default fs.nr_open).
_UNLIMITED_TARGET = 1 << 20


def raise_open_files_limit() -> int | None:
    """Lift this process's soft limit on open files to its hard limit (children inherit
    it); return the soft limit now in force, None where it cannot be read (not POSIX)."""
    try:
        import resource
    except ImportError:
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _UNLIMITED_TARGET if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):   # (a target past fs.nr_open): keep what there is
            pass
    return soft


def out_of_files(exc: BaseException) -> bool:
    """Whether ``exc`` is the system's "too many open files" (this process's or the
    system's table)."""
    return isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE)
