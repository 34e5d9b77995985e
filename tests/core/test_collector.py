"""The one garbage-collector policy (core/collector): paused only where the process has one
thread and the collector is on; restored however the block ends; a nested pause leaves it
to the outer one."""

from __future__ import annotations

import gc
import threading

import pytest

from torchless.core.collector import collector_paused, pause_collector


def _alone() -> None:
    if threading.active_count() != 1:
        pytest.skip("another thread is alive in this test process")


def test_paused_and_restored_also_on_error() -> None:
    _alone()
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
        with collector_paused():  # nested: finds it off, leaves it to the outer block
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(KeyError), collector_paused():
        raise KeyError("x")
    assert gc.isenabled()


def test_left_alone_with_another_thread_or_when_off() -> None:
    _alone()
    release = threading.Event()
    other = threading.Thread(target=release.wait)
    other.start()
    try:
        assert pause_collector() is False and gc.isenabled()
    finally:
        release.set()
        other.join()
    gc.disable()
    try:
        assert pause_collector() is False  # off already: the caller's, not ours to turn on
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
