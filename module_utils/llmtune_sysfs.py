# -*- coding: utf-8 -*-
"""Readers and parsers for Linux sysfs and procfs files, shared by every module of this project.

Each kernel interface is parsed here once; the topology module, the tuning roles' modules and the drift
check all call these functions, so a parsing fix lands everywhere at once.

All readers take a ``sysroot`` (str, a directory; ``/`` for the live system) and a path relative to it,
as ``lscpu --sysroot`` does, so unit tests run on fixture trees copied from real machines.
"""

from __future__ import annotations

import os


def sysroot_path(sysroot, path):
    """Return ``path`` (absolute, e.g. ``/sys/kernel/mm``) placed under ``sysroot`` (str)."""
    return os.path.join(sysroot or "/", path.lstrip("/"))


def read_text(sysroot, path, default=None):
    """Return the stripped text of a sysfs/procfs file, or ``default`` when it is absent or unreadable.

    Missing files are normal (optional kernel interfaces); an ``OSError`` such as EACCES or EIO on a
    sysfs attribute means the same to the caller: the value is not known.
    """
    try:
        with open(sysroot_path(sysroot, path), encoding="utf-8", errors="replace") as handle:
            return handle.read().strip()
    except OSError:
        return default


def parse_cpu_list(text):
    """Parse a kernel cpulist such as ``0-3,8,10-11`` into a sorted list of ints.

    Format: Documentation/admin-guide/cputopology.rst and ``man 7 cpuset`` ("List format"), also used by
    ``Cpus_allowed_list`` and cgroup ``cpuset.cpus``. Strides (``0-7:2``) are not produced for CPU lists.
    An empty string gives ``[]``. Raises ``ValueError`` on anything else.
    """
    cpus = set()
    for part in (text or "").strip().split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            low, high = part.split("-", 1)
            cpus.update(range(int(low), int(high) + 1))
        else:
            cpus.add(int(part))
    return sorted(cpus)


def format_cpu_list(cpus):
    """Format CPU ids (iterable of int) as a compact kernel cpulist, e.g. ``[0, 1, 2, 5]`` -> ``0-2,5``."""
    ordered = sorted(set(cpus))
    ranges = []
    for cpu in ordered:
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ",".join(str(a) if a == b else "%d-%d" % (a, b) for a, b in ranges)


def parse_bracketed(text):
    """Parse a sysfs choice file such as THP ``enabled`` (``always [madvise] never``).

    Returns ``(selected, choices)``: the bracketed word (``None`` when none is bracketed) and every
    choice in kernel order. Source: Documentation/admin-guide/mm/transhuge.rst.
    """
    selected = None
    choices = []
    for word in (text or "").split():
        if word.startswith("[") and word.endswith("]"):
            word = word[1:-1]
            selected = word
        choices.append(word)
    return selected, choices


def parse_proc_swaps(text):
    """Parse ``/proc/swaps`` into a list of dicts, one per active swap area, in kernel order.

    Keys: ``filename`` (str, device or file; the kernel escapes spaces as ``\\040``, decoded here),
    ``type`` (``partition``/``file``), ``size_kb`` and ``used_kb`` (int, KiB), ``priority`` (int).
    Source: ``man 5 proc`` (/proc/swaps), mm/swapfile.c ``swap_show``. The header line is skipped.
    Raises ``ValueError`` on a malformed numeric field.
    """
    areas = []
    for line in (text or "").splitlines()[1:]:
        fields = line.split()
        if len(fields) < 5:
            continue
        areas.append({
            "filename": fields[0].replace("\\040", " "),
            "type": fields[1],
            "size_kb": int(fields[2]),
            "used_kb": int(fields[3]),
            "priority": int(fields[4]),
        })
    return areas


def parse_meminfo(text):
    """Parse ``/proc/meminfo`` into ``{field: KiB}`` (int), e.g. ``{"MemAvailable": 1234567, ...}``.

    Source: Documentation/filesystems/proc.rst (meminfo). Values without a unit (HugePages_Total)
    are kept as plain counts. Lines that do not parse are skipped.
    """
    info = {}
    for line in (text or "").splitlines():
        name, sep, rest = line.partition(":")
        fields = rest.split()
        if sep and fields and fields[0].isdigit():
            info[name.strip()] = int(fields[0])
    return info


