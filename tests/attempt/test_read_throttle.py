"""The read throttle on a real pipe and a real selector: a pipe read a moment ago is not watched, however much waits
in it, until its interval has passed; a forgotten one never comes back."""

import math
import os
import selectors
import time

from supervisor.attempt.read_throttle import ReadThrottle


def test_a_rested_pipe_is_not_selected_until_its_interval_has_passed_then_comes_back_with_its_callback():
    selector = selectors.DefaultSelector()
    throttle = ReadThrottle(selector, interval=0.2)
    r, w = os.pipe()
    try:
        def callback(_fd):
            pass

        selector.register(r, selectors.EVENT_READ, callback)
        os.write(w, b"step 1/3\n")
        assert [key.fd for key, _ in selector.select(0)] == [r]
        assert throttle.next_wake() == math.inf
        rested = time.monotonic()
        throttle.rest(r, callback)
        assert rested <= throttle.next_wake() - 0.2 <= time.monotonic()
        throttle.wake_due()  # too early: it stays out
        assert selector.select(0) == []
        time.sleep(max(0.0, throttle.next_wake() - time.monotonic()))
        throttle.wake_due()
        assert [(key.fd, key.data) for key, _ in selector.select(0)] == [(r, callback)]
        assert throttle.next_wake() == math.inf
    finally:
        selector.close()
        os.close(r)
        os.close(w)


def test_a_forgotten_pipe_neither_rests_nor_is_watched_and_an_unwatched_one_is_not_rested():
    selector = selectors.DefaultSelector()
    throttle = ReadThrottle(selector, interval=0.0)
    r, w = os.pipe()
    try:
        selector.register(r, selectors.EVENT_READ, None)
        throttle.rest(r, None)
        throttle.forget(r)
        throttle.wake_due()
        assert r not in selector.get_map() and throttle.next_wake() == math.inf
        throttle.rest(r, None)  # no longer watched (it ended): nothing to bring back
        throttle.wake_due()
        assert r not in selector.get_map()
        selector.register(r, selectors.EVENT_READ, None)
        throttle.forget(r)
        assert r not in selector.get_map()
    finally:
        selector.close()
        os.close(r)
        os.close(w)
