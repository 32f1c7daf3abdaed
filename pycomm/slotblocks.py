"""Which block of the shared-memory collective area a communicator's slots use.

Every rank's segment holds :data:`pycomm.shmcoll.MAX_COMMS` blocks of collective slots;
a communicator uses the same block ``b`` in the area of each of its members. Block 0 is
``COMM_WORLD``'s. Context ids are never reused (they only grow, :mod:`pycomm.groups`),
so the blocks are handed out on their own, after MPICH's context-id mask
(``src/mpi/comm/contextid.c``: a bit per id, the free ones agreed by a bitwise AND over
the members in ``MPIR_Get_contextid_sparse_group``, the lowest common one taken, and given
back by ``MPIR_Free_contextid`` when the communicator is freed):

* **At creation** each process of the parent gives its mask of free blocks with its
  ``next_cid`` (one Allgather, :meth:`pycomm.groups.GroupMethods._new_cid`); each new
  communicator takes the lowest block free in all its members' masks (:func:`choose`),
  or none (-1: its calls go by messages) when 64 are alive.
* **At Free**, which is local as MPI_Comm_free is in MPICH, the block cannot be free at
  once: a peer slower in the communicator's last call may still be reading this rank's
  header or data there, and a communicator given the block next would overwrite them
  (a call reading another communicator's slot: a wrong result, or a hang). So the rank
  sets bit ``b`` of its ``freed blocks`` control word, where every peer on the host can
  read it (:meth:`transports.shm.ShmTransport.control_words`), and keeps the block
  pending. At its next creation (:func:`free_mask`) it takes back each pending block
  whose members all show bit ``b``: each of them has freed the communicator after its
  last call returned, so no read of the block is left. It clears the block's headers
  (:func:`pycomm.shmcoll.clear_block`), as a fresh area is, and the block is free. A
  member that never frees the communicator keeps the block from being reused, which is
  what happened to every block before.
* A communicator whose members do not all share this host's shared memory never has
  slots; its block is free again at once.

A rank clears its bit ``b`` when it takes the block again: a peer that has not yet taken
back its own block ``b`` then waits for this rank's next Free of it, which errs on the
side of keeping a block.
"""

from __future__ import annotations

from .shmcoll import MAX_COMMS, NO_SLOTS, SharedSlots, clear_block, host_shm

__all__ = ["ALL_FREE", "choose", "free_mask", "give_back", "take"]

ALL_FREE = ((1 << MAX_COMMS) - 1) & ~1      # every block but COMM_WORLD's
_FREED = 3                                  # the control word of freed blocks


class _Blocks:
    """One process's blocks: ``free`` (bit b: block b free here) and ``pending`` (block ->
    ``(transport, the other members' world ranks, whether this rank wrote the block)`` of
    a freed communicator whose members have not all freed it yet)."""

    def __init__(self):
        self.free = ALL_FREE
        self.pending: dict[int, tuple] = {}


def _blocks(engine) -> _Blocks:
    blocks = getattr(engine, "slot_blocks", None)
    if blocks is None:
        blocks = engine.slot_blocks = _Blocks()
    return blocks


def free_mask(engine) -> int:
    """This process's mask of free blocks for a creation, after taking back every pending
    block whose members have all freed their communicator (see the module docstring)."""
    blocks = _blocks(engine)
    for b, (shm, others, wrote) in list(blocks.pending.items()):
        bit = 1 << b
        if all(shm.control_words(w)[_FREED] & bit for w in others):
            me = engine.rank
            if wrote:
                clear_block(shm, me, b)
            words = shm.control_words(me)
            words[NO_SLOTS] &= ~bit         # a no-room mark of the old communicator
            del blocks.pending[b]
            blocks.free |= bit
    return blocks.free


def choose(masks) -> int:
    """The lowest block free in every mask of ``masks`` (the members'), -1 for none."""
    common = ALL_FREE
    for m in masks:
        common &= int(m)
    return (common & -common).bit_length() - 1 if common else -1


def take(comm, block: int) -> None:
    """Record that ``comm``, new, uses ``block`` (-1: none) on this rank."""
    if block < 0:
        return
    _blocks(comm._engine).free &= ~(1 << block)
    shm = host_shm(comm)
    if shm is not None:
        shm.control_words(comm._world[comm.rank])[_FREED] &= ~(1 << block)


def give_back(comm) -> None:
    """``comm`` is freed on this rank: its block is free at once where its members do not
    all share this host's shared memory (it never had slots), else pending until every
    member has freed it too (see the module docstring)."""
    block = comm._block
    if block <= 0:                          # none, or COMM_WORLD's
        return
    blocks = _blocks(comm._engine)
    shm = host_shm(comm)
    if shm is None:
        blocks.free |= 1 << block
        return
    me = comm._world[comm.rank]
    shm.control_words(me)[_FREED] |= 1 << block
    blocks.pending[block] = (shm, [w for w in comm._world if w != me],
                             isinstance(comm._slots, SharedSlots))
