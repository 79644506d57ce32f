# -*- coding: utf-8 -*-
"""Which sysctl.d file wins at boot: the order systemd-sysctl applies them in, and who overrides ours.

Source: sysctl.d(5) (systemd 252), "CONFIGURATION DIRECTORIES AND PRECEDENCE": files ``*.conf`` are read
from ``/etc/sysctl.d``, ``/run/sysctl.d``, ``/usr/local/lib/sysctl.d``, ``/usr/lib/sysctl.d`` (and
``/lib/sysctl.d`` on split-usr systems); a file masks a file of the same name in a later directory (a
symlink to ``/dev/null`` masks it for good); all files are then applied sorted by file name, whatever
their directory, so for the same key the file with the latest name wins. systemd-sysctl does not read
``/etc/sysctl.conf`` itself: Debian, Ubuntu, Fedora and RHEL link it as ``/etc/sysctl.d/99-sysctl.conf``.
``sysctl --system`` (procps, sysctl(8) "SYSTEM FILE PRECEDENCE") reads the same files in the same order
and ``/etc/sysctl.conf`` once more, last; it counts here too, because an operator or a package script
that runs it would bring the other value back until the next boot.

Line format (sysctl.d(5) "CONFIGURATION FORMAT"): ``key = value``; empty lines and lines starting with
``#`` or ``;`` are ignored; a leading ``-`` only silences errors; keys use ``.`` or ``/`` as separator.
A glob key never applies to a key that an explicit assignment sets, so for the explicit keys we write
only explicit assignments can override us.

All functions take a ``sysroot`` (``/`` for the live system), as the readers in llmtune_sysfs do.
"""

from __future__ import annotations

import os

from ansible.module_utils.llmtune_sysfs import sysroot_path

SYSCTL_DIRS = ("/etc/sysctl.d", "/run/sysctl.d", "/usr/local/lib/sysctl.d", "/usr/lib/sysctl.d", "/lib/sysctl.d")
SYSCTL_CONF = "/etc/sysctl.conf"
SYSTEMD = "systemd-sysctl"
PROCPS = "sysctl --system"
# Prefix of the assignments we comment out, so that a reader (and a rollback) can tell them apart.
COMMENT_MARK = "#llmtune# "
GLOB_CHARS = "*?["


def key_path(key):
    """Return a sysctl key (str) in its ``/proc/sys`` path form, for comparison.

    sysctl.d(5): when the first separator is ``/`` the key is a path already; when it is ``.``, dots and
    slashes are interchanged (``net.ipv4.conf.enp3s0/200.forwarding`` is
    ``net/ipv4/conf/enp3s0.200/forwarding``).
    """
    key = key.strip()
    first = min((i for i in (key.find("."), key.find("/")) if i >= 0), default=-1)
    if first < 0 or key[first] == "/":
        return key
    return key.translate(str.maketrans("./", "/."))


