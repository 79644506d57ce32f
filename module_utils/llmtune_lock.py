# -*- coding: utf-8 -*-
"""One benchmark of a host at a time: an exclusive flock(2) held from a benchmark's first request to its last.

A benchmark whose ``ansible-playbook`` was killed goes on to its end on the host (over SSH without a terminal nothing
signals it), and a rerun started meanwhile would share the engine with it, so its figures would measure two
workloads. Every measuring module of the project (inference_benchmark, engine_batched_bench) holds this lock.
"""

from __future__ import annotations

import fcntl
import os
import time

class LockError(Exception):
    """The lock cannot be taken; the message is one line for the task output."""


def hold_lock(path, timeout):
    """Take an exclusive flock(2) on PATH, waiting at most TIMEOUT s for another benchmark to release it.

    Returns (the open file, which holds the lock until closed, or None for an empty PATH; seconds waited). Writes
    this process's PID into the file. Raises LockError when the lock is still held after TIMEOUT s, or when
    PATH cannot be opened.
    """
    if not path:
        return None, 0.0
    start = time.monotonic()
    try:
        folder = os.path.dirname(path) or "."
        if not os.path.isdir(folder):
            os.makedirs(folder, mode=0o700)
        lock = os.fdopen(os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600), "r+", encoding="ascii")
    except OSError as error:
        raise LockError(f"cannot open the benchmark lock {path}: {error}") from error
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() - start >= timeout:
                lock.seek(0)
                holder = lock.read().strip() or "unknown"
                lock.close()
                raise LockError(f"another benchmark (PID {holder}) still holds {path} after {timeout:g} s: "
                                "figures taken beside it would not hold") from None
            time.sleep(0.5)
    lock.seek(0)
    lock.truncate()
    lock.write(f"{os.getpid()}\n")
    lock.flush()
    return lock, round(time.monotonic() - start, 1)
