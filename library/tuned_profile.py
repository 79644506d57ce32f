#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: install a tuned child profile carrying our values on top of the active one, and select it."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: tuned_profile
short_description: Put a tuned child profile with our values on top of the active profile and select it
description:
  - tuned applies its active profile again whenever it starts (at boot, on a profile switch), overwriting values set
    by other tools (THP, cpufreq governor, PM QoS latency, sysctls). This module writes a child profile
    C(<profile_dir>/<name>/tuned.conf) whose C(include=) is the profile tuned ran before (so its other tuning stays)
    and whose sections carry O(sections), and selects it.
  - The profile tuned ran before is read from C(tuned-adm active) (C(Current active profile), C(Preset profile) when
    the daemon is stopped, less the C(Current post-loaded profile)) and recorded once in the llmtune state file as
    setting C(tuned.profile) (the names separated by spaces, empty for none), so later runs keep including it and
    C(playbooks/rollback.yml) selects it again. The profile file (or its new directory),
    C(/etc/tuned/active_profile) and C(/etc/tuned/profile_mode) are backed up in the state file before they change.
  - Selection runs C(tuned-adm profile <name>) when the daemon runs; when it is stopped (but enabled), the module
    writes C(active_profile) and C(profile_mode) as C(tuned-adm) does, so the profile applies at the next start
    without starting the daemon now.
  - A post-loaded profile (C(/etc/tuned/post_loaded_profile)) is applied after the selected one and may override
    our values; it is reported as a warning.
  - Supports check mode and diff.
version_added: "0.2.0"
author: llmtune contributors
options:
  name:
    description: Name of the child profile.
    type: str
    default: llmtune
  sections:
    description:
      - Profile sections as a dict of section name to a dict of option name to value, for example section C(vm)
        with C(transparent_hugepages=always) and section C(cpu) with C(governor=performance) and C(force_latency=2).
      - Booleans are written as C(1) and C(0). Options of a section replace the same options of the included profile.
    type: dict
    required: true
  sysctl_files:
    description: sysctl.d(5) files whose C(key = value) lines are added to the C([sysctl]) section.
    type: list
    elements: path
    default: []
  profile_dir:
    description:
      - Directory tuned reads user profiles from. Default the last directory of C(profile_dirs) in
        C(/etc/tuned/tuned-main.conf), else C(/etc/tuned/profiles) when it exists (tuned 2.23 and later,
        Fedora, RHEL 10), else C(/etc/tuned).
    type: path
  state_path:
    description: llmtune state file.
    type: path
    default: /var/lib/llmtune/state.json
notes:
  - Fails with a message when C(tuned-adm) is missing or C(tuned-adm profile) fails.
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
seealso:
  - name: tuned.conf(5)
    description: Profile format, C(include=) and the plugin sections.
    link: https://man7.org/linux/man-pages/man5/tuned.conf.5.html
  - name: tuned-adm(8)
    description: C(tuned-adm active), C(tuned-adm profile).
    link: https://man7.org/linux/man-pages/man8/tuned-adm.8.html
"""

EXAMPLES = r"""
- name: Keep THP, governor and C-state latency when tuned starts
  tuned_profile:
    sections:
      vm: {transparent_hugepages: always, transparent_hugepage.defrag: madvise}
      cpu: {governor: performance, force_latency: 2}
    sysctl_files: [/etc/sysctl.d/90-llmtune-swap.conf]
"""

RETURN = r"""
previous:
  description: Profiles tuned ran before the first change (the recorded C(tuned.profile)), space-separated.
  returned: always
  type: str
  sample: throughput-performance
active:
  description: Profiles C(tuned-adm active) showed before this run, without post-loaded ones.
  returned: always
  type: list
  elements: str
post_loaded:
  description: Post-loaded profiles, applied after the selected one.
  returned: always
  type: list
  elements: str
running:
  description: Whether the tuned daemon runs.
  returned: always
  type: bool
file:
  description: The profile file.
  returned: always
  type: str
  sample: /etc/tuned/llmtune/tuned.conf
content:
  description: The profile as rendered.
  returned: always
  type: str
file_changed:
  description: Whether the profile file was (or in check mode would be) written.
  returned: always
  type: bool
selection_changed:
  description: Whether the profile was (or would be) selected.
  returned: always
  type: bool