def parse_sysctl_text(text):
    """Parse the text of a sysctl.d file into its assignments, in file order.

    Returns a list of dicts: ``line`` (int, 1-based), ``key`` (str, as written, without a leading ``-``),
    ``path`` (str, :func:`key_path` of it), ``value`` (str, white space runs collapsed, as the kernel
    parses numbers), ``text`` (str, the line). Comments, blank lines and ``-key`` glob exclusions
    (no ``=``) are left out.
    """
    result = []
    for number, line in enumerate((text or "").splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped[0] in "#;" or "=" not in stripped:
            continue
        key, _, value = stripped.partition("=")
        key = key.strip().lstrip("-").strip()
        result.append({"line": number, "key": key, "path": key_path(key), "value": " ".join(value.split()),
                       "text": line})
    return result


def resolve(sysroot, path):
    """Follow the symlinks of ``path`` (absolute, as seen on the host) inside ``sysroot``.

    Returns the final path as seen on the host (``/dev/null`` for a masked file), or None for a dangling
    link or a loop (more than 40 links, as the kernel's ELOOP limit).
    """
    for _ in range(40):
        full = sysroot_path(sysroot, path)
        if not os.path.islink(full):
            return path if os.path.exists(full) or path == "/dev/null" else None
        target = os.readlink(full)
        path = os.path.normpath(target if target.startswith("/") else os.path.join(os.path.dirname(path), target))
    return None


def sysctl_order(sysroot):
    """Return the files systemd-sysctl applies at boot in its order, then ``/etc/sysctl.conf`` for procps.

    Each file is a dict: ``name`` (file name), ``path`` (where it was found, host view), ``real`` (the
    file its symlinks lead to, host view; ``/dev/null`` when masked; None when dangling) and ``reader``
    (:data:`SYSTEMD`, or :data:`PROCPS` for the trailing ``/etc/sysctl.conf``). Hidden names and
    directories are skipped, as systemd's conf-files.c does.
    """
    found = {}
    for directory in SYSCTL_DIRS:
        try:
            entries = os.listdir(sysroot_path(sysroot, directory))
        except OSError:
            continue
        for entry in entries:
            path = "%s/%s" % (directory, entry)
            if (entry.endswith(".conf") and not entry.startswith(".") and entry not in found
                    and not os.path.isdir(sysroot_path(sysroot, path))):
                found[entry] = path
    files = [{"name": name, "path": found[name], "real": resolve(sysroot, found[name]), "reader": SYSTEMD}
             for name in sorted(found)]
    if os.path.exists(sysroot_path(sysroot, SYSCTL_CONF)):
        files.append({"name": os.path.basename(SYSCTL_CONF), "path": SYSCTL_CONF,
                      "real": resolve(sysroot, SYSCTL_CONF), "reader": PROCPS})
    return files


def read_assignments(sysroot, sysctl_file):
    """Assignments of one file of :func:`sysctl_order` (a masked, dangling or unreadable file has none)."""
    if sysctl_file["real"] in (None, "/dev/null"):
        return []
    try:
        with open(sysroot_path(sysroot, sysctl_file["real"]), encoding="utf-8", errors="replace") as handle:
            return parse_sysctl_text(handle.read())
    except OSError:
        return []


def overriding_assignments(sysroot, ours, settings):
    """Find the assignments applied after the file ``ours`` that give one of ``settings`` another value.

    ``ours`` is our file's path in ``/etc/sysctl.d`` (host view; it need not exist yet, its name places
    it); ``settings`` maps keys (either separator) to the values we write. A file is applied after ours
    when systemd-sysctl sorts its name after ours, or when it is the ``/etc/sysctl.conf`` that
    ``sysctl --system`` reads last. Returns a list of dicts: those of :func:`parse_sysctl_text` plus
    ``file`` (where the file was found), ``real`` (the file to edit) and ``reader``, and ``wanted``
    (our value), in the order they are applied. Globs are skipped: they never apply to an explicit key.
    """
    name = os.path.basename(ours)
    wanted = {key_path(key): " ".join(str(value).split()) for key, value in settings.items()}
    result = []
    for sysctl_file in sysctl_order(sysroot):
        if sysctl_file["reader"] == SYSTEMD and sysctl_file["name"] <= name:
            continue
        for assignment in read_assignments(sysroot, sysctl_file):
            if (assignment["path"] in wanted and not any(char in assignment["key"] for char in GLOB_CHARS)
                    and assignment["value"] != wanted[assignment["path"]]):
                result.append(dict(assignment, file=sysctl_file["path"], real=sysctl_file["real"],
                                   reader=sysctl_file["reader"], wanted=wanted[assignment["path"]]))
    return result


def comment_lines(text, numbers):
    """Return ``text`` with the lines ``numbers`` (1-based ints) prefixed by :data:`COMMENT_MARK`.

    Every other byte is kept; a line already commented is left as it is, so a second call changes nothing.
    """
    lines = (text or "").splitlines(True)
    for number in numbers:
        if not lines[number - 1].lstrip().startswith(("#", ";")):
            lines[number - 1] = COMMENT_MARK + lines[number - 1]
    return "".join(lines)


def describe(assignment):
    """One line for a report: ``file:line: text (applied after ours by <reader>)``."""
    return "%s:%d: %s (applied after ours by %s)" % (assignment["file"], assignment["line"],
                                                     assignment["text"].strip(), assignment["reader"])
