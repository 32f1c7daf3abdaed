"""The launcher's output forwarding: one thread per rank and stream copies the rank's pipe
to the launcher's own ``sys.stdout`` / ``sys.stderr``.

Lines are never torn: a rank's line reaches the output in one write, under one lock per
stream, so the lines of different ranks interleave but never mix; the launcher's own lines
(:func:`say`) take the same lock. Two modes:

* **prefixed** (``launch.py`` by default): every line becomes ``[rank] line``; a last line
  without a newline is passed on, with one, when the rank closes the pipe (or when it
  grows past 64 KiB);
* **plain** (``--no-prefix``, and the default of ``--mpi4py``, as ``mpiexec``): the bytes
  are passed on unchanged; a partial line (a prompt, a ``\\r`` progress bar) is passed on
  as soon as the rank has written nothing more for :data:`PARTIAL_FLUSH_S` seconds.
"""

from __future__ import annotations

import os
import select
import sys
import threading
from typing import ClassVar

__all__ = ["PARTIAL_FLUSH_S", "Forwarder", "say"]

PARTIAL_FLUSH_S = 0.05      # seconds a partial line waits for its newline (plain mode)
_CHUNK = 65536              # bytes read at a time, and the longest line held back


class Forwarder(threading.Thread):
    """Copies one rank's pipe to ``sys.<stream>`` whole lines at a time.

    Args:
        pipe: the read end (a file object with ``fileno()``), closed when the rank closes
            its end.
        rank: the rank whose output this is (the prefix ``[rank] ``).
        stream: ``"stdout"`` or ``"stderr"``.
        prefix: prefix each line with ``[rank] `` (else pass the bytes on unchanged).
    """

    locks: ClassVar[dict[str, threading.Lock]] = {"stdout": threading.Lock(),
                                                   "stderr": threading.Lock()}

    def __init__(self, pipe, rank: int, stream: str, prefix: bool = True):
        super().__init__(name=f"pycomm-forward-{rank}-{stream}", daemon=True)
        self.pipe, self.stream = pipe, stream
        self.prefix = f"[{rank}] ".encode() if prefix else b""
        self.plain = not prefix

    def _write(self, data: bytes) -> None:
        with self.locks[self.stream]:
            out = getattr(sys, self.stream)
            try:
                out.flush()
                if hasattr(out, "buffer"):
                    out.buffer.write(data)
                    out.buffer.flush()
                else:
                    out.write(data.decode(errors="replace"))
                    out.flush()
            except (OSError, ValueError):
                pass  # our own stdout is gone; keep draining so the rank never blocks

    def _lines(self, lines: list[bytes]) -> bytes:
        return b"".join(self.prefix + line + b"\n" for line in lines)

    def run(self) -> None:
        fd, partial = self.pipe.fileno(), b""
        poller = select.poll()
        poller.register(fd, select.POLLIN | select.POLLHUP)
        try:
            while True:
                if self.plain and partial and not poller.poll(PARTIAL_FLUSH_S * 1000):
                    self._write(partial)        # a prompt or progress bar: show it now
                    partial = b""
                    continue
                chunk = os.read(fd, _CHUNK)
                if not chunk:
                    break
                *lines, partial = (partial + chunk).split(b"\n")
                if lines:
                    self._write(self._lines(lines))
                if len(partial) > _CHUNK:  # a very long line without newline: pass it on
                    self._write(partial if self.plain else self.prefix + partial + b"\n")
                    partial = b""
        except OSError:
            pass
        finally:
            if partial:
                self._write(partial if self.plain else self.prefix + partial + b"\n")
            self.pipe.close()


def say(text: str, stream: str = "stderr") -> None:
    """Write the launcher's own line ``text`` (and a newline) to ``sys.<stream>`` in one
    write, under the lock the forwarders take: it never lands inside a rank's line. A
    ``print`` writes the text and the newline apart, and a rank's line forwarded between
    the two joined the launcher's (seen under load: the rank's line then read as the
    launcher's, and an empty line followed)."""
    with Forwarder.locks[stream]:
        out = getattr(sys, stream)
        try:
            out.write(text + "\n")
            out.flush()
        except (OSError, ValueError):
            pass  # our own output is gone
