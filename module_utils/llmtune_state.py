# -*- coding: utf-8 -*-
"""The llmtune state file: original values and file backups recorded once, before the first change.

Layout of ``/var/lib/llmtune/state.json`` (JSON object)::

    {"version": 1,
     "settings": {"thp.enabled": {"original": "always [madvise] never", "recorded": "2026-01-01T00:00:00Z",
                                  "kernel_path": "/sys/kernel/mm/transparent_hugepage/enabled"}},
     "files": {"/etc/fstab": {"existed": true, "backup": "/var/lib/llmtune/backup/etc/fstab",
                              "recorded": "..."}},
     "packages": {"nginx": {"recorded": "..."}}}

Keys of ``settings`` are dotted ``<role>.<setting>``. An entry is never overwritten: the first value
recorded is the one a rollback restores. Backups live in ``backup/`` next to the state file, under the
file's absolute path, in folders readable by root only. ``packages`` are the ones this project installed (absent
before its first install of them), which a rollback removes. Writes are atomic and durable: a temporary file in the
same folder is fsynced, renamed over the old one, then the folder is fsynced (rename(2), fsync(2): without the last
two steps a power loss right after a run can leave the old file or an empty one).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time

DEFAULT_STATE_PATH = "/var/lib/llmtune/state.json"


def _now():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def load_state(path):
    """Return the state dict stored at ``path`` (str), or an empty state when the file does not exist.

    Raises ``ValueError`` when the file exists but is not a JSON object (a damaged state must not be
    silently replaced, it holds the only copy of the original values).
    """
    try:
        with open(path, encoding="utf-8") as handle:
            state = json.load(handle)
    except FileNotFoundError:
        state = {}
    if not isinstance(state, dict):
        raise ValueError("%s is not a JSON object" % path)
    state.setdefault("version", 1)
    state.setdefault("settings", {})
    state.setdefault("files", {})
    state.setdefault("packages", {})
    return state


def sync_path(path):
    """fsync(2) the file or folder at ``path`` (str): its data, or for a folder its entries (a rename in it).

    Raises ``OSError`` as ``os.open``/``os.fsync`` do.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path, data, mode=0o644):
    """Replace ``path`` (str) with ``data`` (str, UTF-8, or bytes) atomically and durably.

    A new file gets ``mode`` (int); an existing one keeps its mode and owner. The temporary file lives in the same
    folder (a rename within one file system is atomic) and is removed on any failure. Raises ``OSError``.
    """
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(path) + ".")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data.encode("utf-8") if isinstance(data, str) else data)
            handle.flush()
            os.fsync(handle.fileno())
        try:
            old = os.stat(path)
            os.chmod(tmp, old.st_mode & 0o7777)
            os.chown(tmp, old.st_uid, old.st_gid)
        except FileNotFoundError:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise
    sync_path(directory)


def atomic_move_durably(module, tmp, path):
    """``module.atomic_move(tmp, path)`` (AnsibleModule: keeps the owner, mode and SELinux label of ``path``), with
    the temporary file fsynced before and ``path``'s folder after, as ``write_atomic`` does. Raises ``OSError``."""
    sync_path(tmp)
    module.atomic_move(tmp, path)
    sync_path(os.path.dirname(path) or ".")


def save_state(path, state):
    """Write ``state`` to ``path`` atomically and durably (mode 0600, parent folder created with mode 0700)."""
    os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
    write_atomic(path, json.dumps(state, indent=2, sort_keys=True) + "\n", mode=0o600)


def record_original(path, key, original, check_mode=False, kernel_path=None):
    """Record ``original`` (str) for ``key`` unless the key is already recorded.

    ``kernel_path`` (str) is the sysfs/procfs file the value was read from (for example
    ``/proc/sys/vm/swappiness``); it is stored as ``kernel_path`` so a rollback can write the original
    back. Returns ``(changed, entry)``: ``changed`` is True when a new entry was (or, in check mode,
    would be) written; ``entry`` is the stored dict (``original``, ``recorded``, and ``kernel_path``
    when given).
    """
    state = load_state(path)
    if key in state["settings"]:
        return False, state["settings"][key]
    entry = {"original": original, "recorded": _now()}
    if kernel_path:
        entry["kernel_path"] = kernel_path
    if not check_mode:
        state["settings"][key] = entry
        save_state(path, state)
    return True, entry


def backup_path(path, file_path):
    """Return where the backup of ``file_path`` goes: ``<state dir>/backup/<absolute file path>``."""
    return os.path.join(os.path.dirname(path), "backup", os.path.abspath(file_path).lstrip("/"))


def backup_file(path, file_path, check_mode=False):
    """Copy ``file_path`` into the backup directory once, before its first edit by this project.

    When the file does not exist, records ``existed: false`` (a rollback then removes it). Returns
    ``(changed, entry)`` with ``entry`` holding ``existed`` (bool), ``backup`` (str or None) and
    ``recorded``. Metadata (mode, owner, times) is kept with ``shutil.copy2``.
    """
    state = load_state(path)
    file_path = os.path.abspath(file_path)
    if file_path in state["files"]:
        return False, state["files"][file_path]
    existed = os.path.lexists(file_path)
    entry = {"existed": existed, "backup": backup_path(path, file_path) if existed else None,
             "recorded": _now()}
    if not check_mode:
        if existed:
            # The backup root is root-only: makedirs gives only the last folder its mode.
            root = os.path.join(os.path.dirname(path), "backup")
            os.makedirs(root, mode=0o700, exist_ok=True)
            os.chmod(root, 0o700)
            os.makedirs(os.path.dirname(entry["backup"]), mode=0o700, exist_ok=True)
            shutil.copy2(file_path, entry["backup"], follow_symlinks=False)
            if not os.path.islink(entry["backup"]):
                sync_path(entry["backup"])
            sync_path(os.path.dirname(entry["backup"]))
        state["files"][file_path] = entry
        save_state(path, state)
    return True, entry


def record_packages(path, names, check_mode=False):
    """Record each package of ``names`` (list of str, the ones not installed now) once, as installed by this project.

    Returns the names newly recorded (or, in check mode, that would be).
    """
    state = load_state(path)
    new = [name for name in dict.fromkeys(names) if name not in state["packages"]]
    if new and not check_mode:
        for name in new:
            state["packages"][name] = {"recorded": _now()}
        save_state(path, state)
    return new
