"""A native thread that spins on a core without the GIL, named as ROCm 7's HIP runtime thread (``AsyncEventsLoop``,
ROCm/TheRock #7051: it spins for ever after the first kernel launch): what a training process on such a runtime has
beside its training thread, made on any machine. A few lines of C compiled with the system's compiler (cached under
the temporary directory by the source's hash) and started through ctypes, so no Python frame, no GIL, no witness.

Used by the benchmarks (bench/threads_night.py) and the tests; from a supervised script or an Ultralytics callback::

    from bench.native_spin import spinning_native_thread
    stop = spinning_native_thread()   # spinning now, one core
    ...
    stop()                            # joins it
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Callable

NAME = "AsyncEventsLoop"  # the HIP runtime's thread (/proc/PID/task/TID/comm), at most 15 characters

SOURCE = r"""
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>

struct spin { pthread_t thread; volatile int stop; };

static void *spin(void *arg) {
    struct spin *s = arg;
    unsigned long n = 0;
    while (!s->stop) n++;  /* a busy loop on one core: no syscall, no sleep */
    return (void *)n;
}

void *spin_start(const char *name) {
    struct spin *s = calloc(1, sizeof *s);
    if (!s || pthread_create(&s->thread, NULL, spin, s)) { free(s); return NULL; }
    pthread_setname_np(s->thread, name);
    return s;
}

void spin_stop(void *p) {
    struct spin *s = p;
    s->stop = 1;
    pthread_join(s->thread, NULL);
    free(s);
}
"""


def library() -> Path:
    """The compiled helper, made once per source under the temporary directory (``cc`` or ``$CC``)."""
    digest = hashlib.sha256(SOURCE.encode()).hexdigest()[:16]
    out = Path(tempfile.gettempdir()) / f"yolo-train-native-spin-{digest}.so"
    if out.exists():
        return out
    src = out.with_suffix(".c")
    src.write_text(SOURCE)
    partial = out.with_name(f"{out.name}.{os.getpid()}")  # (another process may compile it at the same time)
    subprocess.run([os.environ.get("CC", "cc"), "-O1", "-shared", "-fPIC", "-pthread", "-o", str(partial), str(src)],
                   check=True, capture_output=True)
    os.replace(partial, out)
    return out


def spinning_native_thread(name: str = NAME) -> Callable[[], None]:
    """Start a native thread spinning without the GIL, named ``name``; returns its stop (which joins it)."""
    lib = ctypes.CDLL(str(library()))
    lib.spin_start.restype, lib.spin_start.argtypes = ctypes.c_void_p, [ctypes.c_char_p]
    lib.spin_stop.restype, lib.spin_stop.argtypes = None, [ctypes.c_void_p]
    handle = lib.spin_start(name.encode()[:15])
    if not handle:
        raise OSError(f"could not start the spinning thread {name!r} (pthread_create failed)")
    stopped = False

    def stop() -> None:
        nonlocal stopped
        if not stopped:
            stopped = True
            lib.spin_stop(handle)
    return stop
