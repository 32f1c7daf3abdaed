"""Every public method and property of the API classes documents its contract.

Walks the public (not underscore) methods and properties of :class:`pycomm.Communicator`
(with those it inherits from its mixins), :class:`pycomm.Request`, :class:`pycomm.Status`
and :class:`pycomm.Op`, and asserts that each docstring has a one-line summary followed by
a blank line, an ``Args:`` section naming every parameter (when there is one besides
``self``/``cls``) and no parameter that does not exist, a ``Returns:`` section and a
``Raises:`` section whose entries are exception classes that exist (or ``Nothing``). A new
method without them fails here. Data attributes (``__slots__``) are documented in their
class docstring and are not walked. No ranks are started.
"""

from __future__ import annotations

import builtins
import inspect
import re

import pytest

import pycomm
from pycomm import errors

CLASSES = (pycomm.Communicator, pycomm.Request, pycomm.Status, pycomm.Op)

_SECTION = re.compile(r"^\s*(Args|Arguments|Returns|Yields|Raises|Attributes|Note|Notes|"
                      r"Example|Examples):\s*$")


def _members():
    """``(id, function, drops_first_parameter)`` of every public method and property."""
    out = []
    for cls in CLASSES:
        for name in sorted(dir(cls)):
            if name.startswith("_"):
                continue
            raw = inspect.getattr_static(cls, name)
            if isinstance(raw, property):
                fn, bound = raw.fget, True
            elif isinstance(raw, staticmethod):
                fn, bound = raw.__func__, False
            elif isinstance(raw, classmethod):
                fn, bound = raw.__func__, True
            elif inspect.isfunction(raw):
                fn, bound = raw, True
            else:
                continue                # a data attribute (slot)
            out.append((f"{cls.__name__}.{name}", fn, bound))
    return out


MEMBERS = _members()


def _sections(doc: str) -> dict[str, list[str]]:
    """Section name -> its lines (without the header); ``""``: the text before any."""
    lines = inspect.cleandoc(doc).splitlines()
    out: dict[str, list[str]] = {"": []}
    current = ""
    for line in lines:
        m = _SECTION.match(line)
        if m:
            current = m.group(1)
            out[current] = []
        else:
            out[current].append(line)
    return out


def _entries(lines: list[str]) -> list[str]:
    """The keys (text before the first colon) of a section's entries: its least-indented
    non-blank lines."""
    body = [ln for ln in lines if ln.strip()]
    if not body:
        return []
    indent = min(len(ln) - len(ln.lstrip()) for ln in body)
    return [ln.strip().split(":", 1)[0] for ln in body
            if len(ln) - len(ln.lstrip()) == indent and ":" in ln]


def _params(fn, bound: bool) -> list[str]:
    """The parameter names as an Args section writes them (``*args``, ``**kw``)."""
    params = list(inspect.signature(fn).parameters.values())
    if bound:
        params = params[1:]
    prefix = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}
    return [prefix.get(p.kind, "") + p.name for p in params]


def _is_exception(name: str) -> bool:
    cls = getattr(errors, name, None) or getattr(builtins, name, None)
    return isinstance(cls, type) and issubclass(cls, BaseException)


def test_the_walk_finds_the_api():
    names = {m[0] for m in MEMBERS}
    # one of each kind: own method, mixin methods, property, staticmethod, classmethod
    for name in ("Communicator.Allreduce", "Communicator.bcast", "Communicator.Gatherv",
                 "Communicator.Iallreduce", "Communicator.Split", "Communicator.group",
                 "Request.Waitall", "Status.Get_count", "Op.Create", "Op.is_commutative"):
        assert name in names
    assert len(MEMBERS) > 90


@pytest.mark.parametrize("name,fn,bound", MEMBERS, ids=[m[0] for m in MEMBERS])
def test_docstring_gives_summary_args_returns_raises(name, fn, bound):
    doc = fn.__doc__
    assert doc and doc.strip(), f"{name} has no docstring"
    lines = inspect.cleandoc(doc).splitlines()
    assert lines[0].strip(), f"{name}: the docstring must start with its summary line"
    assert len(lines) == 1 or not lines[1].strip(), \
        f"{name}: the summary must be one line, followed by a blank line"
    sections = _sections(doc)
    missing = [s for s in ("Returns", "Raises") if s not in sections]
    params = _params(fn, bound)
    if params and "Args" not in sections:
        missing.insert(0, "Args")
    assert not missing, f"{name}: no {', '.join(s + ':' for s in missing)} section"
    for s in ("Args", "Returns", "Raises"):
        if s in sections:
            assert any(ln.strip() for ln in sections[s]), f"{name}: empty {s}: section"
    if "Args" in sections:
        named = {n.strip() for key in _entries(sections["Args"]) for n in key.split(",")}
        undocumented = [p for p in params if p not in named]
        assert not undocumented, f"{name}: Args: does not describe {undocumented}"
        stale = sorted(named - set(params))
        assert not stale, f"{name}: Args: describes {stale}, which it does not take"
    if "Raises" in sections:
        for key in _entries(sections["Raises"]):
            for exc in (n.strip() for n in key.split(",")):
                assert exc == "Nothing" or _is_exception(exc), \
                    f"{name}: Raises: {exc!r} is not an exception class of pycomm.errors " \
                    "or builtins (write 'Nothing.' when it raises none)"
