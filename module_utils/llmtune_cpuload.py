# -*- coding: utf-8 -*-
"""CPU time of the host while a benchmark measures: the engine's, the benchmark's own and everything else's.

From /proc/stat (all CPUs, proc(5)), /proc/PID/stat of the engine processes and os.times() of the measuring process.
Another busy process lowers decode speed on a small machine more than any tuning changes it (measured on 2 vCPUs,
3-4x slower decode), so every measuring module records the split and marks a measurement that other processes or
the hypervisor (steal time) disturbed as noisy.
"""

from __future__ import annotations

import os
import time

# Steal time above this percent of all CPU time marks a level noisy: the hypervisor ran other guests on our CPUs.
STEAL_LIMIT_PERCENT = 5.0
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def stat_fields(pid, proc="/proc"):
    """The fields of PROC/PID/stat after the command name (proc(5): state first, then ppid, pgrp, ...); None when the
    process is gone or the file unreadable. The name, in parentheses, may hold spaces and parentheses itself."""
    try:
        with open(f"{proc}/{pid}/stat", encoding="ascii", errors="replace") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields or None


def _own_and_reaped_ticks(pid):
    """utime + stime + cutime + cstime of process PID, all its threads and its reaped children (fields 14-17 of
    /proc/PID/stat, proc(5)); None when it is gone or unreadable."""
    fields = stat_fields(pid)
    try:
        return sum(int(field) for field in fields[11:15]) if fields else None
    except ValueError:
        return None


def _children(pid, proc="/proc"):
    """Live child PIDs of process PID (/proc/PID/task/TID/children of each thread, proc(5))."""
    out = []
    try:
        tasks = os.listdir(f"{proc}/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"{proc}/{pid}/task/{tid}/children", encoding="ascii") as handle:
                out += [int(child) for child in handle.read().split()]
        except (OSError, ValueError):
            continue
    return out


def process_tree(pid, proc="/proc"):
    """PID and its live descendants, PID first (PROC: where procfs is): an engine may run its model in child processes
    (vLLM's engine core and worker), whose CPU time and memory the engine's own figures leave out."""
    tree, todo = [pid], _children(pid, proc)
    while todo:
        child = todo.pop()
        if child not in tree:
            tree.append(child)
            todo += _children(child, proc)
    return tree


def kib_field(path, name):
    """The kB value of the line NAME: of a /proc file (/proc/meminfo, /proc/PID/status, proc(5)); None if absent."""
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key == name:
                    return int(value.split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return None


def tree_kib(pid, name, proc="/proc"):
    """The kB field NAME of /proc/PID/status (VmRSS, VmHWM) summed over PID's process tree; None when PID is gone."""
    own = kib_field(f"{proc}/{pid}/status", name)
    if own is None:
        return None
    return own + sum(kib_field(f"{proc}/{child}/status", name) or 0 for child in process_tree(pid, proc)[1:])


def memory_short(main_pid, margin_mb, proc="/proc", what="the twin"):
    """Message when MemAvailable cannot hold the service's VmRSS (its process tree's: vLLM's model lives in a child
    process) again plus MARGIN_MB, for WHAT (a second copy of the engine) beside it; else None.

    No running service (MAIN_PID 0 or gone) needs no room beside it."""
    rss = tree_kib(main_pid, "VmRSS", proc) if main_pid else None
    available = kib_field(f"{proc}/meminfo", "MemAvailable")
    if rss is None or available is None or available >= rss + margin_mb * 1024:
        return None
    return (f"not enough memory for {what} beside the service: VmRSS {rss // 1024} MiB + margin {margin_mb} MiB "
            f"> MemAvailable {available // 1024} MiB")


def process_cpu_s(pid):
    """CPU seconds of process PID and its descendants (process_tree); one that ended counts in its parent's cutime
    and cstime once reaped. None when PID is gone or unreadable."""
    tree = process_tree(pid)
    own = _own_and_reaped_ticks(pid)
    if own is None:
        return None
    return (own + sum(_own_and_reaped_ticks(child) or 0 for child in tree[1:])) / CLOCK_TICKS


def cpu_sample(pids):
    """CPU counters now: host busy and steal seconds (/proc/stat), engine and own CPU seconds.

    /proc/stat's first line sums all CPUs in clock ticks: user nice system idle iowait irq softirq steal
    (guest time is already inside user, proc(5)). The engine's CPU time sums the processes PIDS (a
    service and its twin); None when there are none or one is gone.
    """
    with open("/proc/stat", encoding="ascii") as handle:
        ticks = [int(x) for x in handle.readline().split()[1:9]]
    ticks += [0] * (8 - len(ticks))
    engines = [process_cpu_s(pid) for pid in pids]
    engine = sum(engines) if engines and None not in engines else None
    own = os.times()
    return {"wall": time.monotonic(), "busy": (sum(ticks) - ticks[3] - ticks[4] - ticks[7]) / CLOCK_TICKS,
            "steal": ticks[7], "total": sum(ticks), "engine": engine, "own": own.user + own.system}


def cpu_split(before, after):
    """CPUs busy between two cpu_sample()s: engine, benchmark, other (the rest) and steal percent."""
    wall = max(after["wall"] - before["wall"], 1e-9)
    engine = (after["engine"] - before["engine"]) / wall if None not in (before["engine"], after["engine"]) else None
    own = (after["own"] - before["own"]) / wall
    busy = (after["busy"] - before["busy"]) / wall
    return {"engine": round(engine, 3) if engine is not None else None, "benchmark": round(own, 3),
            "other": round(max(0.0, busy - (engine or 0.0) - own), 3),
            "steal_percent": round(100.0 * (after["steal"] - before["steal"]) / max(after["total"] - before["total"], 1), 2)}


def is_noisy(split, busy_limit):
    """True when other processes or the hypervisor took CPU time that the measurement needed."""
    return split["other"] > busy_limit or split["steal_percent"] > STEAL_LIMIT_PERCENT
