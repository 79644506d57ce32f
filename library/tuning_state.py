#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: record original tuning values and file backups once, or read the whole state."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: tuning_state
short_description: Record original values and file backups in the llmtune state file, once
description:
  - Keeps C(/var/lib/llmtune/state.json), the record the drift check and the rollback playbook use to
    restore a host. Each original is written once, before this project first changes it; later runs
    never overwrite it.
  - With O(key) and O(original), records the raw value of a setting (for example the THP C(enabled)
    file before the C(thp) role writes it).
  - With O(file), copies the file into C(backup/) next to the state file before its first edit, or records
    that it did not exist (a rollback then deletes it).
  - With O(packages), before a role installs them, records the ones not installed now (C(dpkg-query -W), see
    dpkg-query(1); else C(rpm -q), see rpm(8)) as installed by this project, with the packages apt would add for
    them (C(apt-get -s install), see apt-get(8); without the recommended ones with O(install_recommends=false), as
    the role installs them then); a rollback removes those, and only when nothing else needs them. A package that
    was there before is never recorded.
  - With O(state=read), returns the whole state and changes nothing.
  - Supports check mode (reports what would be recorded, writes nothing) and diff.
options:
  path:
    description: State file (JSON). Created with mode 0600 in a 0700 directory.
    type: path
    default: /var/lib/llmtune/state.json
  state:
    description: C(present) records O(key)/O(file); C(read) returns the state.
    type: str
    choices: [present, read]
    default: present
  key:
    description: Dotted setting name C(<role>.<setting>), for example C(thp.enabled).
    type: str
  original:
    description: Raw value before the change (for sysfs files, the whole file text as read).
    type: str
  file:
    description: Absolute path of a file about to be edited or created by a role.
    type: path
  packages:
    description: Distribution package names about to be installed by a role.
    type: list
    elements: str
  install_recommends:
    description: Whether the role's install brings the packages' recommended packages too (apt's default); C(false)
      for an install with C(install_recommends=false) (C(apt-get --no-install-recommends)).
    type: bool
    default: true
notes:
  - A damaged (non-JSON) state file fails the task instead of being replaced.
author: llmtune contributors
"""

EXAMPLES = r"""
- name: Record the THP mode before changing it
  tuning_state:
    key: thp.enabled
    original: "always [madvise] never"

- name: Back up /etc/fstab before commenting out swap
  tuning_state:
    file: /etc/fstab

- name: Record nginx as ours before installing it, unless it is there already
  tuning_state:
    packages: [nginx]

- name: Record the node exporter as ours, installed without its recommended collectors
  tuning_state:
    packages: [prometheus-node-exporter]
    install_recommends: false

- name: Read the state for a drift check
  tuning_state:
    state: read
  register: llmtune_state
"""

RETURN = r"""
recorded:
  description: Whether this call added an entry (in check mode, whether it would).
  returned: state=present
  type: bool
entry:
  description: The stored entry (C(original)/C(recorded) for a key; C(existed)/C(backup)/C(recorded) for a file).
  returned: state=present
  type: dict
  sample: {"original": "always [madvise] never", "recorded": "2026-01-01T00:00:00Z"}
backup:
  description: Path of the backup copy, or null when the file did not exist.
  returned: when O(file) is given
  type: str
  sample: /var/lib/llmtune/backup/etc/fstab
packages:
  description: The packages of O(packages) recorded by this call (not installed, not recorded before).
  returned: when O(packages) is given
  type: list
  elements: str
  sample: [nginx]
state:
  description: The whole state (C(version), C(settings), C(files), C(packages)).
  returned: state=read
  type: dict
"""

import re

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.llmtune_state import (DEFAULT_STATE_PATH, backup_file, load_state, record_original,
                                                record_packages)


def package_installed(module, name):
    """Whether the distribution package ``name`` (str) is installed: dpkg-query(1) status "install ok installed", or
    on an RPM system rpm(8) -q succeeding. Fails the module when the host has neither tool."""
    dpkg_query = module.get_bin_path("dpkg-query")
    if dpkg_query:
        rc, out, _err = module.run_command([dpkg_query, "-W", "-f=${Status}", name])
        return rc == 0 and out.endswith(" installed")
    rpm = module.get_bin_path("rpm")
    if rpm:
        return module.run_command([rpm, "-q", name])[0] == 0
    module.fail_json(msg="tuning_state packages: neither dpkg-query nor rpm on this host")


def packages_added(module, names, recommends=True):
    """The packages installing ``names`` (list of str) adds: those not installed, and on apt hosts the dependencies
    apt would install with them (apt-get(8) -s install, its "Inst" lines; with their recommended packages unless
    ``recommends`` is false). Where apt cannot tell (no apt-get, an unknown name), the names alone: the install that
    follows fails on its own with apt's message."""
    absent = [name for name in names if not package_installed(module, name)]
    apt_get = module.get_bin_path("apt-get")
    if absent and apt_get:
        flags = [] if recommends else ["--no-install-recommends"]
        rc, out, _err = module.run_command([apt_get, "-s", "-q", "install"] + flags + absent,
                                           environ_update={"LC_ALL": "C"})
        if rc == 0:
            return absent + re.findall(r"^Inst (\S+)", out, re.MULTILINE)
    return absent


def main():
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "default": DEFAULT_STATE_PATH},
            "state": {"type": "str", "choices": ["present", "read"], "default": "present"},
            "key": {"type": "str"},
            "original": {"type": "str"},
            "file": {"type": "path"},
            "packages": {"type": "list", "elements": "str"},
            "install_recommends": {"type": "bool", "default": True},
        },
        required_if=[("state", "present", ("key", "file", "packages"), True)],
        required_together=[("key", "original")],
        mutually_exclusive=[("key", "file", "packages")],
        supports_check_mode=True,
    )
    params = module.params
    try:
        if params["state"] == "read":
            module.exit_json(changed=False, state=load_state(params["path"]))
        if params["key"]:
            changed, entry = record_original(params["path"], params["key"], params["original"], module.check_mode)
            label = params["key"]
            result = {}
        elif params["packages"] is not None:
            added = packages_added(module, params["packages"], params["install_recommends"])
            recorded = record_packages(params["path"], added, module.check_mode)
            changed, entry, label = bool(recorded), {}, "packages " + " ".join(recorded)
            result = {"packages": recorded}
        else:
            changed, entry = backup_file(params["path"], params["file"], module.check_mode)
            label = params["file"]
            result = {"backup": entry["backup"]}
    except (OSError, ValueError) as err:
        module.fail_json(msg="llmtune state file %s: %s" % (params["path"], err))
    diff = {"before": "", "after": "%s recorded in %s\n" % (label, params["path"])} if changed else {}
    module.exit_json(changed=changed, recorded=changed, entry=entry, diff=diff, **result)


if __name__ == "__main__":
    main()