"""

import os
import re

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.llmtune_state import backup_file, load_state, record_original, write_atomic

STATE_KEY = "tuned.profile"
TUNED_MAIN_CONF = "/etc/tuned/tuned-main.conf"
ACTIVE_PROFILE = "/etc/tuned/active_profile"
PROFILE_MODE = "/etc/tuned/profile_mode"


def parse_active(text):
    """Parse ``tuned-adm active`` output (tuned/admin/admin.py) into profiles, post-loaded profiles and daemon state.

    Returns ``{"profiles": [...], "post_loaded": [...], "running": bool}``. The active line lists the post-loaded
    profile too (``Current active profile: throughput-performance virtual-guest`` then ``Current post-loaded
    profile: virtual-guest``); it is removed from ``profiles``. ``No current active profile.`` gives no profiles;
    a stopped daemon prints ``Preset profile:`` lines instead.
    """
    lines = {}
    for line in (text or "").splitlines():
        label, sep, value = line.partition(":")
        if sep:
            lines[label.strip()] = value.split()
    post_loaded = lines.get("Current post-loaded profile", lines.get("Preset post-loaded profile", []))
    profiles = lines.get("Current active profile", lines.get("Preset profile", []))
    return {"profiles": [name for name in profiles if name not in post_loaded], "post_loaded": post_loaded,
            "running": "tuned daemon is not running" not in (text or "")}


def parse_sysctl_conf(text):
    """Return ``{key: value}`` of a sysctl.d(5) file: ``key = value`` lines; ``#``/``;`` comments; a leading ``-``
    (ignore a failure) is dropped."""
    settings = {}
    for line in (text or "").splitlines():
        line = line.strip()
        if not line or line[0] in "#;" or "=" not in line:
            continue
        key, _, value = line.partition("=")
        settings[key.strip().lstrip("-")] = value.strip()
    return settings


def option_text(value):
    """Return a profile option value as tuned reads it: booleans as 1/0, anything else as text."""
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def render_profile(name, base, sections):
    """Return the tuned.conf text of profile ``name`` including ``base`` (list of names) with ``sections``.

    Sections and options are sorted so the text only changes when a value does (tuned.conf(5): ``[main]``
    ``include=`` takes profiles separated by commas).
    """
    lines = ["# llmtune: the values of its tuning roles on top of the profile tuned ran before",
             "# (playbooks/rollback.yml selects that profile again and removes this one).",
             "[main]",
             "summary=%s: CPU inference tuning%s" % (name, " on top of " + ", ".join(base) if base else "")]
    if base:
        lines.append("include=" + ",".join(base))
    for section in sorted(sections):
        if sections[section]:
            lines += ["", "[%s]" % section]
            lines += ["%s=%s" % (option, option_text(value)) for option, value in sorted(sections[section].items())]
    return "\n".join(lines) + "\n"


def include_of(text):
    """Return the profiles of the ``include=`` line of a tuned.conf text ([] when none)."""
    for line in (text or "").splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == "include":
            return [name for name in re.split(r"\s*[,;]\s*", value.strip()) if name]
    return []


def user_profile_dir(main_conf, profiles_dir_exists):
    """Return the directory for a user profile: the last (winning) directory of ``profile_dirs`` in the
    tuned-main.conf text ``main_conf``, else ``/etc/tuned/profiles`` when ``profiles_dir_exists`` (tuned >= 2.23
    moved user profiles there), else ``/etc/tuned``."""
    for line in (main_conf or "").splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == "profile_dirs":
            dirs = [d for d in re.split(r"\s*[,;]\s*", value.strip()) if d]
            if dirs:
                return dirs[-1]
    return "/etc/tuned/profiles" if profiles_dir_exists else "/etc/tuned"


def read(path):
    """Return the text of ``path``, or None when it does not exist."""
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def main():
    module = AnsibleModule(argument_spec={
        "name": {"type": "str", "default": "llmtune"},
        "sections": {"type": "dict", "required": True},
        "sysctl_files": {"type": "list", "elements": "path", "default": []},
        "profile_dir": {"type": "path"},
        "state_path": {"type": "path", "default": "/var/lib/llmtune/state.json"},
    }, supports_check_mode=True)
    params, check = module.params, module.check_mode
    name = params["name"]
    adm = module.get_bin_path("tuned-adm", required=True)
    # Exits 1 for "No current active profile.", which parse_active reads as no profile.
    out, err = module.run_command([adm, "active"])[1:]
    active = parse_active(out + err)
    directory = params["profile_dir"] or user_profile_dir(read(TUNED_MAIN_CONF), os.path.isdir("/etc/tuned/profiles"))
    path = os.path.join(directory, name, "tuned.conf")
    existing = read(path)

    sections = {section: dict(options or {}) for section, options in params["sections"].items()}
    for sysctl_file in params["sysctl_files"]:
        sections.setdefault("sysctl", {}).update(parse_sysctl_conf(read(sysctl_file)))
    try:
        state = load_state(params["state_path"])
        if STATE_KEY in state["settings"]:
            previous = state["settings"][STATE_KEY]["original"]
        else:
            # Ours already active with no record (state file lost): the profile we included is the one before.
            before = include_of(existing) if name in active["profiles"] else active["profiles"]
            previous = record_original(params["state_path"], STATE_KEY, " ".join(before), check)[1]["original"]
        content = render_profile(name, previous.split(), sections)
        file_changed = content != existing
        selection_changed = active["profiles"] != [name]
        if file_changed and not check:
            # A new profile directory is recorded as created, so a rollback removes it whole.
            backup_file(params["state_path"], path if os.path.isdir(os.path.dirname(path)) else os.path.dirname(path))
            os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
            write_atomic(path, content)
        if selection_changed and not check:
            for tuned_file in (ACTIVE_PROFILE, PROFILE_MODE):
                backup_file(params["state_path"], tuned_file)
            if not active["running"]:
                write_atomic(ACTIVE_PROFILE, name + "\n")
                write_atomic(PROFILE_MODE, "manual\n")
        # A running daemon reads a profile when it is selected: select again after the file changed.
        if (selection_changed or file_changed) and active["running"] and not check:
            rc, out, err = module.run_command([adm, "profile", name])
            if rc != 0:
                module.fail_json(msg="tuned-adm profile %s failed: %s" % (name, (err or out).strip()))
    except (OSError, ValueError) as error:
        module.fail_json(msg="tuned profile %s: %s" % (path, error))
    if active["post_loaded"]:
        module.warn("tuned post-loaded profile %s is applied after %s and may override its values"
                    % (" ".join(active["post_loaded"]), name))
    diff = []
    if file_changed:
        diff.append({"before_header": path, "after_header": path, "before": existing or "", "after": content})
    if selection_changed:
        diff.append({"before_header": "tuned active profile", "after_header": "tuned active profile",
                     "before": " ".join(active["profiles"]) + "\n", "after": name + "\n"})
    module.exit_json(changed=file_changed or selection_changed, previous=previous, active=active["profiles"],
                     post_loaded=active["post_loaded"], running=active["running"], file=path, content=content,
                     file_changed=file_changed, selection_changed=selection_changed, diff=diff)


if __name__ == "__main__":
    main()
