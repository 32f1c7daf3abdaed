"""The p2p engine's wire protocol: its frame kinds and how their headers are packed.

Every frame a :class:`pycomm.p2p.Engine` sends is a header, a msgpack list whose first
item is the frame kind, and for EAGER and DATA a payload:

======== ====================================== ==========================================
kind      header                                 meaning
======== ====================================== ==========================================
EAGER    [0, ctx, tag(, code, count)] + payload  the whole message (<= eager limit)
RTS      [1, ctx, tag, nbytes, sid, desc(,       request to send a large message
         code, count)]
CTS      [2, sid, rid, nbytes]                   receiver matched it: stream the first
                                                 nbytes (all, or what fits) into rid
DATA     [3, rid]               + payload        the large message, landing in place
FIN      [4, sid]                                receiver copied it one-sidedly: sender done
CANCEL   [5, sid]                                sender withdraws its RTS (a Send that timed
                                                 out, or Request.Cancel on a pending send)
NAK      [6, rid]                                answer to a CTS for a withdrawn message
ABORT    [7, ctx, tag, mismatch, text,           the sender abandoned collective call ``tag``
         next_text]                              (and ``tag + 1`` too unless next_text is nil)
======== ====================================== ==========================================

Collective messages carry the signature of the sender's call (``code, count``: see
:mod:`pycomm.signature`); point-to-point messages carry none. EAGER is sent by the
engine (:mod:`pycomm.p2p`) and matched where it arrives (:mod:`pycomm.matching`), RTS to
NAK are the rendezvous protocol (:mod:`pycomm.rendezvous`), ABORT abandons a collective
call (:mod:`pycomm.aborts`).

Point-to-point eager headers depend only on (context, tag): the engine packs each once
(``_EAGER_HEADERS``) and parses each once (``_HEADERS``); both caches are bounded and start
again when full.
"""

from __future__ import annotations

import msgpack

__all__ = ["EAGER", "RTS", "CTS", "DATA", "FIN", "CANCEL", "NAK", "ABORT"]

EAGER, RTS, CTS, DATA, FIN, CANCEL, NAK, ABORT = 0, 1, 2, 3, 4, 5, 6, 7
# One Packer for every header: msgpack.packb builds a new Packer per call, which doubles the
# cost of a small message's header. Packer.pack runs without releasing the GIL and resets
# its buffer on error, so the progress thread may share it.
_pack = msgpack.Packer().pack
_unpack = msgpack.unpackb


# Eager headers depend only on (context, tag): pack each once, parse each once.
_EAGER_HEADERS: dict[tuple[int, int], bytes] = {}
_HEADERS: dict[bytes, list] = {}


def _eager_header(ctx: int, tag: int) -> bytes:
    hdr = _pack((EAGER, ctx, tag))
    if len(_EAGER_HEADERS) > 4096:
        _EAGER_HEADERS.clear()
    _EAGER_HEADERS[(ctx, tag)] = hdr
    return hdr
