"""The chain of waits (worker/wait_chain.py) in this very process: real threads, a real loopback socket, real locks.
The main thread waits; a timer thread looks as the witness does (``Witness.look``) once the other thread is where
the test wants it (a marker Event it sets just before its wait), never after a fixed sleep alone."""

import concurrent.futures
import queue
import socket
import threading
import time

from worker.wire.contract import Via, WaitKind
from worker.witness import Witness


class Client:
    progress = 0

    def wait(self, report):
        return True


def looked(wait_in_main, ready: threading.Event, then=lambda: None) -> list:
    """Run ``wait_in_main`` on this (the main) thread while another looks at it once ``ready`` is set, then ends its
    wait (``then``)."""
    witness, seen = Witness(Client()), []

    def look():
        ready.wait(30)
        time.sleep(0.2)  # the waiting thread passes from the Event into its own wait
        seen.append(witness.look(1.0))
        then()

    threading.Thread(target=look, daemon=True).start()
    wait_in_main()
    return seen


def test_a_join_on_a_thread_in_a_socket_recv_names_that_thread_and_the_sockets_other_end():
    listener = socket.create_server(("127.0.0.1", 0))
    port, ready = listener.getsockname()[1], threading.Event()

    def upload():
        with socket.create_connection(("127.0.0.1", port)) as s:
            ready.set()
            s.recv(16)

    accepted = []

    def main():
        t = threading.Thread(target=upload, name="upload")
        t.start()
        accepted.append(listener.accept()[0])
        t.join()

    [report] = looked(main, ready, lambda: accepted[0].close())
    assert report.kind == WaitKind.LOCK and report.tid == threading.get_native_id()
    [link] = report.chain
    assert (link.via, link.thread, link.kind, link.peer) == (Via.JOIN, "upload", WaitKind.IO, f"127.0.0.1:{port}")
    assert link.tid is not None and link.tid != report.tid


def socket_waiter(name: str, ready: threading.Event, done: threading.Event) -> threading.Thread:
    """A thread in a recv on a socket pair (a wait outside the process's threads), until ``done``."""
    a, b = socket.socketpair()

    def wait():
        ready.set()
        a.recv(16)
        a.close()

    def end():
        done.wait(30)
        b.close()

    threading.Thread(target=end, daemon=True).start()
    return threading.Thread(target=wait, name=name, daemon=True)


def test_a_queue_fed_by_nobody_named_has_a_thread_waiting_outside_stand_for_its_feeder():
    ready, q, release = threading.Event(), queue.Queue(), threading.Event()
    sleeper_ready = threading.Event()

    def upload():
        ready.wait(30)
        release.wait(30)  # (an Event of its own: not what stands in)
        q.put(True)

    def main():
        sleeper = threading.Thread(target=lambda: (sleeper_ready.set(), time.sleep(2)), name="sleeper", daemon=True)
        sleeper.start()
        sleeper_ready.wait(30)
        outside = socket_waiter("outside", ready, release)
        outside.start()
        threading.Thread(target=upload, name="feeder").start()
        q.get()
        outside.join()
        sleeper.join()  # (no sleeper left to stand in for the next test's waits)

    [report] = looked(main, ready, release.set)
    [link] = report.chain
    assert (link.via, link.thread, link.kind) == (Via.STANDS_IN, "outside", WaitKind.IO)


def test_a_loaders_pin_memory_thread_never_stands_for_an_events_other_end():
    """On a GPU a loader's pin-memory thread ("pt_data_pin") polls the workers' result queue all through training. As
    a waiter outside it stood for the unknown other end of the training thread's Event or Condition wait, so a
    training process blocked there was judged at the phase's bound (10.0 s on the H200) instead of the idle floor."""
    import multiprocessing

    import torch

    ready, release, results = threading.Event(), threading.Event(), multiprocessing.Queue()

    def pin_memory_loop():  # as torch's _pin_memory_loop: its kernel name, then a poll of the workers' results
        torch.multiprocessing._set_thread_name("pt_data_pin")
        while not release.is_set():
            try:
                results.get(timeout=0.1)
            except queue.Empty:
                pass

    def main():
        pin = threading.Thread(target=pin_memory_loop, name="Thread-6 (_pin_memory_loop)", daemon=True)
        pin.start()
        ready.set()
        release.wait(30)  # the training thread's wait on an Event no thread of its own will set
        pin.join()

    [report] = looked(main, ready, release.set)
    assert [link.thread for link in report.chain] == [], report.chain


