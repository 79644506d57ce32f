#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module engine_direct: run a systemd service's engine directly, outside systemd, as its twin."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: engine_direct
short_description: Start or stop the engine of a systemd service directly, as a user would start it by hand
description:
  - Reads what a systemd service runs with C(systemctl show) (C(ExecStart) argv, C(Environment), C(User),
    C(Group), C(CPUAffinity), C(NUMAPolicy), C(NUMAMask); systemd.exec(5)) and, with O(state=started), starts
    the same command as a plain process outside systemd, with the same environment, user, CPU pinning
    (sched_setaffinity(2)) and NUMA memory binding (C(numactl --membind), numactl(8), when the unit binds
    memory), on O(port) instead of the service's port (the value after C(--port) in the command). None of the
    unit's sandboxing applies, so the twin shows what the sandbox, the service manager and the unit's settings
    cost.
  - Where systemd is the service manager, the twin runs in a transient scope of the unit's slice (C(Slice),
    C(systemd-run --scope --slice=), systemd-run(1)), so that it has the same cgroup limits above the unit (a
    slice's quota or cpuset) as the service, not those of the Ansible login's session the module runs in.
  - It waits until C(http://127.0.0.1:PORT) answers O(health_path) with HTTP 200, or fails with the last lines
    of the process's output. The process runs in its own session, so it outlives the module; its PID is kept
    in O(pid_file), and O(state=stopped) ends it (SIGTERM to its process group, SIGKILL after O(timeout_stop))
    and returns once every process of the group has ended, so its memory and port are free again.
  - The service itself is left as it is; stop it first when both must not share the CPUs.
  - While the service runs, the twin loads a second copy of the weights. It is started only when C(MemAvailable)
    (C(/proc/meminfo), Documentation/filesystems/proc.rst) exceeds the service's resident memory (C(VmRSS) of its
    C(MainPID), proc(5)) by O(memory_margin_mb); otherwise nothing starts and the task is skipped with the figures in RV(msg),
    since a twin that pushes the host into swap or the OOM killer would measure the host, not the unit.
  - C(changed) is true when a process was started or stopped.
version_added: "0.2.0"
author: llmtune project
options:
  unit:
    description:
      - The systemd service whose engine to run, with or without C(.service).
    type: str
    default: llm-inference
  state:
    description:
      - C(started) starts the twin (a running twin from O(pid_file) is stopped first); C(stopped) ends it.
    type: str
    default: started
    choices: [started, stopped]
  port:
    description:
      - TCP port the twin listens on, replacing the value of C(--port) in the service's command.
    type: int
    default: 8100
  health_path:
    description:
      - Path answered with HTTP 200 once the engine is ready (C(/health) for C(transformers serve),
        C(/v1/models) for llama.cpp).
    type: str
    default: /health
  timeout:
    description:
      - Seconds to wait for the twin to become ready (model load included).
    type: float
    default: 600
  timeout_stop:
    description:
      - Seconds between SIGTERM and SIGKILL when stopping, and the most to wait for the end after SIGKILL.
    type: float
    default: 30
  memory_margin_mb:
    description:
      - MiB of C(MemAvailable) to keep beyond the running service's C(VmRSS) (the twin's own copy of the
        weights) before the twin may start beside the service.
    type: int
    default: 512
  pid_file:
    description:
      - File holding the twin's PID; by default C(/run/llmtune/engine-direct/UNIT.pid), one per unit, so that
        several engines (one per NUMA node) each have their twin.
    type: path
  log_path:
    description:
      - File receiving the twin's standard output and error (truncated at each start); by default
        C(/var/lib/llmtune/engine-direct/UNIT.log).
    type: path
notes:
  - Fails when the unit has no C(ExecStart), its command has no C(--port) option, C(numactl) is missing for a
    unit with C(NUMAPolicy), or the twin exits or is not ready within O(timeout).
"""

EXAMPLES = r"""
- name: Stop the service, so that the twin has the CPUs to itself
  ansible.builtin.systemd_service:
    name: llm-inference.service
    state: stopped

- name: Run its engine directly on port 8100
  engine_direct:
    unit: llm-inference
    port: 8100
  register: twin

- name: End the twin
  engine_direct:
    state: stopped
"""

RETURN = r"""
pid:
  description: PID of the twin (state=started).
  returned: state=started
  type: int
