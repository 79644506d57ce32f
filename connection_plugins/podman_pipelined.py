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
  - Files (template, copy) still go through C(podman mount) or C(podman cp), as in the plugin it extends.
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
  podman_executable:
    description: The podman program.
    default: podman
    vars:
      - name: ansible_podman_executable
    env:
      - name: ANSIBLE_PODMAN_EXECUTABLE
"""

import shlex

from ansible.module_utils.common.text.converters import to_native
from ansible.plugins.connection import ConnectionBase, ensure_connect
from ansible_collections.containers.podman.plugins.connection.podman import Connection as PodmanConnection


class Connection(PodmanConnection):
    """A podman exec connection whose commands may read the module from stdin."""

    transport = "podman_pipelined"
    has_pipelining = True

    @ensure_connect
    def exec_command(self, cmd, in_data=None, sudoable=False):
        """Run cmd (a shell command line) in the container; in_data, when given, is its stdin."""
        # The grandparent's bookkeeping only: the parent's own exec_command would run podman exec without stdin.
        ConnectionBase.exec_command(self, cmd, in_data=in_data, sudoable=sudoable)
        args = ["exec"]
        if in_data is not None:
            args.append("--interactive")
        if self.user:
            args += ["--user", self.user]
        return self._podman(args, shlex.split(to_native(cmd, errors="surrogate_or_strict")), in_data)
