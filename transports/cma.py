"""Single-copy reads (and writes) of a peer's memory on the same host: Linux cross-memory
attach.

The shared-memory transport's rendezvous and :mod:`pycomm.shmdirect`'s collectives read a
peer's buffer with one ``process_vm_readv`` instead of streaming it through a ring (two
copies), as MPICH's and Open MPI's CMA paths do. Whether the kernel allows it (same user,
ptrace rules: ``/proc/sys/kernel/yama/ptrace_scope``, whose default scope 1 each rank
lifts for its peers, :func:`transports.linux.allow_reads_by_peers`) is probed once per
peer at connect time: each rank publishes the address and value of 16 random bytes, and
its peers read them back.

An exposed buffer carries a validity word (:class:`transports.base.ExposureFlags`): a
read copies the word, the buffer and the word again in one scatter-gather call, and is
valid only if both copies hold the exposure's token, so a buffer withdrawn before or
while it is read is an error, never silently wrong data.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct

from .base import ExposureFlags, PeerLostError, RemoteAccessError, TransportError
from .linux import allow_reads_by_peers, copy_remote
from .shmring import address_of

__all__ = ["CrossMemory"]


class CrossMemory:
    """One rank's cross-memory reads of its same-host peers (see the module docstring).

    Args:
        enabled: False turns the single-copy path off (every :meth:`can_read` is False).
    """

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        if enabled:                         # before the peers probe this rank
            allow_reads_by_peers()
        self._pids: dict[int, int] = {}
        self._ok: dict[int, bool] = {}
        self._probes: dict[int, int] = {}     # peer -> address of its probe bytes
        self._probe = ctypes.create_string_buffer(os.urandom(16), 16)
        self._flags = ExposureFlags()
        self._words = ctypes.create_string_buffer(16)   # the two copies of a validity word

    def published(self) -> dict:
        """What peers need to probe this rank (merged into its connect record)."""
        return {"pid": os.getpid(), "probe": ctypes.addressof(self._probe),
                "probe_value": self._probe.raw}

    def admit(self, peer: int, info: dict) -> bool:
        """Record peer ``peer`` from its connect record ``info`` (:meth:`published`'s
        keys) and probe it: whether this rank may read its memory."""
        self._pids[peer] = info["pid"]
        ok = False
        if self.enabled:
            buf = ctypes.create_string_buffer(16)
            err = copy_remote(False, info["pid"], [(ctypes.addressof(buf), 16)],
                              [(info["probe"], 16)])
            ok = not err and buf.raw == info["probe_value"]
        self._ok[peer] = ok
        self._probes[peer] = info["probe"]
        return ok

    def can_read(self, peer: int) -> bool:
        """Whether cross-memory attach towards ``peer`` worked when probed at connect."""
        return self._ok.get(peer, False)

    def expose(self, view: memoryview) -> list | None:
        """``[address, word address, token]`` of ``view`` for a peer's :meth:`read`, or
        None for an empty buffer."""
        if not len(view):
            return None
        return [address_of(view), *self._flags.acquire()]

    def release(self, desc: list) -> None:
        """Clear the buffer's validity word: a read from now on, or one in flight, fails."""
        self._flags.retire(desc[1])

    def _check(self, peer: int) -> int:
        if not self._ok.get(peer):
            raise TransportError(f"cross-memory attach to rank {peer} is not available")
        return self._pids[peer]

    def read(self, peer: int, desc: list, nbytes: int, dest: memoryview) -> None:
        """Copy ``nbytes`` of ``peer``'s exposed buffer ``desc`` (:meth:`expose`) into
        ``dest``: one scatter-gather ``process_vm_readv`` of the validity word, the buffer
        and the word again; both copies must hold the exposure's token.

        Raises:
            RemoteAccessError: the buffer was withdrawn (or freed) before or during the copy.
            PeerLostError: the peer's process is gone.
            TransportError: cross-memory attach is not available towards ``peer``.
        """
        pid = self._check(peer)
        address, word, token = desc
        words = ctypes.addressof(self._words)
        err = copy_remote(False, pid, [(words, 8), (address_of(dest), nbytes), (words + 8, 8)],
                          [(word, 8), (address, nbytes), (word, 8)])
        if err == errno.ESRCH:
            raise PeerLostError(peer, "process is gone (process_vm_readv: ESRCH)")
        if err:
            raise RemoteAccessError(f"rank {peer}'s buffer of {nbytes} bytes could not be "
                                    f"read ({os.strerror(err)}): withdrawn or freed")
        first, second = struct.unpack("<qq", self._words.raw)
        if first != token or second != token:
            raise RemoteAccessError(f"rank {peer} withdrew its buffer of {nbytes} bytes "
                                    "before or while it was read")

    def read_live(self, peer: int, address: int, dest: int, nbytes: int) -> None:
        """Copy ``nbytes`` at ``address`` in ``peer``'s memory to ``dest`` in this process's,
        with no validity word: for a caller that knows the buffer stays in place until it
        is told this read is done (:mod:`pycomm.shmdirect`: the peer waits).

        Raises:
            PeerLostError: the peer's process is gone.
            RemoteAccessError: the range is not mapped in the peer (the caller's promise
                was broken).
            TransportError: cross-memory attach is not available towards ``peer``.
        """
        err = copy_remote(False, self._check(peer), [(dest, nbytes)], [(address, nbytes)])
        if err == errno.ESRCH:
            raise PeerLostError(peer, "process is gone (process_vm_readv: ESRCH)")
        if err:
            raise RemoteAccessError(f"{nbytes} bytes at {address:#x} in rank {peer} could "
                                    f"not be read ({os.strerror(err)})")


    def write_live(self, peer: int, src: int, address: int, nbytes: int) -> None:
        """Copy ``nbytes`` at ``src`` in this process's memory to ``address`` in ``peer``'s,
        for a caller that knows the peer's buffer stays in place and is its to write until
        the peer is told the write is done (:func:`pycomm.shmdirect.direct_bcast`: the peer
        waits, and waits out a write in flight before it gives its buffer back).

        Raises:
            PeerLostError: the peer's process is gone.
            RemoteAccessError: the range is not mapped writable in the peer.
            TransportError: cross-memory attach is not available towards ``peer``.
        """
        err = copy_remote(True, self._check(peer), [(src, nbytes)], [(address, nbytes)])
        if err == errno.ESRCH:
            raise PeerLostError(peer, "process is gone (process_vm_writev: ESRCH)")
        if err:
            raise RemoteAccessError(f"{nbytes} bytes at {address:#x} in rank {peer} could "
                                    f"not be written ({os.strerror(err)})")

    def alive(self, peer: int) -> bool:
        """Whether ``peer``'s process still has its memory (a read of its probe bytes does
        not fail with ``ESRCH``): one that has none can no longer read or write another's."""
        buf = ctypes.create_string_buffer(16)
        err = copy_remote(False, self._check(peer), [(ctypes.addressof(buf), 16)],
                          [(self._probes[peer], 16)])
        return err != errno.ESRCH
