# Copyright: llmtune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""containers.podman.podman with pipelining: one `podman exec` per task instead of four or five."""

from __future__ import annotations

DOCUMENTATION = r"""
name: podman_pipelined
short_description: Run tasks in a podman container, one C(podman exec) per task
description:
  - The C(containers.podman.podman) connection with Ansible pipelining. That plugin turned pipelining off because
    C(podman exec) did not forward stdin without C(--interactive)
    (U(https://github.com/containers/ansible-podman-collections/pull/275)); this one passes C(--interactive) when a
    task sends the module on stdin. Without pipelining a task costs a temporary folder, a copy, the run and a clean-up,
    each a C(podman exec) (about 0.2 s each on a 2-vCPU controller); with it, one.
  - Enable pipelining too (C(pipelining = true) in C([connection]) or C([defaults]) of ansible.cfg, or C(ANSIBLE_PIPELINING=true)); without
    it the plugin works as the one it extends.
  - Run as root against a running container of the C(runc) runtime, the commands go to C(runc exec) and files to the
    container's root folder on the host, with no podman process per task. C(podman exec) and C(podman mount) cost
    about 0.15 s of CPU each, C(runc exec) 0.03. The process is the one C(podman exec) starts (the container's
    environment, capabilities, seccomp filter and cgroups). The container's ID is asked of podman once and kept in
    C(/run/llmtune-podman). Otherwise, and with a O(remote_user) or O(podman_extra_args), the plugin runs podman as the
    one it extends, files through C(podman mount) or C(podman cp).
options:
  remote_addr:
    description: Name or ID of the running container.
    default: inventory_hostname
    vars:
      - name: ansible_host
      - name: inventory_hostname
      - name: ansible_podman_host
  remote_user:
    description: User (name or UID) that runs the commands in the container; the image's default user when unset.
    ini:
      - section: defaults
        key: remote_user
    env:
      - name: ANSIBLE_REMOTE_USER
    vars:
      - name: ansible_user
  podman_extra_args:
    description: Extra arguments for every podman command, split as a shell would (shlex).
    default: ""
    ini:
      - section: defaults
        key: podman_extra_args
    vars:
      - name: ansible_podman_extra_args
    env:
      - name: ANSIBLE_PODMAN_EXTRA_ARGS
  transfer_log:
    description:
      - A file on the controller to which every transfer to the container is appended as a line of JSON with the
        keys C(host), C(kind) (C(exec), a command and the module it sends on stdin, or C(put), a file copied) and
        C(bytes), to measure what a playbook sends through the connection. Empty logs nothing.
    default: ""
    vars:
      - name: ansible_podman_transfer_log
    env:
      - name: LLMTUNE_TRANSFER_LOG
  podman_executable:
    description: The podman program.
    default: podman
    vars:
      - name: ansible_podman_executable
    env:
      - name: ANSIBLE_PODMAN_EXECUTABLE
"""

import json
import os
import shlex
import subprocess

from ansible.module_utils.common.process import get_bin_path
from ansible.module_utils.common.text.converters import to_bytes, to_native
from ansible.plugins.connection import ConnectionBase, ensure_connect
from ansible.utils.display import Display
from ansible_collections.containers.podman.plugins.connection.podman import Connection as PodmanConnection

display = Display()


class Connection(PodmanConnection):
    """A podman exec connection whose commands may read the module from stdin."""

    transport = "podman_pipelined"
    has_pipelining = True
    # runc's state folder for root (runc --root) and where container IDs are kept, one file per container name.
    runc_root = "/run/runc"
    id_cache = "/run/llmtune-podman"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._runc = None

    def _connect(self):
        """Find the container's runc state, else mount its file system as the parent does."""
        self._runc = self._runc_state()
        if self._runc is None:
            return super()._connect()
        ConnectionBase._connect(self)
        # Bytes, as the parent keeps the output of podman mount.
        self._mount_point = to_bytes(self._runc["rootfs"], errors="surrogate_or_strict")
        self._connected = True
        return self

    def _runc_state(self):
        """{"runc": path, "id": ID, "rootfs": path} of the running container, or None where runc cannot be used."""
        if os.geteuid() != 0 or self.user or self.get_option("podman_extra_args"):
            return None
        try:
            runc = get_bin_path("runc")
        except ValueError:
            return None
        cache = os.path.join(self.id_cache, os.path.basename(self._container_id))
        try:
            with open(cache, encoding="utf-8") as f:
                container_id = f.read().strip()
        except OSError:
            container_id = ""
        rootfs = self._runc_rootfs(container_id)
        if rootfs is None:
            # Not kept yet, or the container was removed or made again under its name since.
            rc, out, dummy = self._podman(["inspect", "--format", "{{.OCIRuntime}} {{.Id}}"])
            fields = to_native(out).split()
            if rc != 0 or len(fields) != 2 or os.path.basename(fields[0]) != "runc":
                return None
            container_id = fields[1]
            rootfs = self._runc_rootfs(container_id)
            if rootfs is None:
                return None
            os.makedirs(self.id_cache, mode=0o700, exist_ok=True)
            tmp = "%s.%d" % (cache, os.getpid())
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(container_id + "\n")
            os.replace(tmp, cache)
        return {"runc": runc, "id": container_id, "rootfs": rootfs}

    def _runc_rootfs(self, container_id):
        """The root folder of a running container of runc's, from its state file; None for any other ID."""
        if not container_id:
            return None
        try:
            with open(os.path.join(self.runc_root, os.path.basename(container_id), "state.json"), "rb") as f:
                rootfs = json.load(f).get("config", {}).get("rootfs")
        except (OSError, ValueError, AttributeError):
            return None
        return rootfs if rootfs and os.path.isdir(rootfs) else None

    def _log_transfer(self, kind, size):
        """Append one transfer to the transfer_log file (one write of one line: forks do not interleave)."""
        path = self.get_option("transfer_log")
        if path and size:
            line = json.dumps({"host": self._container_id, "kind": kind, "bytes": size}) + "\n"
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line.encode("utf-8"))
            finally:
                os.close(fd)

    def put_file(self, in_path, out_path):
        """Copy the controller's file in_path to out_path in the container."""
        super().put_file(in_path, out_path)
        self._log_transfer("put", os.path.getsize(in_path))

    @ensure_connect
    def exec_command(self, cmd, in_data=None, sudoable=False):
        """Run cmd (a shell command line) in the container; in_data, when given, is its stdin."""
        # The grandparent's bookkeeping only: the parent's own exec_command would run podman exec without stdin.
        ConnectionBase.exec_command(self, cmd, in_data=in_data, sudoable=sudoable)
        self._log_transfer("exec", len(cmd) + len(in_data or b""))
        if self._runc is not None:
            argv = [self._runc["runc"], "--root", self.runc_root, "exec", self._runc["id"]]
            argv += shlex.split(to_native(cmd, errors="surrogate_or_strict"))
            display.vvv("RUN %s" % (argv,), host=self._container_id)
            proc = subprocess.Popen([to_bytes(a, errors="surrogate_or_strict") for a in argv], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            stdout, stderr = proc.communicate(input=in_data)
            return proc.returncode, stdout, stderr
        args = ["exec"]
        if in_data is not None:
            args.append("--interactive")
        if self.user:
            args += ["--user", self.user]
        return self._podman(args, shlex.split(to_native(cmd, errors="surrogate_or_strict")), in_data)