FSTAB_SWAP_MARK = "#llmtune# "


def is_fstab_swap_line(line):
    """Return True when an ``/etc/fstab`` line is an active swap entry.

    Fields are separated by any run of spaces or tabs (``man 5 fstab``); an entry is swap when its third
    field (fs_vfstype) is ``swap``. Comments, blank lines and lines with fewer than three fields are not.
    """
    fields = line.split()
    return len(fields) >= 3 and not fields[0].startswith("#") and fields[2] == "swap"


def comment_fstab_swap(text):
    """Comment out every swap entry of an ``/etc/fstab`` text, leaving every other byte as it was.

    Returns ``(new_text, commented)``: the new text and the list of original swap lines (without
    newline). Each swap line is prefixed with ``FSTAB_SWAP_MARK`` so a rollback can find it; lines are
    never deleted or re-spaced. Text already commented is left alone, so a second call changes nothing.
    """
    out = []
    commented = []
    for line in (text or "").splitlines(True):
        body = line.rstrip("\r\n")
        if is_fstab_swap_line(body):
            commented.append(body)
            line = FSTAB_SWAP_MARK + line
        out.append(line)
    return "".join(out), commented


def parse_word_list(text):
    """Split a space-separated sysfs list such as ``scaling_available_governors`` into a list of str.

    Used for cpufreq ``scaling_available_governors`` and ``energy_performance_available_preferences``
    (Documentation/admin-guide/pm/cpufreq.rst, intel_pstate.rst). Empty or ``None`` gives ``[]``.
    """
    return (text or "").split()


def read_cpuidle_states(sysroot, cpu=0):
    """Read the cpuidle states of one CPU from ``/sys/devices/system/cpu/cpuN/cpuidle/stateK/``.

    Returns a list of dicts in index order: ``index`` (int, the K of stateK; it differs between drivers
    and CPU models, so callers select states by ``name`` and ``latency_us``), ``name`` (str, e.g.
    ``POLL``, ``C1E``, ``C6``), ``desc`` (str), ``latency_us`` (int, exit latency in microseconds),
    ``residency_us`` (int, target residency in microseconds), ``disabled`` (bool, the ``disable``
    attribute). Source: Documentation/admin-guide/pm/cpuidle.rst ("Representation of Idle States").
    Returns ``[]`` when the CPU has no cpuidle directory (no cpuidle driver, e.g. many VMs).
    """
    base = "/sys/devices/system/cpu/cpu%d/cpuidle" % cpu
    try:
        names = os.listdir(sysroot_path(sysroot, base))
    except OSError:
        return []
    states = []
    for entry in names:
        if not (entry.startswith("state") and entry[5:].isdigit()):
            continue
        path = "%s/%s" % (base, entry)
        states.append({
            "index": int(entry[5:]),
            "name": read_text(sysroot, path + "/name", ""),
            "desc": read_text(sysroot, path + "/desc", ""),
            "latency_us": int(read_text(sysroot, path + "/latency", "0") or 0),
            "residency_us": int(read_text(sysroot, path + "/residency", "0") or 0),
            "disabled": read_text(sysroot, path + "/disable", "0") == "1",
        })
    return sorted(states, key=lambda state: state["index"])


def kernel_value(raw):
    """Return ``(value, choices)`` of a sysfs/procfs file's text, as a tuning role compares it.

    Choice files that bracket the selected word (THP ``always [madvise] never``) give that word and the
    listed choices; any other file gives its text with runs of white space collapsed and ``[]``
    (``/proc/sys/vm/swappiness`` ``60``). Used by ``kernel_setting`` to decide whether to write, and by
    the drift check and the rollback to read the same value back, so all three agree.
    """
    selected, choices = parse_bracketed(raw)
    if selected is None:
        return " ".join((raw or "").split()), []
    return selected, choices


def has_capability(status_text, bit):
    """Return True when capability number ``bit`` (int, ``man 7 capabilities``) is in ``CapEff``.

    ``status_text`` is the text of ``/proc/self/status`` (``CapEff:`` is a hex mask; Documentation/
    filesystems/proc.rst). Returns None when the line is missing (not Linux, or an unreadable file).
    """
    for line in (status_text or "").splitlines():
        name, _sep, value = line.partition(":")
        if name == "CapEff":
            return bool(int(value.strip(), 16) >> bit & 1)
    return None
