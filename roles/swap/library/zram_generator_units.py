#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: the units zram-generator makes from the host's configuration, asked of the generator itself."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: zram_generator_units
short_description: Run zram-generator in its test mode and list the swap and mount units it would make
description:
  - Read only. Copies zram-generator's configuration (C(zram-generator.conf) and C(zram-generator.conf.d/*.conf)
    under C(/etc/systemd), C(/run/systemd), C(/usr/local/lib/systemd), C(/usr/lib/systemd); a file masked by a
    link to C(/dev/null) stays one), C(/proc/meminfo) and C(/proc/cmdline) (its C(systemd.zram=) option) into a
    temporary root, puts O(dropin_content) at O(dropin_path) there when given, and runs the installed generator on
    it in its test mode (C(ZRAM_GENERATOR_ROOT), zram-generator(8); no device is touched, containers are not
    skipped). The units it writes are the answer, whatever keys its version reads (zram-generator 0.3 knows no
    C(zram-size); C(zram-fraction) and C(max-zram-size) override it, zram-generator.conf(5)).
  - Supports check mode (it changes nothing in either mode); the drop-in is checked before it is written.
options:
  dropin_path:
    description: Path (on the host) of a drop-in to check in place of the file there, with O(dropin_content).
    type: path
  dropin_content:
    description: Text of that drop-in.
    type: str
  generator:
    description: The zram-generator program; by default the installed one (C(/usr/lib/systemd/system-generators),
      C(/lib/systemd/system-generators) under O(sysroot)).
    type: path
  sysroot:
    description: Directory the configuration and C(/proc) files are read under (C(/) on a live system).
    type: path
    default: /
author: llmtune contributors
"""

EXAMPLES = r"""
- name: Check that zram-generator makes no swap with the drop-in
  zram_generator_units:
    dropin_path: /etc/systemd/zram-generator.conf.d/zz-llmtune.conf
    dropin_content: "{{ lookup('ansible.builtin.template', 'zram-generator.conf.j2') }}"
  register: zram_units

- name: Fail while it still does
  ansible.builtin.assert:
    that: zram_units.swap_units == []
"""

RETURN = r"""
installed:
  description: Whether a zram-generator program was found; false leaves the unit lists empty.
  returned: always
  type: bool
generator:
  description: The program run.
  returned: always
  type: str
  sample: /usr/lib/systemd/system-generators/zram-generator
swap_units:
  description: Swap units it makes (C(dev-zramN.swap)).
  returned: always
  type: list
  elements: str
  sample: [dev-zram0.swap]
mount_units:
  description: Mount units it makes (zram devices formatted as file systems, such as a compressed C(/tmp)).
  returned: always
  type: list
  elements: str
config_files:
  description: Configuration files copied, the drop-in included.
  returned: always
  type: list
  elements: str
"""

import glob
import os
import shutil
import subprocess
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.llmtune_swap import ZRAM_CONFIG_DIRS
from ansible.module_utils.llmtune_sysfs import sysroot_path

GENERATORS = ("/usr/lib/systemd/system-generators/zram-generator", "/lib/systemd/system-generators/zram-generator")


def copy_config(sysroot, root, dropin_path=None, dropin_content=None):
    """Copy the generator's inputs from ``sysroot`` into the test root ``root``; return the config paths copied."""
    copied = []
    for directory in ZRAM_CONFIG_DIRS:
        paths = [directory + "/zram-generator.conf"] + [
            directory + "/zram-generator.conf.d/" + os.path.basename(p)
            for p in sorted(glob.glob(sysroot_path(sysroot, directory + "/zram-generator.conf.d/*.conf")))]
        for path in paths:
            source = sysroot_path(sysroot, path)
            if path == dropin_path or not os.path.lexists(source):
                continue
            target = sysroot_path(root, path)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            # A link to /dev/null masks a file of lower precedence: copied as a link.
            shutil.copy2(source, target, follow_symlinks=not os.path.islink(source))
            copied.append(path)
    if dropin_path:
        target = sysroot_path(root, dropin_path)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "w", encoding="utf-8") as handle:
            handle.write(dropin_content or "")
        copied.append(dropin_path)
    os.makedirs(os.path.join(root, "proc"))
    for name in ("meminfo", "cmdline"):
        source = sysroot_path(sysroot, "/proc/" + name)
        if os.path.exists(source):
            with open(source, "rb") as handle, open(os.path.join(root, "proc", name), "wb") as out:
                out.write(handle.read())
    return copied


def generated_units(outdir):
    """Return ``(swap_units, mount_units)`` a generator wrote into ``outdir`` (its own unit files, sorted)."""
    names = sorted(name for name in os.listdir(outdir) if os.path.isfile(os.path.join(outdir, name)))
    return [n for n in names if n.endswith(".swap")], [n for n in names if n.endswith(".mount")]


def run(sysroot, generator, dropin_path=None, dropin_content=None):
    """Run ``generator`` in test mode on a copy of ``sysroot``'s configuration; return the result fields.

    Raises RuntimeError with the generator's message when it fails.
    """
    with tempfile.TemporaryDirectory(prefix="llmtune-zram-") as work:
        root, outdir = os.path.join(work, "root"), os.path.join(work, "out")
        os.makedirs(outdir)
        files = copy_config(sysroot, root, dropin_path, dropin_content)
        env = dict(os.environ, ZRAM_GENERATOR_ROOT=root, LC_ALL="C")
        done = subprocess.run([generator, outdir], env=env, capture_output=True, text=True, timeout=60, check=False)
        if done.returncode != 0:
            raise RuntimeError("%s (test mode) failed with status %d: %s"
                               % (generator, done.returncode, (done.stderr or done.stdout).strip()))
        swap, mount = generated_units(outdir)
    return {"installed": True, "generator": generator, "swap_units": swap, "mount_units": mount,
            "config_files": files}


def main():
    module = AnsibleModule(
        argument_spec={
            "dropin_path": {"type": "path"},
            "dropin_content": {"type": "str"},
            "generator": {"type": "path"},
            "sysroot": {"type": "path", "default": "/"},
        },
        required_together=[("dropin_path", "dropin_content")],
        supports_check_mode=True,
    )
    params = module.params
    generator = params["generator"] or next(
        (sysroot_path(params["sysroot"], path) for path in GENERATORS
         if os.access(sysroot_path(params["sysroot"], path), os.X_OK)), None)
    if generator is None:
        module.exit_json(changed=False, installed=False, generator=None, swap_units=[], mount_units=[],
                         config_files=[])
    try:
        result = run(params["sysroot"], generator, params["dropin_path"], params["dropin_content"])
    except (OSError, RuntimeError, subprocess.SubprocessError) as error:
        module.fail_json(msg=str(error))
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
