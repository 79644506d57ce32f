# Copyright: llmtune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Mitogen's podman connection that also counts what it copies: each file put into the container is appended to
$LLMTUNE_TRANSFER_LOG as a line of JSON (host, kind "put", bytes). The fleet test's proof that a node of the mirror
got no artifact through Ansible (transfers.py)."""

from __future__ import annotations

import json
import os

from ansible_mitogen.plugins.connection.mitogen_podman import Connection as MitogenPodman


class Connection(MitogenPodman):
    """Counts each file put_file copies, then copies it as Mitogen does."""

    def put_file(self, in_path, out_path):
        path = os.environ.get("LLMTUNE_TRANSFER_LOG")
        if path:
            line = json.dumps({"host": self.get_task_var("inventory_hostname"), "kind": "put",
                               "bytes": os.path.getsize(in_path)})
            # One write of one line: the workers of other hosts do not interleave.
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, (line + "\n").encode("utf-8"))
            finally:
                os.close(fd)
        super().put_file(in_path, out_path)
