"""The suite's own arrangement under pytest-xdist (tests/conftest.py): every test in its
group, so that each shared world's pool starts in one worker only."""

from __future__ import annotations

import os


def _under_xdist() -> bool:
    return bool(os.environ.get("PYTEST_XDIST_WORKER"))


def test_a_test_without_a_world_runs_with_its_file(request):
    """xdist appends the group to the node id. (Under pytest 9.2 it no longer can,
    pytest-xdist issue 1386: the tests spread over the workers one by one, every pool
    was started again and again, and the suite took 7:55 instead of about 5:40; the test
    extra keeps pytest below 9.2.)"""
    if _under_xdist():
        assert request.node.nodeid.endswith("@test_suite_groups.py")
    else:
        assert "@" not in request.node.nodeid


def test_a_test_of_a_shared_world_runs_with_that_world(request, world):
    """(The world's pool is not started: a World makes it on first use.)"""
    if _under_xdist():
        name = "-".join([f"n{world.size}", world.transport])
        assert request.node.nodeid.endswith("@world-" + name)
    else:
        assert "@" not in request.node.nodeid
