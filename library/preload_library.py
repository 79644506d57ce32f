#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: find a shared library in its package's file list, and prove a process has it mapped."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: preload_library
short_description: Find a library for LD_PRELOAD in its package's file list and check a process has it mapped
description:
  - Finds the file O(library) (a file name such as C(libjemalloc.so.2)) in the file list of the installed package
    O(package), as the distribution installed it, instead of building the path from the machine name. Debian's
    multiarch directory is not C(uname -m) (C(ppc64le) installs into C(powerpc64le-linux-gnu), C(armv7l) into
    C(arm-linux-gnueabihf)); RPM distributions use C(/usr/lib64) or C(/usr/lib).
  - On dpkg systems the list comes from C(dpkg-query -L <package>:<native architecture>) (C(dpkg --print-architecture));
    the architecture qualifier keeps the query unambiguous when a foreign-architecture instance is installed too.
    On RPM systems from C(rpm -ql <package>).
  - The file must exist and be an ELF object of the same class and machine as the Python running this module (the
    host's own userland); of several listed files (RPM multilib) the first such one is used. The dynamic loader
    ignores a preload it cannot load (missing file, other class or machine) with only a message on stderr, so a
    wrong path would silently run the default allocator.
  - With O(pid), also reads C(/proc/<pid>/maps) (man 5 proc) and fails unless the library is mapped in that
    process, so that nothing is reported as running with the library before it is.
  - Changes nothing on the host.
version_added: "0.2.0"
author: llmtune contributors
options:
  package:
    description: Installed package holding the library, for example C(libjemalloc2) (Debian) or C(jemalloc) (EPEL).
    type: str
    required: true
  library:
    description: File name of the library as the package installs it, for example C(libjemalloc.so.2).
    type: str
    required: true
  pid:
    description:
      - Process that must have the library mapped, for example the C(MainPID) of a service that runs with
        C(LD_PRELOAD). A file replaced on disk since the process started (shown C((deleted)) in the maps) counts
        as mapped, with a warning.
    type: int
notes:
  - Fails with a message when neither C(dpkg-query) nor C(rpm) is installed, when the package is not installed, when
    its file list has no usable O(library), or when O(pid) does not have it mapped.
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
seealso:
  - name: ld.so(8)
    description: LD_PRELOAD and the loader's handling of objects it cannot preload.
    link: https://man7.org/linux/man-pages/man8/ld.so.8.html
  - name: proc(5)
    description: The format of /proc/pid/maps.
    link: https://man7.org/linux/man-pages/man5/proc_pid_maps.5.html
"""

EXAMPLES = r"""
- name: Find jemalloc as the distribution installed it
  preload_library:
    package: libjemalloc2
    library: libjemalloc.so.2
  register: jemalloc

- name: Check the running service has it mapped
  preload_library:
    package: libjemalloc2
    library: libjemalloc.so.2
    pid: "{{ service.status.MainPID }}"
"""

RETURN = r"""
file:
  description: The library as listed by the package (the value for LD_PRELOAD).
  returned: always
  type: str
  sample: /usr/lib/powerpc64le-linux-gnu/libjemalloc.so.2
realpath:
  description: RV(file) with symbolic links resolved, the name C(/proc/<pid>/maps) shows.
  returned: always
  type: str
  sample: /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4.5.10
manager:
  description: C(dpkg) or C(rpm), whose file list was read.
  returned: always
  type: str
mapped:
  description: True when O(pid) has the library mapped (the module fails otherwise).
  returned: when O(pid) is given
  type: bool
"""

import os
import sys

from ansible.module_utils.basic import AnsibleModule

# ELF e_ident[EI_CLASS] and e_machine values (elf(5), include/uapi/linux/elf-em.h) named in messages.
ELF_CLASSES = {1: "32-bit", 2: "64-bit"}
ELF_MACHINES = {3: "x86", 8: "MIPS", 20: "PowerPC", 21: "PowerPC64", 22: "S/390", 40: "ARM", 62: "x86-64",
                183: "AArch64", 243: "RISC-V", 258: "LoongArch"}


class PreloadError(Exception):
    """A library that cannot be preloaded or is not mapped (the message is shown to the operator)."""


def file_list_command(manager, package, dpkg_arch=None):
    """Return the argv listing the files of installed ``package`` for ``manager`` (``dpkg`` or ``rpm``).

    dpkg: ``dpkg-query -L <package>:<dpkg_arch>``; without the qualifier dpkg-query refuses a package installed
    for two architectures ("ambiguous package name ... with more than one installed instance").
    """
    if manager == "dpkg":
        return ["dpkg-query", "-L", "%s:%s" % (package, dpkg_arch)]
    return ["rpm", "-ql", package]


def library_candidates(file_list, library):
    """Return the paths of ``file_list`` (text, one path a line, as dpkg-query -L / rpm -ql print) named ``library``.

    Order is kept; directories such as ``/.`` and files whose name only starts with ``library`` are not matched.
    """
    return [line.strip() for line in (file_list or "").splitlines()
            if line.strip().startswith("/") and os.path.basename(line.strip()) == library]


def elf_identity(header):
    """Return ``(class, machine)`` (ints) of the first 20 bytes of an ELF file, or None when not ELF (elf(5))."""
    if len(header) < 20 or header[:4] != b"\x7fELF":
        return None
    byteorder = "little" if header[5] == 1 else "big"
    return header[4], int.from_bytes(header[18:20], byteorder)


def read_elf_identity(path):
    """Return ``elf_identity`` of the file at ``path``; None when unreadable or not ELF."""
    try:
        with open(path, "rb") as handle:
            return elf_identity(handle.read(20))
    except OSError:
        return None


def describe_identity(identity):
    """Return e.g. ``64-bit PowerPC64`` for an ``elf_identity`` result."""
    return "%s %s" % (ELF_CLASSES.get(identity[0], "class %d" % identity[0]),
                      ELF_MACHINES.get(identity[1], "machine %d" % identity[1]))


def choose_library(candidates, wanted, package, library):
    """Return the first of ``candidates`` that exists with ELF identity ``wanted``; raise PreloadError otherwise."""
    if not candidates:
        raise PreloadError("package %s lists no file named %s" % (package, library))
    problems = []
    for path in candidates:
        if not os.path.exists(path):
            problems.append("%s is listed but missing (reinstall %s)" % (path, package))
            continue
        identity = read_elf_identity(path)
        if identity == wanted:
            return path
        problems.append("%s is %s, this host runs %s" % (
            path, describe_identity(identity) if identity else "not an ELF object", describe_identity(wanted)))
    raise PreloadError("no loadable %s in package %s: %s" % (library, package, "; ".join(problems)))


def parse_maps(text):
    """Return ``{path: deleted}`` for the files mapped in a ``/proc/<pid>/maps`` text (man 5 proc).

    Each line is ``address perms offset dev inode pathname``; the pathname may hold spaces and ends with
    `` (deleted)`` when the file was removed or replaced after it was mapped. Anonymous and special mappings
    (``[heap]``, ``[vdso]``) are left out.
    """
    mapped = {}
    for line in (text or "").splitlines():
        fields = line.split(None, 5)
        if len(fields) < 6 or not fields[5].startswith("/"):
            continue
        path = fields[5]
        deleted = path.endswith(" (deleted)")
        if deleted:
            path = path[:-len(" (deleted)")]
        mapped[path] = mapped.get(path, False) or deleted
    return mapped


def mapping_of(maps_text, realpath):
    """Return None when ``realpath`` is not mapped in ``maps_text``, else whether that mapping is deleted (bool)."""
    return parse_maps(maps_text).get(realpath)


def run_text(module, argv, what):
    """Run ``argv``; return its stdout, or raise PreloadError naming ``what`` and the tool's message."""
    rc, out, err = module.run_command(argv)
    if rc != 0:
        message = (err or out).strip() or "%s exited %d" % (argv[0], rc)
        raise PreloadError("%s: %s" % (what, message.splitlines()[0]))
    return out


def find(module, package, library):
    """Return ``(path, manager)`` of ``library`` from ``package``'s file list on this host."""
    if module.get_bin_path("dpkg-query"):
        manager = "dpkg"
        arch = run_text(module, ["dpkg", "--print-architecture"], "dpkg architecture").strip()
    elif module.get_bin_path("rpm"):
        manager, arch = "rpm", None
    else:
        raise PreloadError("neither dpkg-query nor rpm is installed: cannot list the files of package %s" % package)
    listing = run_text(module, file_list_command(manager, package, arch), "files of package %s" % package)
    wanted = read_elf_identity(os.path.realpath(sys.executable))
    if wanted is None:
        raise PreloadError("cannot read the ELF header of %s, the Python running this module" % sys.executable)
    return choose_library(library_candidates(listing, library), wanted, package, library), manager


def main():
    """Find the library, then check the process when ``pid`` is given; changes nothing."""
    module = AnsibleModule(argument_spec={"package": {"type": "str", "required": True},
                                          "library": {"type": "str", "required": True},
                                          "pid": {"type": "int"}},
                           supports_check_mode=True)
    params = module.params
    try:
        path, manager = find(module, params["package"], params["library"])
    except PreloadError as err:
        module.fail_json(msg=str(err))
    result = {"changed": False, "file": path, "realpath": os.path.realpath(path), "manager": manager}
    if params["pid"] is not None:
        maps_path = "/proc/%d/maps" % params["pid"]
        try:
            with open(maps_path, encoding="utf-8", errors="replace") as handle:
                deleted = mapping_of(handle.read(), result["realpath"])
        except OSError as err:
            module.fail_json(msg="cannot read %s: %s" % (maps_path, err.strerror), **result)
        if deleted is None:
            module.fail_json(msg="%s is not mapped in process %d: the loader ignored LD_PRELOAD (its message is in "
                                 "the process's stderr, e.g. the journal of the service)"
                                 % (result["realpath"], params["pid"]), mapped=False, **result)
        if deleted:
            module.warn("%s was replaced on disk after process %d started: restart it to load the new file"
                        % (result["realpath"], params["pid"]))
        result["mapped"] = True
    module.exit_json(**result)


if __name__ == "__main__":
    main()
