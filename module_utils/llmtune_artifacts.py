# -*- coding: utf-8 -*-
"""Artifacts under a content address: each file once, named by its SHA-256, for hosts to fetch from a mirror.

A store is a folder with ``sha256/<hex>`` (the files), ``manifests/<name>.json`` (each artifact's files, sums and
sizes) and ``sums.json`` (the sums already computed, by path, size, mtime and inode, so that a second run reads no
file again). An operator syncs the store to any HTTP(S) server; hosts fetch ``<base URL>/sha256/<hex>`` and check
the sum before the file takes its place.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import posixpath
import shutil

from ansible.module_utils.llmtune_state import write_atomic

CHUNK = 1 << 20


class ArtifactError(Exception):
    """An artifact or store that cannot be used; the message is one line for the task output."""


def sha256_of(path):
    """The SHA-256 of the file PATH, as lowercase hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def files_of(path):
    """[(name inside the artifact, absolute path)] of the artifact PATH, sorted by name.

    A file is one entry named "" (it is fetched to its own destination); a folder gives its regular files, symlinks
    followed, by their path inside it. Hidden entries (a hub download's ``.cache`` metadata) are left out.
    """
    if os.path.isfile(path):
        return [("", os.path.realpath(path))]
    if not os.path.isdir(path):
        raise ArtifactError(f"{path}: no such file or folder on the controller")
    found = []
    for folder, subfolders, names in os.walk(path, followlinks=True):
        subfolders[:] = sorted(name for name in subfolders if not name.startswith("."))
        for name in names:
            if name.startswith("."):
                continue
            full = os.path.join(folder, name)
            if os.path.isfile(full):
                found.append((os.path.relpath(full, path), os.path.realpath(full)))
    if not found:
        raise ArtifactError(f"{path}: an empty folder")
    return sorted(found)


def _key(stat):
    return [stat.st_size, stat.st_mtime_ns, stat.st_ino, stat.st_dev]


def _place(source, target):
    """Put SOURCE at TARGET: a hard link where both are on one file system, else a copy; atomic either way."""
    part = f"{target}.{os.getpid()}.part"
    try:
        # A link keeps the cache file's mode: changing it would change the cache's file.
        os.link(source, part)
    except OSError as error:
        if error.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
            raise
        shutil.copyfile(source, part)
        os.chmod(part, 0o644)
    os.replace(part, target)


def publish(path, store, name=None, check=False, dest=None):
    """Put every file of the artifact PATH into STORE under its SHA-256, and write its manifest.

    Returns {"name", "manifest" (its path), "files": [{"path", "sha256", "size"}, with "dest", the file's path on a
    host, when DEST (the artifact's path there) is given], "folders" (of a folder
    artifact: its folders by path inside it, "" for itself; none for a file), "placed": [hex of the files new in
    the store], "changed"}. With CHECK, computes the same without writing anything. Concurrent calls
    (forks publishing the same model for several hosts) wait for each other on the store's lock, so a file is read
    once.
    """
    name = name or os.path.basename(os.path.normpath(path))
    entries = files_of(path)
    blobs = os.path.join(store, "sha256")
    manifests = os.path.join(store, "manifests")
    manifest = os.path.join(manifests, f"{name}.json")
    if not check:
        try:
            for folder in (store, blobs, manifests):
                os.makedirs(folder, mode=0o755, exist_ok=True)
        except OSError as error:
            raise ArtifactError(f"cannot make the artifact store {store}: {error}") from error
    lock = None
    if os.path.isdir(store):
        lock = open(os.path.join(store, ".lock"), "a", encoding="ascii")  # pylint: disable=consider-using-with
        fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        sums_path = os.path.join(store, "sums.json")
        try:
            with open(sums_path, encoding="utf-8") as handle:
                sums = json.load(handle)
        except (OSError, ValueError):
            sums = {}
        files, placed, sums_changed = [], [], False
        for inside, full in entries:
            stat = os.stat(full)
            known = sums.get(full)
            if known and known.get("key") == _key(stat):
                digest = known["sha256"]
            else:
                digest = sha256_of(full)
                sums[full] = {"key": _key(stat), "sha256": digest}
                sums_changed = True
            files.append({"path": inside, "sha256": digest, "size": stat.st_size})
            target = os.path.join(blobs, digest)
            if not (os.path.isfile(target) and os.path.getsize(target) == stat.st_size):
                placed.append(digest)
                if not check:
                    _place(full, target)
        content = {"name": name, "files": files}
        try:
            with open(manifest, encoding="utf-8") as handle:
                manifest_changed = json.load(handle) != content
        except (OSError, ValueError):
            manifest_changed = True
        if not check:
            if sums_changed:
                write_atomic(sums_path, json.dumps(sums, indent=1, sort_keys=True) + "\n")
            if manifest_changed:
                write_atomic(manifest, json.dumps(content, indent=1, sort_keys=True) + "\n")
    except OSError as error:
        raise ArtifactError(f"cannot publish {path} into {store}: {error}") from error
    finally:
        if lock is not None:
            lock.close()
    folders = sorted({os.path.dirname(inside) for inside, _full in entries}) if entries[0][0] else []
    if dest:
        # Beside the manifest's entries, not in them: the manifest is the artifact's, whichever host fetches it.
        files = [dict(entry, dest=posixpath.join(dest, entry["path"]) if entry["path"] else dest) for entry in files]
    return {"name": name, "manifest": manifest, "files": files, "folders": folders, "placed": placed,
            "changed": bool(placed) or manifest_changed}