url:
  description: Base URL of the twin.
  returned: state=started
  type: str
  sample: http://127.0.0.1:8100
argv:
  description: Command the twin runs (the service's ExecStart argv with the twin's port, after numactl when the unit binds memory).
  returned: state=started
  type: list
  elements: str
user:
  description: User the twin runs as (root when the unit names none).
  returned: state=started
  type: str
slice:
  description: Slice whose transient scope the twin runs in; null when it runs in the module's own cgroup (no
    systemd, or the unit names no slice).
  returned: state=started
  type: str
  sample: system.slice
cpus:
  description: CPUs the twin is pinned to (the unit's CPUAffinity; all CPUs when it has none).
  returned: state=started
  type: list
  elements: int
environment:
  description: Names of the environment variables set from the unit (values are not returned).
  returned: state=started
  type: list
  elements: str
ready_s:
  description: Seconds from start until the health check answered.
  returned: state=started
  type: float
skipped:
  description: True when the twin was not started beside the running service for lack of memory.
  returned: when memory is short
  type: bool
msg:
  description: Why the twin was not started (the service's VmRSS, MemAvailable and the margin, in MiB).
  returned: when memory is short
  type: str
  sample: "not enough memory for the twin beside the service: VmRSS 7901 MiB + margin 512 MiB > MemAvailable 6120 MiB"
"""

import http.client
import os
import signal
import subprocess
import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.llmtune_cpuload import memory_short, stat_fields
from ansible.module_utils.llmtune_systemd import (SHOW_PROPERTIES, UnitError, exec_argv, expand,  # noqa: F401
                                                  find_systemd_run, parse_show, scope_argv, unit_command,
                                                  unit_process)

# Default folders of the twins' PID files and logs, a file per unit.
PID_DIR = "/run/llmtune/engine-direct"
LOG_DIR = "/var/lib/llmtune/engine-direct"

# The twin cannot be started or stopped (a unit's command that cannot be read or run is one such case).
DirectError = UnitError


def with_port(argv, port):
    """ARGV with the value of its --port option (`--port N` or `--port=N`) replaced by PORT."""
    out, found = list(argv), False
    for i, arg in enumerate(out):
        if arg == "--port" and i + 1 < len(out):
            out[i + 1], found = str(port), True
        elif arg.startswith("--port="):
            out[i], found = f"--port={port}", True
    if not found:
        raise DirectError(f"the service's command has no --port option: {' '.join(argv)}")
    return out


def twin_spec(show, port):
    """What to run: (argv, environment additions, user, group, CPUs or None) from parsed `systemctl show`, the
    unit's command with its --port on PORT."""
    argv, env, user, group, cpus = unit_command(show)
    return with_port(argv, port), env, user, group, cpus


def twin_files(unit, pid_file=None, log_path=None):
    """{pid_file, log_path} of UNIT's twin: the given ones, else one of each per unit in PID_DIR and LOG_DIR."""
    return {"pid_file": pid_file or f"{PID_DIR}/{unit}.pid", "log_path": log_path or f"{LOG_DIR}/{unit}.log"}


def read_pid(pid_file):
    """PID in PID_FILE if that process still runs (a zombie has ended), else None."""
    try:
        with open(pid_file, encoding="ascii") as handle:
            pid = int(handle.read().strip())
    except (OSError, ValueError):
        return None
    fields = stat_fields(pid)
    return pid if fields and fields[0] not in ("Z", "X") else None


def group_running(pgid):
    """PIDs of the processes of group PGID that still run (a zombie has ended)."""
    running = []
    for pid in map(int, filter(str.isdigit, os.listdir("/proc"))):
        fields = stat_fields(pid)
        if fields and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            running.append(pid)
    return running


def stop(pid_file, timeout):
    """End the twin of PID_FILE, its whole process group: SIGTERM, then SIGKILL after TIMEOUT seconds; returns
    only when every process of the group has ended, True when one was running."""
    pid = read_pid(pid_file)
    if pid is not None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + timeout
            while group_running(pid) and time.monotonic() < deadline:
                time.sleep(0.2)
            if not group_running(pid):
                break
        else:
            # Only a process stuck in the kernel (state D) outlives SIGKILL; its PID file stays for the next stop.
            raise DirectError(f"the twin's process group {pid} still runs {timeout} s after SIGKILL")
    try:
        os.unlink(pid_file)
    except FileNotFoundError:
        pass
    return pid is not None


def healthy(port, path):
    """True when http://127.0.0.1:PORT/PATH answers 200."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path)
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def tail(path, lines=15):
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return " | ".join(handle.read().splitlines()[-lines:])
    except OSError:
        return ""


def start(params, show, systemd_run=None):
    """Start the twin and wait until it is ready; returns the result fields.

    With ``systemd_run`` (its path) the twin runs in a scope of the unit's slice, and systemd-run switches user.
    """
    argv, env_add, user, group, cpus = twin_spec(show, params["port"])
    in_slice = show.get("Slice") if systemd_run else None
    run_argv, env, become = unit_process(argv, env_add, user, group, cpus, in_slice, systemd_run)

    for path in (params["log_path"], params["pid_file"]):
        os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(params["log_path"], "w", encoding="utf-8") as log:
        try:
            proc = subprocess.Popen(run_argv, env=env, cwd="/", stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, preexec_fn=become, start_new_session=True)
        except OSError as error:
            raise DirectError(f"cannot start {run_argv[0]}: {error}") from error
    with open(params["pid_file"], "w", encoding="ascii") as handle:
        handle.write(f"{proc.pid}\n")
    started = time.monotonic()
    while not healthy(params["port"], params["health_path"]):
        if proc.poll() is not None:
            raise DirectError(f"the twin exited with status {proc.returncode}: {tail(params['log_path'])}")
        if time.monotonic() - started > params["timeout"]:
            stop(params["pid_file"], params["timeout_stop"])
            raise DirectError(f"the twin was not ready within {params['timeout']} s: {tail(params['log_path'])}")
        time.sleep(1)
    return {"pid": proc.pid, "url": f"http://127.0.0.1:{params['port']}", "argv": argv, "user": user,
            "slice": in_slice or None,
            "cpus": sorted(cpus or os.sched_getaffinity(0)), "environment": sorted(env_add),
            "ready_s": round(time.monotonic() - started, 1)}


ARGUMENT_SPEC = {
    "unit": {"type": "str", "default": "llm-inference"},
    "state": {"type": "str", "default": "started", "choices": ["started", "stopped"]},
    "port": {"type": "int", "default": 8100},
    "health_path": {"type": "str", "default": "/health"},
    "timeout": {"type": "float", "default": 600},
    "timeout_stop": {"type": "float", "default": 30},
    "memory_margin_mb": {"type": "int", "default": 512},
    "pid_file": {"type": "path"},
    "log_path": {"type": "path"},
}


def main():
    """Start or stop the twin; check mode reports what would happen and runs nothing."""
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    params = module.params
    if not 0 < params["port"] < 65536:
        module.fail_json(msg=f"port must be 1-65535, got {params['port']}")
    if params["memory_margin_mb"] < 0:
        module.fail_json(msg=f"memory_margin_mb must be >= 0, got {params['memory_margin_mb']}")
    unit = params["unit"] if params["unit"].endswith(".service") else params["unit"] + ".service"
    params = dict(params, **twin_files(unit, params["pid_file"], params["log_path"]))
    if params["state"] == "stopped":
        running = read_pid(params["pid_file"]) is not None
        if not module.check_mode:
            try:
                stop(params["pid_file"], params["timeout_stop"])
            except DirectError as error:
                module.fail_json(msg=str(error))
        module.exit_json(changed=running)
    if module.check_mode:
        module.exit_json(changed=True)
    rc, out, err = module.run_command(["systemctl", "show", unit, "--no-pager"]
                                      + [f"--property={name}" for name in SHOW_PROPERTIES])
    if rc != 0:
        module.fail_json(msg=f"systemctl show {unit} failed: {err.strip()}")
    show = parse_show(out)
    try:
        stop(params["pid_file"], params["timeout_stop"])
        short = memory_short(int(show.get("MainPID") or 0), params["memory_margin_mb"])
        if short:
            module.exit_json(changed=False, skipped=True, msg=short)
        module.exit_json(changed=True, **start(params, show, find_systemd_run()))
    except (DirectError, OSError) as error:
        module.fail_json(msg=str(error))


if __name__ == "__main__":
    main()
