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


def process_cpu_s(pid):
    """utime + stime of process PID in seconds, all its threads (fields 14 and 15 of /proc/PID/stat, proc(5));
    None when it is gone or unreadable."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    except (OSError, IndexError, ValueError):
        return None


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
