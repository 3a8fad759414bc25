"""Handles (``ringtrain.engine.handle``): results, errors, and completing many at once."""

import threading

import pytest

from ringtrain.engine.handle import GroupHandle, Handle, complete_all


def test_complete_all_sets_each_result_and_skips_absent_handles():
    handles = [Handle("a"), None, Handle("c")]
    complete_all(handles, ["ra", "rb", "rc"])
    assert [handles[0].wait(), handles[2].wait()] == ["ra", "rc"]
    assert GroupHandle([handles[0], handles[2]]).wait() == ["ra", "rc"]


def test_complete_all_refuses_results_that_do_not_match_the_handles():
    with pytest.raises(ValueError):
        complete_all([Handle("a")], [])


def test_a_waiter_woken_by_the_first_handle_finds_every_other_done():
    handles = [Handle(f"t{i}") for i in range(50)]
    seen = {}
    waiting = threading.Event()

    def waiter():
        waiting.set()
        handles[0].wait()
        seen["done"] = [h.done() for h in handles]  # all set before any was released
        seen["results"] = [h.wait() for h in handles]

    thread = threading.Thread(target=waiter)
    thread.start()
    waiting.wait(5)
    complete_all(handles, list(range(50)))
    thread.join(5)
    assert seen["done"] == [True] * 50
    assert seen["results"] == list(range(50))


def test_a_failed_handle_raises_its_error():
    handle = Handle("a")
    handle.fail(KeyError("x"))
    assert handle.done()
    with pytest.raises(KeyError):
        handle.wait()