def test_a_bare_lock_has_neither_a_sleeper_nor_a_waiter_outside_stand_for_its_holder():
    """H200: a training thread blocked on its own lock was judged a wait ("train auto 10.0 s") because a thread that
    polled outside (a loader's pin-memory thread) or slept stood for the lock's holder; only progress stands."""
    ready, release, lock = threading.Event(), threading.Event(), threading.Lock()
    lock.acquire()

    def main():
        sleeper = threading.Thread(target=lambda: release.wait(30) and time.sleep(0.1), name="sleeper", daemon=True)
        sleeper.start()
        outside = socket_waiter("outside", ready, release)
        outside.start()
        lock.acquire(timeout=30)  # released by the look's end below

    def end():
        release.set()
        lock.release()

    [report] = looked(main, ready, end)
    assert report.kind == WaitKind.LOCK and report.chain == (), report.chain


def test_a_futures_result_names_the_executor_thread_that_runs_it():
    ready = threading.Event()

    def main():
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="upload") as pool:
            pool.submit(lambda: (ready.set(), time.sleep(1))).result()

    [report] = looked(main, ready)
    [link] = report.chain
    assert (link.via, link.kind) == (Via.FUTURE, WaitKind.SLEEP) and link.thread.startswith("upload")


def test_a_future_of_a_c_function_given_to_the_executor_is_judged_by_that_function():
    """``pool.submit(time.sleep, 6)``: the executor thread runs no Python frame of the sleep, its innermost is
    ``_WorkItem.run``. Read as "runs code", the chain ended in work by an idle thread, and on an H200 4 of 10 such
    healthy epoch ends were killed at the idle floor. The function it was given says the wait: a sleep, a lock."""
    for fn, args, kind in ((time.sleep, (1,), WaitKind.SLEEP), ("acquire", (), WaitKind.LOCK)):
        ready, lock = threading.Event(), threading.Lock()
        lock.acquire()

        def main():
            with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="upload") as pool:
                pool.submit(ready.set)
                pool.submit(lock.acquire if fn == "acquire" else fn, *args).result()

        [report] = looked(main, ready, lock.release)
        [link] = report.chain
        assert (link.via, link.kind) == (Via.FUTURE, kind), link
        assert link.thread.startswith("upload")


def test_a_join_on_a_thread_blocked_on_a_lock_ends_the_chain_on_that_lock():
    ready, lock = threading.Event(), threading.Lock()

    def main():
        lock.acquire()
        t = threading.Thread(target=lambda: (ready.set(), lock.acquire()), name="upload")
        t.start()
        t.join()

    [report] = looked(main, ready, lock.release)
    [link] = report.chain
    assert (link.via, link.kind, link.function) == (Via.JOIN, WaitKind.LOCK, "acquire")


def test_a_look_along_a_chain_costs_well_under_a_millisecond_of_the_witness_thread():
    """The witness's extra reading, per look (it looks twice a second, only in a stall): printed for the report."""
    witness, done = Witness(Client()), threading.Event()
    t = threading.Thread(target=lambda: done.wait(30), name="upload")
    t.start()
    costs = []

    def bench():
        for _ in range(3):
            began, n = time.perf_counter(), 100
            for _ in range(n):
                witness.look(1.0)
            costs.append((time.perf_counter() - began) / n)
        done.set()

    threading.Thread(target=bench).start()
    t.join()
    print(f"a look along a one-thread chain: {min(costs) * 1e6:.0f} us")
    assert min(costs) < 0.005  # generous on a loaded 2-core VM; measured in the hundreds of microseconds
