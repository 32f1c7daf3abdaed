"""pycomm.errors.add_note: PEP 678's add_note where Python has it (3.11+), and on 3.10,
which pyproject admits, the note kept in ``__notes__`` and in the text a traceback shows."""

from __future__ import annotations

import sys
import types

from pycomm.errors import CommError, add_note


def test_add_note_keeps_the_note_where_a_traceback_shows_it():
    err = CommError("rank 0: it failed")
    add_note(err, "a note")
    assert err.__notes__ == ["a note"]
    if sys.version_info >= (3, 11):     # PEP 678: the traceback prints __notes__
        assert str(err) == "rank 0: it failed"
    else:                               # 3.10 prints no notes: the text carries it
        assert str(err) == "rank 0: it failed\na note"
    # Python 3.10 (no add_note): the note kept as 3.11 keeps it and added to the text
    old = types.SimpleNamespace(args=("rank 1: it failed", 7))
    add_note(old, "first")
    add_note(old, "second")
    assert old.__notes__ == ["first", "second"]
    assert old.args == ("rank 1: it failed\nfirst\nsecond", 7)
