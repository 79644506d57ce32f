# -*- coding: utf-8 -*-
"""Run a measuring process as the inference service runs its engine, in the cgroup it runs in, not in the caller's.

A module runs where Ansible's login put it (``user.slice/user-UID.slice/session-N.scope``, which become keeps),
under that user's quota and cpuset. A process that stands in for the service (the engine's direct-run twin, the
bandwidth probe, the engine's own batched benchmark) must share the service's limits instead: a transient scope in
the service's slice has them. What the unit runs (command, environment, user, CPUs) is read from `systemctl show`.
"""

from __future__ import annotations

import grp
import os
import pwd
import re
import shlex
import shutil

from ansible.module_utils.llmtune_sysfs import parse_cpu_list


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


# Properties of `systemctl show` that say how a unit runs its command (systemd.exec(5)).
SHOW_PROPERTIES = ("ExecStart", "Environment", "User", "Group", "CPUAffinity", "NUMAPolicy", "NUMAMask", "MainPID",
                   "Slice")


class UnitError(Exception):
    """The unit's command cannot be read or run as the unit runs it; the message is one line for the task output."""


def parse_show(text):
    """{property: value} of `systemctl show -p ...` output (one NAME=VALUE line each)."""
    values = {}
    for line in text.splitlines():
        name, sep, value = line.partition("=")
        if sep:
            values[name] = value
    return values


def exec_argv(exec_start):
    """argv of a `systemctl show` ExecStart value: `{ path=... ; argv[]=ARG ARG ... ; ignore_errors=no ; ... }`.

    systemd prints each argument C-escaped and separated by spaces (systemd.syntax(7)); shlex splits it.
    """
    marker = "argv[]="
    start = exec_start.find(marker)
    if start < 0:
        raise UnitError(f"no command in ExecStart={exec_start!r}")
    end = exec_start.find(" ; ", start)
    return shlex.split(exec_start[start + len(marker):end if end >= 0 else None])


def expand(argv, env):
    """ARGV with the unit's environment variables substituted as systemd does when it starts the command.

    systemd.service(5), Command lines: ``${FOO}`` (a word or part of one) becomes FOO's value as one argument;
    ``$FOO`` as a word of its own becomes FOO's value split at whitespace (zero or more arguments); ``$$`` is ``$``.
    A template unit's instances take their port and threads so (inference_service layout per_node).
    """
    out = []
    for arg in argv:
        whole = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", arg)
        if whole:
            out.extend(env.get(whole.group(1), "").split())
            continue
        out.append(re.sub(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)\}",
                          lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), ""), arg))
    return out


def unit_command(show):
    """What the unit runs: (argv, environment additions, user, group, CPUs or None) from parsed `systemctl show`.

    The argv is the ExecStart command with the unit's variables substituted, after ``numactl --membind`` when the
    unit binds memory (NUMAPolicy, numactl(8)).
    """
    if not show.get("ExecStart"):
        raise UnitError("the unit has no ExecStart (is it installed?)")
    env = dict(item.split("=", 1) for item in shlex.split(show.get("Environment", "")) if "=" in item)
    argv = expand(exec_argv(show["ExecStart"]), env)
    cpus = parse_cpu_list(",".join(show.get("CPUAffinity", "").split())) or None
    if show.get("NUMAPolicy") and show["NUMAPolicy"] not in ("default", "n/a") and show.get("NUMAMask"):
        argv = ["numactl", "--membind=" + ",".join(show["NUMAMask"].split())] + argv
    return argv, env, show.get("User") or "root", show.get("Group") or "", cpus


def unit_process(argv, env_add, user, group, cpus, slice_name=None, systemd_run=None):
    """How to start ARGV as the unit runs its command: (argv to execute, environment, preexec function).

    The environment is a login's minimum plus the unit's ENV_ADD; the process is pinned to CPUS
    (sched_setaffinity(2)) and runs as USER and GROUP; with SYSTEMD_RUN and SLICE_NAME in a transient scope of the
    unit's slice (scope_argv), where systemd-run switches the user. UnitError for an unknown user or group.
    """
    try:
        account = pwd.getpwnam(user)
        gid = grp.getgrnam(group).gr_gid if group else account.pw_gid
    except KeyError as error:
        raise UnitError(f"unknown user or group of the unit: {error}") from error
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": account.pw_dir, "USER": user, "LANG": "C.UTF-8"}
    env.update(env_add)
    in_slice = slice_name if systemd_run else None

    def become():
        if cpus:
            os.sched_setaffinity(0, cpus)
        if in_slice:
            return
        os.setgid(gid)
        os.initgroups(user, gid)
        os.setuid(account.pw_uid)

    return scope_argv(argv, in_slice, user, gid, systemd_run), env, become
