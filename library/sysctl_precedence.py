#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: make our sysctl.d file win at boot over every file applied after it."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sysctl_precedence
short_description: Make a sysctl.d file of ours win at boot over the files applied after it
description:
  - Finds every assignment that gives one of O(settings) another value in a file applied after O(path) -
    by systemd-sysctl at boot (files C(*.conf) of C(/etc/sysctl.d), C(/run/sysctl.d),
    C(/usr/local/lib/sysctl.d), C(/usr/lib/sysctl.d), C(/lib/sysctl.d), a name in an earlier directory
    masking the same name in a later one, applied sorted by file name; sysctl.d(5)) or by
    C(sysctl --system), which reads C(/etc/sysctl.conf) once more, last (sysctl(8)).
  - Makes ours win. An assignment in a file under C(/etc) (the administrator's, C(/etc/sysctl.conf)
    included, also when linked as C(/etc/sysctl.d/99-sysctl.conf)) is commented out with the prefix
    C(#llmtune# ). A file elsewhere (a package's, in C(/usr/lib/sysctl.d) or C(/run/sysctl.d)) is not
    edited; a copy with the assignment commented out is written to C(/etc/sysctl.d) under the same name,
    which masks it (sysctl.d(5)). Each file changed or created is recorded in the llmtune state file
    first (backup, or "did not exist"), so a rollback puts it back or removes it.
  - Removes O(legacy_path), the name an earlier version of the role wrote the file under.
  - Glob keys are not looked at; they never apply to a key that an explicit assignment sets.
  - Supports check mode and diff.
options:
  path:
    description: Our file, in C(/etc/sysctl.d) (where it masks every other directory). It need not exist yet.
    type: str
    required: true
  settings:
    description: Keys our file sets (C(.) or C(/) separators) and their values.
    type: dict
    required: true
  legacy_path:
    description: Former path of our file, removed when present.
    type: str
  state_path:
    description: llmtune state file where the files changed or created are recorded.
    type: path
    default: /var/lib/llmtune/state.json
  sysroot:
    description: Directory the paths are resolved under (C(/) for the live system; a fixture tree in tests).
    type: path
    default: /
author: llmtune contributors
"""

EXAMPLES = r"""
- name: Make the swappiness file win at boot
  sysctl_precedence:
    path: /etc/sysctl.d/zz-llmtune-swap.conf
    settings:
      vm.swappiness: 1
    legacy_path: /etc/sysctl.d/90-llmtune-swap.conf
"""

RETURN = r"""
overrides:
  description: The assignments found applied after ours with another value, before any change.
  returned: always
  type: list
  elements: str
  sample: ["/etc/sysctl.conf:28: vm.swappiness = 60 (applied after ours by sysctl --system)"]
fixed:
  description: One entry per file changed (in check mode, that would be) - C(file), C(action)
    (C(commented) in place, or C(masked) by a copy in /etc/sysctl.d), C(source) (the file read) and
    C(lines) (line numbers commented).
  returned: always
  type: list
  elements: dict
  sample: [{"file": "/etc/sysctl.conf", "action": "commented", "source": "/etc/sysctl.conf", "lines": [28]}]
legacy_removed:
  description: Whether O(legacy_path) was (in check mode, would be) removed.
  returned: always
  type: bool
"""

import os
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.llmtune_state import DEFAULT_STATE_PATH, atomic_move_durably, backup_file
from ansible.module_utils.llmtune_sysctl import comment_lines, describe, overriding_assignments
from ansible.module_utils.llmtune_sysfs import sysroot_path

ETC_SYSCTL_D = "/etc/sysctl.d"


def plan_fixes(overrides):
    """Group ``overrides`` by the file to write; return ``{target: {action, source, lines}}``.

    A file under /etc is edited where its symlinks lead; any other is masked by a copy of the same name
    in /etc/sysctl.d.
    """
    fixes = {}
    for assignment in overrides:
        if assignment["real"].startswith("/etc/"):
            target, action = assignment["real"], "commented"
        else:
            target, action = "%s/%s" % (ETC_SYSCTL_D, os.path.basename(assignment["file"])), "masked"
        fix = fixes.setdefault(target, {"file": target, "action": action, "source": assignment["real"], "lines": []})
        if assignment["line"] not in fix["lines"]:
            fix["lines"].append(assignment["line"])
    return fixes


def new_text(sysroot, fix):
    """Return ``(old text of the target, new text)`` for one entry of :func:`plan_fixes`."""
    with open(sysroot_path(sysroot, fix["source"]), encoding="utf-8", errors="surrogateescape") as handle:
        source = handle.read()
    text = comment_lines(source, fix["lines"])
    if fix["action"] == "commented":
        return source, text
    header = ("# llmtune: masks %s (sysctl.d(5): a file in /etc/sysctl.d hides the same name in later\n"
              "# directories); the assignments that would override llmtune's are commented out.\n" % fix["source"])
    return "", header + text


def write(module, path, text):
    """Replace ``path`` atomically (owner, mode and SELinux label kept; a new file gets mode 0644)."""
    existed = os.path.exists(path)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".sysctl_precedence.")
    with os.fdopen(fd, "wb") as handle:
        handle.write(text.encode("utf-8", "surrogateescape"))
    if not existed:
        os.chmod(tmp, 0o644)
    atomic_move_durably(module, tmp, path)


def main():
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "str", "required": True},
            "settings": {"type": "dict", "required": True},
            "legacy_path": {"type": "str"},
            "state_path": {"type": "path", "default": DEFAULT_STATE_PATH},
            "sysroot": {"type": "path", "default": "/"},
        },
        supports_check_mode=True,
    )
    params = module.params
    sysroot, path = params["sysroot"], params["path"]
    if os.path.dirname(path) != ETC_SYSCTL_D or not path.endswith(".conf"):
        module.fail_json(msg="path must be a .conf file in %s, where it masks every other directory; got %s"
                         % (ETC_SYSCTL_D, path))
    overrides = overriding_assignments(sysroot, path, params["settings"])
    fixes = list(plan_fixes(overrides).values())
    legacy = params["legacy_path"]
    legacy_present = bool(legacy) and os.path.lexists(sysroot_path(sysroot, legacy))
    diffs = []
    try:
        texts = [new_text(sysroot, fix) for fix in fixes]
        for fix, (before, after) in zip(fixes, texts):
            diffs.append({"before": before, "after": after, "before_header": fix["file"], "after_header": fix["file"]})
            if not module.check_mode:
                full = sysroot_path(sysroot, fix["file"])
                backup_file(params["state_path"], full)
                write(module, full, after)
        if legacy_present:
            diffs.append({"before": "%s present\n" % legacy, "after": "%s removed\n" % legacy})
            if not module.check_mode:
                os.unlink(sysroot_path(sysroot, legacy))
    except (OSError, ValueError) as exc:
        module.fail_json(msg="sysctl precedence of %s: %s" % (path, exc))
    for fix in fixes:
        module.warn("%s: %s so that %s wins at boot" % (
            fix["file"], "commented out line %s" % ", ".join(map(str, fix["lines"])) if fix["action"] == "commented"
            else "masks %s, line %s commented out" % (fix["source"], ", ".join(map(str, fix["lines"]))), path))
    module.exit_json(changed=bool(fixes) or legacy_present, overrides=[describe(a) for a in overrides], fixed=fixes,
                     legacy_removed=legacy_present, diff=diffs)


if __name__ == "__main__":
    main()
