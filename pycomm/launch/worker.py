"""One rank of a :class:`pycomm.launch.spawning.Pool`: ``python -m pycomm.launch.worker`` (not public).

Started by the pool with the launcher's environment contract. It connects to the job's
store, initialises the world communicator once (``pycomm.init()``), reports that as the
outcome of task 0, then runs tasks until told to exit. The protocol, all through the
authenticated store (see :mod:`pycomm.launch.spawning` for the parent's side)::

    pool/syspath          msgpack list of the parent's sys.path (read once, at start)
    pool/task/<seq>       b"T" + cloudpickle((fn, args))   run fn(*args)
                          b"X"                              exit
    pool/done/<seq>/<rank>  the outcome of rank <rank>: cloudpickle((rank, "ok", value)) or
                          cloudpickle((rank, "err", exc_type, message, traceback_text))

Tasks are numbered 1, 2, ... in the order the parent sets them; every rank runs every task.
Task 0 is start-up: its outcome says whether ``pycomm.init()`` succeeded. The parent takes
(reads and deletes) the outcomes and deletes ``pool/task/<seq>`` once all are in.
"""

from __future__ import annotations

import os
import sys
import traceback

import cloudpickle
import msgpack

from pycomm import config
from pycomm.errors import CommTimeoutError
from pycomm.launch.store_client import StoreClient

FLUSH_S = 10.0  # seconds a finished task may spend handing over held-back frames
IDLE_POLL_S = 30.0  # seconds one store wait for the next task may take before re-asking


def _outcome(rank: int, exc: BaseException | None = None, value: object = None) -> bytes:
    if exc is None:
        try:
            return cloudpickle.dumps((rank, "ok", value))
        except Exception as pickling_exc:  # noqa: BLE001 - reported to the parent instead
            exc = TypeError(f"the return value of rank {rank} ({type(value).__name__}) "
                            f"cannot be pickled: {pickling_exc}")
    frames = exc.__traceback__
    if frames is not None and frames.tb_frame.f_code is main.__code__:
        frames = frames.tb_next  # start the traceback at the user's code, not ours
    tb = "".join(traceback.format_exception(type(exc), exc, frames))
    return cloudpickle.dumps((rank, "err", type(exc).__qualname__, str(exc), tb))


def _flush(pycomm) -> None:
    """Before idling until the next task, let frames held back by flow control (a FIN a
    peer's Send waits for) leave: nothing drives this rank's progress while it idles."""
    try:
        pycomm.COMM_WORLD._engine.flush(FLUSH_S)
    except Exception:  # noqa: BLE001 - a dead peer is reported by the next task
        pass


def _finish(client: StoreClient, rank: int, seq: int, payload: bytes,
            last: bool = False) -> None:
    # Unanswered unless the rank exits next (then the store has it before the rank is
    # gone): a set of a valid key cannot be refused, and a rank woken once per task, not
    # twice, is quicker on a busy machine.
    client.set(f"pool/done/{seq}/{rank}", payload, answer=last)


def _next_task(client: StoreClient, seq: int, parent: int | None) -> bytes:
    while True:
        try:
            return client.get(f"pool/task/{seq}", timeout=IDLE_POLL_S)
        except CommTimeoutError:
            if parent is not None and os.getppid() != parent:
                raise SystemExit(f"pycomm.launch.worker: the pool's process {parent} is gone")


def main() -> int:
    """Serve tasks until the exit task; return the process exit code."""
    rank = config.get("PYCOMM_RANK")
    timeout = config.get("PYCOMM_TIMEOUT")
    client = StoreClient(config.get("PYCOMM_MASTER_ADDR"), config.get("PYCOMM_MASTER_PORT"),
                         config.get("PYCOMM_JOB_TOKEN"), timeout=timeout)
    try:
        for path in msgpack.unpackb(client.get("pool/syspath"), raw=False):
            if path not in sys.path:
                sys.path.append(path)
        try:
            import pycomm
            pycomm.init()
        except BaseException as exc:  # noqa: BLE001 - the parent re-raises it
            _finish(client, rank, 0, _outcome(rank, exc), last=True)
            return 1
        _finish(client, rank, 0, _outcome(rank))
        # the process this worker is a child of: the pool's launcher, or its fork server
        # (pycomm.launch.forkserver), which dies with it
        parent = os.getppid() if config.get("PYCOMM_LAUNCHER_PID") is not None else None
        seq = 0
        while True:
            seq += 1
            task = _next_task(client, seq, parent)
            if task[:1] != b"T":
                break
            try:
                fn, args = cloudpickle.loads(task[1:])
                del task
                payload = _outcome(rank, value=fn(*args))
            except BaseException as exc:  # noqa: BLE001 - SystemExit too: the parent decides
                payload = _outcome(rank, exc)
            _flush(pycomm)
            _finish(client, rank, seq, payload)
        finalize = getattr(pycomm, "finalize", None)
        if callable(finalize):
            finalize()
        return 0
    finally:
        client.close()


if __name__ == "__main__":
    sys.exit(main())
