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


def test_a_queue_fed_by_nobody_named_has_a_thread_waiting_outside_stand_for_its_feeder():
    ready, q = threading.Event(), queue.Queue()

    release = threading.Event()

    def upload():
        ready.set()
        release.wait(30)  # (an Event of its own: not what stands in)
        q.put(True)

    def main():
        sleeper = threading.Thread(target=lambda: (ready.wait(30), time.sleep(2)), name="sleeper", daemon=True)
        sleeper.start()
        threading.Thread(target=upload, name="feeder").start()
        q.get()
        sleeper.join()  # (no sleeper left to stand in for the next test's waits)

    [report] = looked(main, ready, release.set)
    [link] = report.chain
    assert (link.via, link.thread, link.kind) == (Via.STANDS_IN, "sleeper", WaitKind.SLEEP)


def test_a_futures_result_names_the_executor_thread_that_runs_it():
    ready = threading.Event()

    def main():
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="upload") as pool:
            pool.submit(lambda: (ready.set(), time.sleep(1))).result()

    [report] = looked(main, ready)
    [link] = report.chain
    assert (link.via, link.kind) == (Via.FUTURE, WaitKind.SLEEP) and link.thread.startswith("upload")


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
