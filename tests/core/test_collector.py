"""The one garbage-collector policy (core/collector): paused only where the process has one
thread and the collector is on; restored however the block ends; a nested pause leaves it
to the outer one. Run in a fresh interpreter, where no other thread is alive (a test
process may have a pool's threads)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

_CHECKS = textwrap.dedent("""
    import gc, threading
    from torchless.core.collector import (
        collector_paused, importing, own_process, pause_collector)

    assert threading.active_count() == 1 and gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
        with collector_paused():  # nested: finds it off, leaves it to the outer block
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    try:
        with collector_paused():
            raise KeyError("x")
    except KeyError:
        pass
    assert gc.isenabled()

    with importing():  # a program's own heap: paused, never frozen
        assert not gc.isenabled()
    assert gc.isenabled() and gc.get_freeze_count() == 0
    own_process()  # python -m torchless: what the imports made is frozen after them
    with importing():
        assert not gc.isenabled()
    assert gc.isenabled() and gc.get_freeze_count() > 0

    release = threading.Event()
    other = threading.Thread(target=release.wait)
    other.start()
    assert pause_collector() is False and gc.isenabled()  # another thread: left alone
    release.set()
    other.join()

    gc.disable()
    assert pause_collector() is False  # off already: the caller's, not ours to turn on
    with collector_paused():
        pass
    assert not gc.isenabled()
    print("ok")
""")


def test_collector_policy_in_a_fresh_process() -> None:
    done = subprocess.run([sys.executable, "-c", _CHECKS], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
