# -*- coding: utf-8 -*-
"""Run a measuring process in the cgroup the inference service runs in, not in the caller's.

A module runs where Ansible's login put it (``user.slice/user-UID.slice/session-N.scope``, which become keeps),
under that user's quota and cpuset. A process that stands in for the service (the engine's direct-run twin, the
bandwidth probe) must share the service's limits instead: a transient scope in the service's slice has them.
"""

from __future__ import annotations

import os
import shutil


def systemd_booted(root="/"):
    """True when systemd is the service manager (sd_booted(3): ``/run/systemd/system`` is a directory)."""
    return os.path.isdir(os.path.join(root, "run/systemd/system"))


def scope_argv(argv, slice_name, user=None, group=None, systemd_run=None):
    """Return ``argv`` run in a transient scope of ``slice_name`` (systemd-run(1) ``--scope``), or ``argv`` itself.

    systemd-run executes the command in place (same PID) once the scope holds it, with the caller's environment
    and CPU affinity; ``user`` and ``group`` (names or ids) are switched to by systemd-run (``--uid``, ``--gid``),
    since an unprivileged caller could not create the scope. Returns ``argv`` unchanged without ``systemd_run``
    (the path of systemd-run) or ``slice_name``.
    """
    if not systemd_run or not slice_name:
        return list(argv)
    wrapped = [systemd_run, "--scope", "--quiet", "--slice=" + slice_name]
    if user not in (None, ""):
        wrapped.append("--uid=%s" % user)
    if group not in (None, ""):
        wrapped.append("--gid=%s" % group)
    return wrapped + ["--"] + list(argv)


def find_systemd_run():
    """Path of systemd-run where systemd is the service manager, else None."""
    return shutil.which("systemd-run") if systemd_booted() else None
