"""cqrs.collector: pausing the cycle collector around allocation-heavy calls."""

from __future__ import annotations

import gc
import threading

from cqrs.collector import paused


def test_nested_and_concurrent_pauses_enable_the_collector_once_the_last_ends() -> None:
    assert gc.isenabled()
    entered, release = threading.Event(), threading.Event()

    def other() -> None:
        with paused():
            entered.set()
            release.wait(5)

    thread = threading.Thread(target=other)
    with paused():
        assert not gc.isenabled()
        thread.start()
        assert entered.wait(5)
        with paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert not gc.isenabled()  # the other thread's block still runs
    release.set()
    thread.join(5)
    assert gc.isenabled()


def test_a_collector_disabled_before_stays_disabled() -> None:
    gc.disable()
    try:
        with paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_an_error_in_the_block_still_enables_the_collector() -> None:
    try:
        with paused():
            raise KeyError("boom")
    except KeyError:
        pass
    assert gc.isenabled()
