#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: set or remove kernel parameters in one GRUB_CMDLINE_LINUX* variable of a grub defaults file."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kernel_cmdline
short_description: Set or remove kernel boot parameters in /etc/default/grub, idempotently
description:
  - Edits one variable, C(GRUB_CMDLINE_LINUX) or C(GRUB_CMDLINE_LINUX_DEFAULT), of a grub defaults file
    that grub-mkconfig sources with C(/bin/sh). Only that line is rewritten; every other byte of the file
    is kept.
  - Repeated assignments of the variable are merged into the last one, which holds the value the shell
    ends with (a later assignment may expand the earlier value, C(X="$X nosmt")); the earlier lines are
    removed. A merge always keeps a backup copy (RV(backup_file)) and is reported in RV(merged); the next
    run finds one line and changes nothing.
  - The value is read with POSIX sh quoting rules and split into parameters as the kernel does
    (C(lib/cmdline.c) next_arg; Documentation/admin-guide/kernel-parameters.rst). Parameters not named in
    O(set) or O(remove) keep their text and order. A parameter already present gets its new value in
    place (C(intel_idle.max_cstate=0) becomes C(=1)); later copies of it are dropped; new ones are
    appended. An equal set of parameters in another order is left unchanged. Names compare with C(-) and
    C(_) equal, as the kernel does (C(kernel/params.c) parameq).
  - Refuses, changing nothing and naming the line, a file the shell cannot source as it is (C(bash -n)
    fails on it or on one of its drop-ins), and a file it cannot edit safely - the variable assigned with
    C(+=), a command substitution or the expansion of another variable in the value, another command after
    the assignment, a line between two assignments that is not a plain assignment or reads the variable.
  - Never writes a file C(bash -n) rejects - the new text is checked before it replaces the file.
  - Reads the drop-ins C(<path>.d/*.cfg) that Debian's grub-mkconfig sources after the file, returns the
    effective values and warns when a drop-in overrides the edit.
  - Compares the wanted parameters with the running kernel's command line (C(/proc/cmdline)) and returns
    what a reboot would still change.
  - Does not regenerate grub.cfg or BLS entries; the C(grub) role does that per distribution.
  - Supports check mode and diff.
options:
  path:
    description: Grub defaults file. It must exist.
    type: path
    default: /etc/default/grub
  variable:
    description:
      - Variable to edit. C(GRUB_CMDLINE_LINUX) applies to every menu entry including recovery ones;
        C(GRUB_CMDLINE_LINUX_DEFAULT) only to the normal entries (C(/etc/grub.d/10_linux)).
    type: str
    choices: [GRUB_CMDLINE_LINUX, GRUB_CMDLINE_LINUX_DEFAULT]
    default: GRUB_CMDLINE_LINUX
  set:
    description:
      - Parameters to set, name to value. A null value gives a bare flag (C(nosmt)). Values are strings
        or integers; a YAML boolean (C(off) unquoted) is refused, quote it. A value with blanks is written
        in kernel double quotes.
    type: dict
    default: {}
  remove:
    description: Parameter names to remove, with any value. A name may not be in O(set) too.
    type: list
    elements: str
    default: []
  backup:
    description:
      - Keep a timestamped copy of the file next to it before changing it. A merge of repeated assignments
        keeps one whatever this option says.
    type: bool
    default: false
  dropin_dir:
    description:
      - Directory of drop-ins read (never edited) after the file, in C(*.cfg) glob order. When not given,
        O(path) followed by C(.d) (C(/etc/default/grub.d)).
    type: path
  running_cmdline:
    description: File with the running kernel's command line, used for RV(pending).
    type: path
    default: /proc/cmdline
notes:
  - Needs C(bash) on the host for the syntax check (C(bash -n), bash(1)).
  - Run C(update-grub) (Debian, Ubuntu) or C(grubby --update-kernel=ALL) (RHEL 8+ BLS entries) after a
    change; the new parameters act at the next boot.
seealso:
  - name: Kernel parameters
    description: The kernel's documentation of the command line.
    link: https://docs.kernel.org/admin-guide/kernel-parameters.html
  - name: GRUB simple configuration
    description: Variables of /etc/default/grub.
    link: https://www.gnu.org/software/grub/manual/grub/html_node/Simple-configuration.html
author: llmtune contributors
"""

EXAMPLES = r"""
- name: Limit C-states and set the THP default at boot
  kernel_cmdline:
    set:
      intel_idle.max_cstate: 1
      processor.max_cstate: 1
      transparent_hugepage: madvise
  register: cmdline

- name: Drop a parameter and add a bare flag to the normal entries only
  kernel_cmdline:
    variable: GRUB_CMDLINE_LINUX_DEFAULT
    set:
      nosoftlockup: null
    remove: [splash]
    backup: true
"""

RETURN = r"""
before:
  description: Value of the variable before the edit (shell quoting removed).
  returned: always
  type: str
  sample: "crashkernel=auto rhgb quiet intel_idle.max_cstate=0"
after:
  description: Value of the variable after the edit (in check mode, the value it would get).
  returned: always
  type: str
  sample: "crashkernel=auto rhgb quiet intel_idle.max_cstate=1"
effective:
  description:
    - Value of each GRUB_CMDLINE_LINUX* variable after the drop-ins, as grub-mkconfig will see it. Null
      when a drop-in computes it with a command substitution.
  returned: always
  type: dict
  sample: {"GRUB_CMDLINE_LINUX": "intel_idle.max_cstate=1", "GRUB_CMDLINE_LINUX_DEFAULT": "quiet"}
cmdline:
  description:
    - Parameters the normal menu entries will pass (C(GRUB_CMDLINE_LINUX GRUB_CMDLINE_LINUX_DEFAULT) after
      the drop-ins), without the C(root=) grub adds itself. Null when not computable.
  returned: always
  type: str
  sample: "intel_idle.max_cstate=1 quiet"
overridden_by:
  description:
    - Files whose assignment hides part of the edit - a drop-in that reassigns the variable, or the file
      assigning the other GRUB_CMDLINE_LINUX* variable with a later copy of a parameter (the last copy wins).
  returned: always
  type: list
  elements: str
  sample: ["/etc/default/grub.d/50-cloudimg-settings.cfg"]
params_set:
  description: O(set) formatted as kernel parameters, as C(grubby --args) takes them.
  returned: always
  type: list
  elements: str
  sample: ["intel_idle.max_cstate=1", "nosmt"]
pending:
  description:
    - What the running kernel's command line still lacks - C(name=value) or C(name) to add, C(-name) to
      remove; empty when the running kernel already matches. Order does not matter.
  returned: always
  type: list
  elements: str
  sample: ["intel_idle.max_cstate=1", "-splash"]
merged:
  description:
    - Assignments of the variable removed by merging repeated ones into the last, each as the file, its
      line number and the line's text. The last one, which keeps the shell's value, is not listed. Empty
      when there was one assignment.
  returned: always
  type: list
  elements: str
  sample: ['/etc/default/grub:3: GRUB_CMDLINE_LINUX="root=ZFS=rpool/ROOT/pve-1 console=tty0"']
backup_file:
  description: Path of the backup copy.
  returned: when the file changed and O(backup) is true or assignments were merged
  type: str
  sample: /etc/default/grub.12345.2026-01-01@00:00:00~
"""

import glob
import os
import re
import shlex
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.llmtune_cmdline import (
    GRUB_VARIABLES, CmdlineError, edit_params, evaluate_dropins, find_assignments, format_param, join_params,
    missing_params, read_assignment, replace_assignment, split_kernel_params)
from ansible.module_utils.llmtune_state import atomic_move_durably
from ansible.module_utils.llmtune_sysfs import read_text


def read_file(path):
    """Return a file's text, undecodable bytes kept as surrogates so a rewrite is byte-exact."""
    with open(path, "rb") as handle:
        return handle.read().decode("utf-8", "surrogateescape")


def dropin_files(dropin_dir):
    """Drop-ins grub-mkconfig sources after the defaults file, in its glob order (list of paths)."""
    return sorted(glob.glob(os.path.join(glob.escape(dropin_dir), "*.cfg")))


def plan(path, variable, wanted, remove, dropin_dir, running_cmdline):
    """Compute the edit without writing; return (old_text, new_text, result dict).

    Raises CmdlineError for a file or parameter that cannot be handled safely and OSError for an
    unreadable file. Warnings (override, merge, unknown value) are in result["warnings"].
    """
    old_text = read_file(path)
    assignments, before = find_assignments(old_text, variable, path)
    merged = ["%s: %s" % (found.where, found.line) for found in assignments[:-1]]
    old_params = split_kernel_params(before)
    new_params = edit_params(old_params, wanted, remove)
    after = before if [p.raw for p in new_params] == [p.raw for p in old_params] else join_params(new_params)
    new_text = old_text if after == before and not merged else replace_assignment(old_text, variable, after, path)

    values = {name: read_assignment(new_text, name, path) if name == variable else _lenient(new_text, name, path)
              for name in GRUB_VARIABLES}
    dropins = [(name, read_file(name)) for name in dropin_files(dropin_dir)]
    effective, assigned_by = evaluate_dropins(values, dropins)
    cmdline = None
    if None not in effective.values():
        cmdline = " ".join(effective[name] for name in GRUB_VARIABLES if effective[name])
    overridden_by, warnings = find_overrides(path, variable, wanted, remove, effective, assigned_by, cmdline)

    running = read_text("/", running_cmdline)
    if running is None:
        warnings.append("cannot read %s; every wanted parameter is reported pending" % running_cmdline)
    if merged:
        warnings.append("%s is assigned %d times; merged into %s (the value the shell ends with), removing %s"
                        % (variable, len(assignments), assignments[-1].where,
                           ", ".join(found.where for found in assignments[:-1])))
    result = dict(before=before, after=after, effective=effective, cmdline=cmdline,
                  params_set=[format_param(name, value) for name, value in wanted.items()],
                  overridden_by=overridden_by, pending=missing_params(running or "", wanted, remove),
                  merged=merged, warnings=warnings)
    return old_text, new_text, result


def find_overrides(path, variable, wanted, remove, effective, assigned_by, cmdline):
    """Return (files, warnings) for what hides the edit once grub-mkconfig has sourced the drop-ins.

    A drop-in that reassigns ``variable`` without the wanted parameters hides it; so does the other
    GRUB_CMDLINE_LINUX* variable when it carries a later copy of a parameter (the last copy wins).
    """
    if effective[variable] is None:
        return [], ["%s sets %s with a command substitution; its effect is not checked"
                    % (assigned_by[variable], variable)]
    lacking = missing_params(effective[variable], wanted, remove)
    if variable in assigned_by and lacking:
        return [assigned_by[variable]], ["%s overrides %s of %s: grub will use %r, which lacks %s"
                                         % (assigned_by[variable], variable, path, effective[variable],
                                            " ".join(lacking))]
    lacking = missing_params(cmdline, wanted, remove) if cmdline is not None else []
    if lacking:
        other = GRUB_VARIABLES[1 - GRUB_VARIABLES.index(variable)]
        source = assigned_by.get(other, path)
        return [source], ["%s in %s conflicts with the edit: the normal entries would lack %s"
                          % (other, source, " ".join(lacking))]
    return [], []


def _lenient(text, variable, path):
    """Value of the variable not being edited; None (unknown) when it is not a literal assignment."""
    try:
        return read_assignment(text, variable, path)
    except CmdlineError:
        return None


def unclosed_quote(lines):
    """Return ``(number, text)`` of the first line whose quotes do not close on it, or None.

    POSIX quoting as shlex reads it. A quote opened on one line pairs with one on a later line, so the
    line bash names at end of file is rarely the one that lacks its quote; this one usually is.
    """
    for number, line in enumerate(lines, 1):
        try:
            shlex.split(line, comments=True)
        except ValueError:
            return number, line
    return None


def bash_syntax_error(module, path, shown_as=None):
    """Return why ``bash -n`` rejects the file ``path``, naming the line, or None when it accepts it.

    ``bash -n`` reads the file as a shell sourcing it would, without running anything (bash(1),
    ``set -n``). The message starts ``<shown_as or path>:<line>: <text of the line>:`` - the first line
    whose quotes do not close when there is one, else the line bash names.
    """
    bash = module.get_bin_path("bash", required=True)
    rc, _, err = module.run_command([bash, "-n", path], environ_update={"LC_ALL": "C"})
    if rc == 0:
        return None
    complaint = (err.strip().splitlines() or ["exit status %d" % rc])[0]
    complaint = re.sub(r"^.*?: (line \d+: )", r"\1", complaint)
    lines = read_file(path).splitlines()
    unclosed = unclosed_quote(lines)
    if unclosed:
        return "%s:%d: %s: quote not closed on its line (bash -n: %s)" % ((shown_as or path,) + unclosed + (complaint,))
    match = re.match(r"line (\d+): ", complaint)
    if not match:
        return "%s: bash -n: %s" % (shown_as or path, complaint)
    number = int(match.group(1))
    text = lines[number - 1] if 0 < number <= len(lines) else "(end of file)"
    return "%s:%d: %s: bash -n: %s" % (shown_as or path, number, text, complaint[match.end():])


def write_file(module, path, text, backup):
    """Replace ``path`` atomically with ``text`` once ``bash -n`` accepts it; in check mode only check it.

    With ``backup`` (bool) a timestamped copy is kept next to ``path`` first; returns its path, or None.
    AnsibleModule.atomic_move keeps the file's owner, mode and SELinux label. Fails the module, leaving
    ``path`` untouched, when the new text would not pass ``bash -n``.
    """
    fd, tmp = tempfile.mkstemp(dir=None if module.check_mode else os.path.dirname(path), prefix=".kernel_cmdline.")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(text.encode("utf-8", "surrogateescape"))
        error = bash_syntax_error(module, tmp, shown_as=path)
        if error:
            module.fail_json(msg="refusing to write %s, nothing changed: the new text would not pass bash -n (%s)"
                             % (path, error))
        if module.check_mode:
            return None
        backup_file = module.backup_local(path) if backup else None
        atomic_move_durably(module, tmp, path)
        return backup_file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def main():
    """Run the module: validate options, plan the edit, write it unless in check mode."""
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", default="/etc/default/grub"),
            variable=dict(type="str", choices=list(GRUB_VARIABLES), default="GRUB_CMDLINE_LINUX"),
            set=dict(type="dict", default={}),
            remove=dict(type="list", elements="str", default=[]),
            backup=dict(type="bool", default=False),
            dropin_dir=dict(type="path"),
            running_cmdline=dict(type="path", default="/proc/cmdline"),
        ),
        supports_check_mode=True,
    )
    params = module.params
    path = params["path"]
    if not os.path.isfile(path):
        module.fail_json(msg="%s does not exist or is not a regular file" % path)
    dropin_dir = params["dropin_dir"] or path + ".d"
    for source in [path] + dropin_files(dropin_dir):
        error = bash_syntax_error(module, source)
        if error:
            module.fail_json(msg="%s, nothing changed: the shell cannot source %s as it is" % (error, source))
    try:
        old_text, new_text, result = plan(path, params["variable"], params["set"], params["remove"],
                                          dropin_dir, params["running_cmdline"])
    except (CmdlineError, OSError) as exc:
        module.fail_json(msg=str(exc))
    changed = new_text != old_text
    if changed and module._diff:
        result["diff"] = dict(before=old_text, after=new_text, before_header=path, after_header=path)
    if changed:
        backup_file = write_file(module, path, new_text, params["backup"] or bool(result["merged"]))
        if backup_file:
            result["backup_file"] = backup_file
    for warning in result.pop("warnings"):
        module.warn(warning)
    module.exit_json(changed=changed, **result)


if __name__ == "__main__":
    main()
