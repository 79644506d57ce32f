#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module cpu_topology: exact CPU, NUMA, cache, power and cgroup facts read from sysfs/procfs."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: cpu_topology
short_description: Gather exact CPU topology, NUMA, cache, power-management and cgroup facts
description:
  - Reads the Linux sysfs and procfs files that describe the CPUs and returns them as
    C(ansible_facts.cpu_topology), with a recommendation of which CPUs an inference service
    should pin to, how many threads it should run and which NUMA node its memory should be bound to.
  - Physical cores are grouped by the kernel's SMT sibling lists (C(core_cpus_list), falling back to
    C(thread_siblings_list)), never by C(core id) from C(/proc/cpuinfo), because core ids repeat in each socket
    and Arm kernels print no core id at all. Source Documentation/admin-guide/cputopology.rst.
  - Limits are those of the cgroup the service will run in, its slice (O(slice)) and that slice's parents,
    not those of the module process. Ansible's login runs it in C(user.slice/user-UID.slice/session-N.scope)
    (become keeps it there), whose quota and cpuset systemd's services do not share.
  - Usable CPUs are online CPUs intersected with the affinity services inherit from PID 1
    (C(Cpus_allowed_list) of C(proc/1/status)) and with the cpuset of the service's cgroup. Its CPU quota
    (v2 C(cpu.max), v1 C(cpu.cfs_quota_us) / C(cpu.cfs_period_us)) caps the recommended thread count;
    os.cpu_count() sees neither. Its memory nodes (C(cpuset.mems.effective)) are the only nodes memory is
    bound to.
  - psutil is not used, because its physical-core count is the known trap this module avoids and the
    managed host may not have it. Only the Python standard library runs on the host.
  - The module changes nothing on the host.
version_added: "0.1.0"
author: llmtune project
options:
  sysroot:
    description:
      - Directory holding the C(sys/) and C(proc/) trees to read, as C(lscpu --sysroot) does.
      - With C(/) (the default) the live system is read and live calls are used
        (sched_getaffinity(2), set_mempolicy(2), uname(2), C(systemd-detect-virt --vm)).
      - With any other directory (a fixture tree or a snapshot copied from another host, see the
        capture command in EXAMPLES) the equivalent files are read instead and
        C(numa_policy_permitted) is null.
      - Fails with a message if C(<sysroot>/sys/devices/system/cpu) does not exist.
    type: path
    default: /
  use_isolated:
    description:
      - CPUs the kernel was told to keep for dedicated work (C(isolated), from C(isolcpus=), and C(nohz_full))
        are left out of the recommendation by default, with the reason.
      - With C(true) the recommendation runs the service on those CPUs instead, one CPU per physical core all of
        whose online CPUs are isolated or nohz_full (a core shared with a housekeeping CPU is left out), within the
        online CPUs and the cgroup cpuset. The process affinity is not applied to them, because isolcpus gives every
        process the housekeeping CPUs as affinity; the service's C(CPUAffinity=) replaces it.
      - When no usable CPU is isolated or nohz_full, the default choice is made and the reason says so.
    type: bool
    default: false
  slice:
    description:
      - systemd slice the inference service runs in (its unit's C(Slice=); systemd.slice(5)). Its cgroup and the
        parents' (C(system.slice) is C(/system.slice), C(a-b.slice) is C(/a.slice/a-b.slice)) under the root
        cgroup systemd manages (the parent of PID 1's C(init.scope)) give the quota, cpuset and memory nodes.
        A slice not made yet counts as its nearest existing parent.
    type: str
    default: system.slice
notes:
  - Supports check mode; it never changes anything (C(changed=false)).
  - Missing optional kernel interfaces (cpufreq, cpuidle, NUMA, THP, cgroup files) give
    C(present=false), empty lists or null values, never an error.
  - Files read, relative to I(sysroot), are listed in C(tests/fixtures/topology/capture.sh), which
    copies them from a live host into a snapshot usable as I(sysroot).
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
seealso:
  - name: Kernel CPU topology
    description: Documentation/admin-guide/cputopology.rst
    link: https://docs.kernel.org/admin-guide/cputopology.html
  - name: Kernel cpuidle sysfs
    description: Documentation/admin-guide/pm/cpuidle.rst
    link: https://docs.kernel.org/admin-guide/pm/cpuidle.html
  - name: Kernel cpufreq sysfs
    description: Documentation/admin-guide/pm/cpufreq.rst
    link: https://docs.kernel.org/admin-guide/pm/cpufreq.html
  - name: cgroup v2
    description: Documentation/admin-guide/cgroup-v2.rst
    link: https://docs.kernel.org/admin-guide/cgroup-v2.html
"""

EXAMPLES = r"""
- name: Gather CPU topology facts of the managed host
  cpu_topology:

- name: Read a snapshot captured on another host with tests/fixtures/topology/capture.sh
  cpu_topology:
    sysroot: /srv/snapshots/db01

- name: Run the inference service on the CPUs booted with isolcpus= / nohz_full=
  cpu_topology:
    use_isolated: true

- name: Size for a service whose unit sets Slice=inference.slice
  cpu_topology:
    slice: inference.slice

- name: Show the recommendation
  ansible.builtin.debug:
    msg: >-
      pin to {{ ansible_facts.cpu_topology.recommended.cpus }},
      {{ ansible_facts.cpu_topology.recommended.threads }} threads:
      {{ ansible_facts.cpu_topology.recommended.reason }}

# Capture a snapshot of the files this module reads (run on the source host, then copy DEST back):
#   sh tests/fixtures/topology/capture.sh /tmp/topology-$(hostname)
"""

RETURN = r"""
ansible_facts:
  description: Facts added to the host.
  returned: always
  type: dict
  contains:
    cpu_topology:
      description: CPU topology facts. All CPU ids are logical CPU numbers as in C(/sys/devices/system/cpu/cpuN).
      returned: always
      type: dict
      contains:
        sysroot:
          description: The I(sysroot) read.
          type: str
          sample: /
        architecture:
          description: Machine name from uname(2) on the live system; under another sysroot
            inferred from C(proc/cpuinfo) (C(x86_64) when it has C(flags), C(aarch64) when it has C(CPU implementer),
            C(ppc64le) when its C(cpu) names a POWER processor).
          type: str
          sample: x86_64
        kernel_release:
          description: Release of the running kernel (C(uname -r); C(proc/sys/kernel/osrelease) under a sysroot), null
            when unknown. Some values are refused by older kernels (vm.swappiness above 100 before 5.8).
          type: str
          sample: 6.1.0-27-amd64
        vendor:
          description: C(vendor_id) of C(proc/cpuinfo) on x86; on Arm the C(CPU implementer) code mapped to a name
            as lscpu does (the hex code when unknown); C(IBM) on POWER. Null when unknown.
          type: str
          sample: GenuineIntel
        model_name:
          description: C(model name) of C(proc/cpuinfo) on x86; on Arm the C(CPU part) mapped to a core name
            (the hex code when unknown); on POWER its C(cpu) line.
          type: str
          sample: Intel(R) Xeon(R) Platinum 8480+
        sockets:
          description: Number of distinct C(topology/physical_package_id) values among online CPUs.
          type: int
          sample: 2
        physical_cores:
          description: Number of physical cores among online CPUs (distinct SMT sibling sets).
          type: int
          sample: 112
        logical_cpus:
          description: Number of present CPUs (C(sys/devices/system/cpu/present)), as the CPU(s) line of lscpu.
          type: int
          sample: 224
        threads_per_core:
          description: Largest number of online SMT siblings of one physical core.
          type: int
          sample: 2
        online_cpus:
          description: Online CPUs (C(sys/devices/system/cpu/online)).
          type: list
          elements: int
          sample: [0, 1, 2, 3]
        isolated_cpus:
          description: CPUs isolated from the scheduler's load balancing by C(isolcpus=) (C(sys/devices/system/cpu/isolated),
            Documentation/ABI/testing/sysfs-devices-system-cpu, admin-guide/kernel-parameters C(isolcpus)); empty when none
            or when the file is absent.
          type: list
          elements: int
          sample: [2, 3, 4, 5]
        nohz_full_cpus:
          description: CPUs in adaptive-tick mode (C(sys/devices/system/cpu/nohz_full), boot parameter C(nohz_full=));
            empty when none, when the kernel has no C(CONFIG_NO_HZ_FULL) (no file) or prints C((null)) (built with it,
            booted without it).
          type: list
          elements: int
          sample: [2, 3, 4, 5]
        hybrid:
          description: True when the CPU mixes performance and efficiency cores (Intel C(sys/devices/cpu_core)
            and C(sys/devices/cpu_atom) PMUs, or unequal C(cpu_capacity) on Arm).
          type: bool
          sample: false
        cores:
          description: One entry per online physical core, ordered by first CPU.
          type: list
          elements: dict
          contains:
            socket:
              description: C(topology/physical_package_id) (-1 when the firmware gives none).
              type: int
            die:
              description: C(topology/die_id), null when the kernel has no such file.
              type: int
            cluster:
              description: C(topology/cluster_id), null when the kernel has no such file.
              type: int
            core_id:
              description: C(topology/core_id); unique only within a socket (and die).
              type: int
            numa_node:
              description: NUMA node of the core's first CPU, null without NUMA sysfs.
              type: int
            cpus:
              description: Online SMT siblings of this core (C(topology/core_cpus_list)).
              type: list
              elements: int
            kind:
              description: C(performance) or C(efficiency) on hybrid CPUs, null otherwise.
              type: str
        numa_nodes:
          description: NUMA nodes from C(sys/devices/system/node/online); empty when the kernel exposes none.
          type: list
          elements: dict
          contains:
            id:
              description: Node number.
              type: int
            cpus:
              description: CPUs of the node (C(nodeN/cpulist)); empty for a memory-only node.
              type: list
              elements: int
            memory_mb:
              description: C(Node N MemTotal) of C(nodeN/meminfo) in MiB (rounded down).
              type: int
            distances:
              description: C(nodeN/distance), the SLIT distances to every online node in order (10 = local).
              type: list
              elements: int
        caches:
          description: Cache sizes per instance, from C(cpuN/cache/index*) of the first online CPU
            (C(level), C(type), C(size)), and the L3 domains of all online CPUs.
          type: dict
          contains:
            l1d_kib:
              description: L1 data cache of one core in KiB, null when not exposed.
              type: int
            l1i_kib:
              description: L1 instruction cache of one core in KiB, null when not exposed.
              type: int
            l2_kib:
              description: L2 cache instance in KiB, null when not exposed.
              type: int
            l3_kib:
              description: L3 cache instance in KiB, null when not exposed.
              type: int
            l3:
              description: One entry per distinct L3 instance (C(shared_cpu_list)).
              type: list
              elements: dict
              contains:
                cpus:
                  description: CPUs sharing this L3.
                  type: list
                  elements: int
                size_kib:
                  description: Size in KiB.
                  type: int
        isa:
          description: Instruction-set extensions relevant to inference. On x86 keys C(avx2), C(avx512f),
            C(avx512_bf16), C(avx512_vnni), C(amx_tile), C(amx_bf16), C(amx_int8) from C(flags); on Arm
            C(asimd), C(sve), C(bf16), C(i8mm) from C(Features) of C(proc/cpuinfo). Empty on other architectures.
          type: dict
          sample: {avx2: true, avx512f: true, amx_tile: false}
        cpufreq:
          description: CPU frequency scaling (C(sys/devices/system/cpu/cpufreq/policyN)).
          type: dict
          contains:
            present:
              description: True when at least one cpufreq policy exists.
              type: bool
            driver:
              description: C(scaling_driver) of the first policy (e.g. C(intel_pstate), C(acpi-cpufreq)), or null.
              type: str
            available_governors:
              description: C(scaling_available_governors) of the first policy.
              type: list
              elements: str
            governors:
              description: C(scaling_governor) per policy, keyed by policy directory name.
              type: dict
              sample: {policy0: performance}
            epp:
              description: True when C(energy_performance_preference) exists (intel_pstate / amd-pstate active mode).
              type: bool
            epp_choices:
              description: C(energy_performance_available_preferences) of the first policy that has it; empty when none.
              type: list
              elements: str
              sample: [default, performance, balance_performance, balance_power, power]
        cpuidle:
          description: CPU idle states (C(sys/devices/system/cpu/cpuidle), C(cpuN/cpuidle/stateK)).
          type: dict
          contains:
            driver:
              description: C(current_driver); C(none) is a real value printed by the kernel when no driver
                is registered. Null when the cpuidle directory is absent.
              type: str
            governor:
              description: C(current_governor) (C(current_governor_ro) on older kernels), or null.
              type: str
            states:
              description: Idle states of the first online CPU, by name (state indexes differ between drivers).
              type: list
              elements: dict
              contains:
                name:
                  description: C(stateK/name), e.g. C(C1E).
                  type: str
                desc:
                  description: C(stateK/desc).
                  type: str
                latency_us:
                  description: C(stateK/latency), exit latency in microseconds.
                  type: int
                disabled:
                  description: C(stateK/disable) of the first online CPU is 1.
                  type: bool
            intel_idle_builtin:
              description: True when C(intel_idle) is listed in C(lib/modules/<release>/modules.builtin), so
                modprobe options cannot act and only kernel command-line parameters do; false when it is not;
                null when that file is missing. The release is C(uname -r), or C(proc/sys/kernel/osrelease) under a sysroot.
              type: bool
        thp:
          description: Transparent huge pages (C(sys/kernel/mm/transparent_hugepage)).
          type: dict
          contains:
            supported:
              description: True when C(transparent_hugepage/enabled) exists.
              type: bool
            enabled:
              description: Selected value of C(enabled) (C(always), C(madvise), C(never)), or null.
              type: str
            defrag:
              description: Selected value of C(defrag), or null.
              type: str
            enabled_choices:
              description: Every value this kernel offers in C(enabled); empty without THP.
              type: list
              elements: str
            defrag_choices:
              description: Every value this kernel offers in C(defrag) (C(defer+madvise) since Linux 4.11); empty without
                THP.
              type: list
              elements: str
        swap:
          description: Active swap from C(proc/swaps).
          type: dict
          contains:
            devices:
              description: One entry per swap area with C(name), C(type), C(size_mb), C(priority).
              type: list
              elements: dict
            total_mb:
              description: Total swap in MiB.
              type: int
        memory_mb:
          description: C(MemTotal) of C(proc/meminfo) in MiB.
          type: int
        virtualization:
          description: Virtualization, with the names systemd-detect-virt prints.
          type: dict
          contains:
            hypervisor:
              description: C(kvm), C(xen), C(microsoft), C(vmware), C(oracle), C(amazon), C(qemu), C(vm-other), or C(none).
                Live, from C(systemd-detect-virt --vm) when installed; otherwise from C(sys/hypervisor/type),
                the C(kvm-clock) clocksource, DMI C(sys_vendor)/C(product_name) and the cpuinfo C(hypervisor) flag.
              type: str
            container:
              description: C(podman), C(docker), another C(container=) value of PID 1, or C(none). Checked in the
                order of systemd-detect-virt (C(proc/1/environ), C(run/systemd/container)) then C(run/.containerenv)
                and C(.dockerenv).
              type: str
        cgroup:
          description: Control group limits of the service's slice (O(slice)), the most restrictive of its cgroup
            and every ancestor visible under C(sys/fs/cgroup).
          type: dict
          contains:
            version:
              description: 2 when C(sys/fs/cgroup/cgroup.controllers) exists, 1 when v1 controllers are mounted, else null.
              type: int
            slice:
              description: O(slice).
              type: str
              sample: system.slice
            path:
              description: Cgroup path of the slice (of the CPU controller's hierarchy with cgroup v1), under the root
                systemd manages (from C(proc/1/cgroup); C(/) when that file is absent).
              type: str
              sample: /system.slice
            cpuset:
              description: C(cpuset.cpus.effective) (v2) or C(cpuset.effective_cpus) (v1), null when not readable.
              type: list
              elements: int
            mems:
              description: C(cpuset.mems.effective) (v2) or C(cpuset.effective_mems) (v1), the NUMA nodes the service
                may allocate on; null when not readable.
              type: list
              elements: int
            cpu_quota:
              description: CPU quota in CPUs (quota / period of C(cpu.max) or C(cpu.cfs_quota_us)/C(cpu.cfs_period_us)),
                null when unlimited.
              type: float
              sample: 2.0
            memory_limit_mb:
              description: C(memory.max) (v2) or C(memory.limit_in_bytes) (v1) in MiB, null when unlimited.
              type: int
        affinity:
          description: CPUs services inherit from PID 1 (C(Cpus_allowed_list) of C(proc/1/status)); where that is not
            readable the module process's own (sched_getaffinity(2) live, C(proc/self/status) under a sysroot);
            null when unknown.
          type: list
          elements: int
        usable_cpus:
          description: Online CPUs intersected with the affinity and the cgroup cpuset.
          type: list
          elements: int
        numa_policy_permitted:
          description: On the live system, whether set_mempolicy(2) is allowed, probed with a harmless
            C(MPOL_DEFAULT) call (seccomp of podman containers returns EPERM). Null under another sysroot or
            when the syscall number of the architecture is unknown.
          type: bool
        recommended:
          description: What an inference service should use. One CPU (the lowest-numbered usable SMT sibling)
            per usable physical core; efficiency cores are left out when performance cores are usable. With
            several NUMA nodes the overall choice is the node with the most such cores (lowest id on a tie),
            so that weights and KV cache stay in local memory. Isolated and nohz_full CPUs are left out, or with
            O(use_isolated) the only ones used (see there).
          type: dict
          contains:
            cpus:
              description: CPUs to pin to.
              type: list
              elements: int
              sample: [0, 1, 2, 3]
            threads:
              description: Number of compute threads, the number of C(cpus) capped by the cgroup CPU quota
                (rounded down), at least 1.
              type: int
              sample: 4
            numa_node:
              description: NUMA node of C(cpus), null when the kernel exposes no NUMA nodes.
              type: int
            memory_nodes:
              description: NUMA nodes to bind memory to. C(numa_node) when it has memory the service's cgroup allows
                (C(cgroup.mems)); else the nearest such nodes by C(numa_node)'s distances (a POWER LPAR's CPU node may
                have no memory). Empty without NUMA nodes.
              type: list
              elements: int
              sample: [0]
            reason:
              description: One-line explanation, naming the isolated and nohz_full CPUs and what was done with them.
              type: str
            on_isolated:
              description: True when C(cpus) are isolated or nohz_full CPUs (O(use_isolated) and some were usable).
              type: bool
            bind_threads:
              description: True when C(cpus) holds more than one isolated CPU. The scheduler does not balance tasks
                between isolated CPUs (admin-guide/kernel-parameters C(isolcpus)), so threads started under a
                multi-CPU affinity stay where they start; the engine must bind each thread to one CPU.
              type: bool
            per_node:
              description: The same choice for each NUMA node that has usable cores, one engine each; an engine on a
                node without usable memory is paired with the nearest node that has it (C(memory_nodes)).
                Memory-only nodes have no cores and no entry.
              type: list
              elements: dict
              contains:
                numa_node:
                  description: Node id.
                  type: int
                cpus:
                  description: CPUs to pin to on that node.
                  type: list
                  elements: int
                threads:
                  description: Thread count for that node; with a cgroup CPU quota, the engines of all nodes share
                    it, each its part by cores (rounded down, at least 1).
                  type: int
                memory_nodes:
                  description: NUMA nodes that engine binds its memory to, as C(memory_nodes) above.
                  type: list
                  elements: int
"""

import ctypes
import errno
import math
import os
import shutil
import subprocess

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.llmtune_sysfs import (
    format_cpu_list, parse_bracketed, parse_cpu_list, parse_meminfo, parse_proc_swaps, read_cpuidle_states, read_text,
    sysroot_path)

CPU_DIR = "/sys/devices/system/cpu"
NODE_DIR = "/sys/devices/system/node"
CGROUP_DIR = "/sys/fs/cgroup"

X86_ISA = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16", "amx_int8")
ARM_ISA = ("asimd", "sve", "bf16", "i8mm")

# Subset of util-linux sys-utils/lscpu-arm.c: implementer codes and the server core parts seen in practice.
ARM_IMPLEMENTERS = {
    0x41: "ARM", 0x42: "Broadcom", 0x43: "Cavium", 0x46: "Fujitsu", 0x48: "HiSilicon",
    0x4E: "NVIDIA", 0x50: "APM", 0x51: "Qualcomm", 0x61: "Apple", 0xC0: "Ampere",
}
ARM_PARTS = {
    (0x41, 0xD08): "Cortex-A72", (0x41, 0xD0B): "Cortex-A76", (0x41, 0xD0C): "Neoverse-N1",
    (0x41, 0xD40): "Neoverse-V1", (0x41, 0xD49): "Neoverse-N2", (0x41, 0xD4F): "Neoverse-V2",
    (0x41, 0xD84): "Neoverse-V3", (0x41, 0xD8E): "Neoverse-N3", (0x48, 0xD01): "Kunpeng-920",
    (0xC0, 0xAC3): "Ampere-1", (0xC0, 0xAC4): "Ampere-1a",
}

# DMI sys_vendor / product_name prefixes, as systemd's src/basic/virt.c detect_vm_dmi_vendor().
DMI_VENDORS = (
    ("KVM", "kvm"), ("OpenStack", "kvm"), ("KubeVirt", "kvm"), ("Amazon EC2", "amazon"), ("QEMU", "qemu"),
    ("VMware", "vmware"), ("VMW", "vmware"), ("innotek GmbH", "oracle"), ("VirtualBox", "oracle"),
    ("Xen", "xen"), ("Bochs", "bochs"), ("Parallels", "parallels"), ("BHYVE", "bhyve"), ("Hyper-V", "microsoft"),
    ("Apple Virtualization", "apple"), ("Google Compute Engine", "google"),
)

# set_mempolicy(2) numbers (arch/*/syscall tables); glibc has no wrapper (libnuma provides one).
SET_MEMPOLICY_NR = {"x86_64": 238, "aarch64": 236, "ppc64le": 261, "s390x": 270, "riscv64": 237}
MPOL_DEFAULT = 0

# A v1 memory limit this large is the "unlimited" value (PAGE_COUNTER_MAX rounded to pages).
V1_UNLIMITED_BYTES = 1 << 62


class TopologyError(Exception):
    """A sysroot that cannot be read as a Linux system (message is shown to the operator)."""


def read_cpulist(sysroot, path):
    """Return the cpulist in file ``path`` as a list of int, or None when the file is absent."""
    text = read_text(sysroot, path)
    return None if text is None else parse_cpu_list(text)


def read_int(sysroot, path):
    """Return the integer in file ``path``, or None when absent or not an integer."""
    text = read_text(sysroot, path)
    try:
        return int(text)
    except (TypeError, ValueError):
        return None


def list_numbered(sysroot, path, prefix):
    """Return the numbers N of entries ``<prefix>N`` in directory ``path``, sorted; [] when absent."""
    try:
        names = os.listdir(sysroot_path(sysroot, path))
    except OSError:
        return []
    return sorted(int(name[len(prefix):]) for name in names
                  if name.startswith(prefix) and name[len(prefix):].isdigit())


def parse_size_kib(text):
    """Parse a sysfs cache ``size`` such as ``48K`` or ``32M`` into KiB (int); None if absent."""
    if not text:
        return None
    units = {"K": 1, "M": 1024, "G": 1024 * 1024}
    if text[-1] in units:
        return int(text[:-1]) * units[text[-1]]
    return int(text) // 1024


def parse_key_values(text, separator=":"):
    """Parse ``key: value`` lines (``proc/cpuinfo`` blocks, ``proc/self/status``) into a list of dicts.

    A blank line starts a new block, as between processors in ``/proc/cpuinfo`` (man 5 proc).
    """
    blocks = [{}]
    for line in (text or "").splitlines():
        if not line.strip():
            if blocks[-1]:
                blocks.append({})
            continue
        key, _, value = line.partition(separator)
        blocks[-1][key.strip()] = value.strip()
    return [block for block in blocks if block]


def read_cpuinfo(sysroot, live):
    """Return architecture, vendor, model name and ISA flags from ``proc/cpuinfo`` (man 5 proc)."""
    blocks = parse_key_values(read_text(sysroot, "/proc/cpuinfo", ""))
    first = next((b for b in blocks if "processor" in b and len(b) > 1), blocks[0] if blocks else {})
    # IBM POWER prints the processor name under "cpu" (arch/powerpc/kernel/setup-common.c); lscpu reads it there.
    power = first.get("cpu", "").startswith("POWER")
    if live:
        architecture = os.uname().machine
    elif "flags" in first:
        architecture = "x86_64"
    elif "CPU implementer" in first:
        architecture = "aarch64"
    elif power:
        architecture = "ppc64le"
    else:
        architecture = None
    if "CPU implementer" in first:
        implementer = int(first["CPU implementer"], 16)
        part = int(first.get("CPU part", "0"), 16)
        vendor = ARM_IMPLEMENTERS.get(implementer, "0x%02x" % implementer)
        model_name = ARM_PARTS.get((implementer, part), "0x%03x" % part)
        features = set(first.get("Features", "").split())
        isa = {flag: flag in features for flag in ARM_ISA}
    elif power:
        vendor, model_name, isa = "IBM", first["cpu"], {}
    else:
        vendor = first.get("vendor_id")
        model_name = first.get("model name")
        flags = set(first.get("flags", "").split())
        isa = {flag: flag in flags for flag in X86_ISA} if flags else {}
    return {"architecture": architecture, "vendor": vendor, "model_name": model_name,
            "isa": isa, "hypervisor_flag": "hypervisor" in first.get("flags", "").split()}


def core_kinds(sysroot, online):
    """Return {cpu: 'performance'|'efficiency'} on hybrid CPUs, {} otherwise.

    Intel hybrid parts register two PMUs whose ``cpus`` files list each core type
    (``/sys/devices/cpu_core``, ``/sys/devices/cpu_atom``); Arm big.LITTLE differs in ``cpu_capacity``
    (Documentation/ABI/testing/sysfs-devices-system-cpu).
    """
    big = read_cpulist(sysroot, "/sys/devices/cpu_core/cpus")
    little = read_cpulist(sysroot, "/sys/devices/cpu_atom/cpus")
    if big and little:
        kinds = {cpu: "performance" for cpu in big}
        kinds.update({cpu: "efficiency" for cpu in little})
        return kinds
    capacity = {cpu: read_int(sysroot, "%s/cpu%d/cpu_capacity" % (CPU_DIR, cpu)) for cpu in online}
    values = set(capacity.values())
    if None in values or len(values) < 2:
        return {}
    top = max(values)
    return {cpu: "performance" if value == top else "efficiency" for cpu, value in capacity.items()}


def read_numa(sysroot):
    """Return NUMA nodes from ``sys/devices/system/node`` (Documentation/ABI/stable/sysfs-devices-node)."""
    nodes = []
    for node in read_cpulist(sysroot, NODE_DIR + "/online") or []:
        base = "%s/node%d" % (NODE_DIR, node)
        memory_mb = None
        for line in read_text(sysroot, base + "/meminfo", "").splitlines():
            fields = line.split()
            if fields[2:3] == ["MemTotal:"]:
                memory_mb = int(fields[3]) // 1024
        distances = [int(d) for d in read_text(sysroot, base + "/distance", "").split()]
        nodes.append({"id": node, "cpus": read_cpulist(sysroot, base + "/cpulist") or [],
                      "memory_mb": memory_mb, "distances": distances})
    return nodes


def read_cores(sysroot, online, cpu_node, kinds):
    """Group online CPUs into physical cores by their SMT sibling list (Documentation/admin-guide/cputopology.rst).

    ``core_cpus_list`` (kernel >= 5.5) or ``thread_siblings_list`` is exact where ``core_id`` is not:
    core ids repeat in every socket and die. A CPU without a topology directory is its own core.
    """
    online_set = set(online)
    cores = {}
    for cpu in online:
        base = "%s/cpu%d/topology/" % (CPU_DIR, cpu)
        siblings = read_cpulist(sysroot, base + "core_cpus_list")
        if siblings is None:
            siblings = read_cpulist(sysroot, base + "thread_siblings_list")
        key = tuple(sorted(online_set.intersection(siblings or []) | {cpu}))
        if key in cores:
            continue
        socket = read_int(sysroot, base + "physical_package_id")
        cores[key] = {
            "socket": 0 if socket is None else socket,
            "die": read_int(sysroot, base + "die_id"),
            "cluster": read_int(sysroot, base + "cluster_id"),
            "core_id": read_int(sysroot, base + "core_id"),
            "numa_node": cpu_node.get(cpu),
            "cpus": list(key),
            "kind": kinds.get(cpu),
        }
    return sorted(cores.values(), key=lambda core: core["cpus"][0])


def read_caches(sysroot, online):
    """Return cache sizes of the first online CPU and the L3 domains (Documentation/ABI/testing/sysfs-devices-system-cpu)."""
    caches = {"l1d_kib": None, "l1i_kib": None, "l2_kib": None, "l3_kib": None, "l3": []}
    names = {(1, "Data"): "l1d_kib", (1, "Instruction"): "l1i_kib", (2, "Unified"): "l2_kib", (3, "Unified"): "l3_kib"}
    l3_domains = {}
    for position, cpu in enumerate(online):
        base = "%s/cpu%d/cache" % (CPU_DIR, cpu)
        for index in list_numbered(sysroot, base, "index"):
            path = "%s/index%d/" % (base, index)
            level = read_int(sysroot, path + "level")
            size = parse_size_kib(read_text(sysroot, path + "size"))
            name = names.get((level, read_text(sysroot, path + "type")))
            if position == 0 and name:
                caches[name] = size
            if level == 3:
                shared = tuple(read_cpulist(sysroot, path + "shared_cpu_list") or [cpu])
                l3_domains.setdefault(shared, size)
    caches["l3"] = [{"cpus": list(cpus), "size_kib": size} for cpus, size in sorted(l3_domains.items())]
    return caches


def read_cpufreq(sysroot):
    """Return cpufreq policies (Documentation/admin-guide/pm/cpufreq.rst); present=false when none."""
    base = CPU_DIR + "/cpufreq"
    policies = list_numbered(sysroot, base, "policy")
    first = "%s/policy%d/" % (base, policies[0]) if policies else None
    return {
        "present": bool(policies),
        "driver": read_text(sysroot, first + "scaling_driver") if first else None,
        "available_governors": read_text(sysroot, first + "scaling_available_governors", "").split() if first else [],
        "governors": {"policy%d" % p: read_text(sysroot, "%s/policy%d/scaling_governor" % (base, p))
                      for p in policies},
        "epp": any(os.path.exists(sysroot_path(sysroot, "%s/policy%d/energy_performance_preference" % (base, p)))
                   for p in policies),
        "epp_choices": next((text.split() for text in (
            read_text(sysroot, "%s/policy%d/energy_performance_available_preferences" % (base, p)) for p in policies)
            if text), []),
    }


def kernel_release(sysroot, live):
    """Return the running kernel release: ``uname -r`` live, ``proc/sys/kernel/osrelease`` under a sysroot."""
    return os.uname().release if live else read_text(sysroot, "/proc/sys/kernel/osrelease")


def read_cpuidle(sysroot, online, live):
    """Return the cpuidle driver, governor and states (Documentation/admin-guide/pm/cpuidle.rst)."""
    base = CPU_DIR + "/cpuidle/"
    governor = read_text(sysroot, base + "current_governor")
    states = [{key: state[key] for key in ("name", "desc", "latency_us", "disabled")}
              for state in (read_cpuidle_states(sysroot, online[0]) if online else [])]
    release = kernel_release(sysroot, live)
    builtin = read_text(sysroot, "/lib/modules/%s/modules.builtin" % release) if release else None
    return {
        "driver": read_text(sysroot, base + "current_driver"),
        "governor": governor if governor is not None else read_text(sysroot, base + "current_governor_ro"),
        "states": states,
        "intel_idle_builtin": None if builtin is None else any(
            line.rsplit("/", 1)[-1] == "intel_idle.ko" for line in builtin.splitlines()),
    }


def read_thp(sysroot):
    """Return THP modes (Documentation/admin-guide/mm/transhuge.rst)."""
    enabled = read_text(sysroot, "/sys/kernel/mm/transparent_hugepage/enabled")
    defrag = read_text(sysroot, "/sys/kernel/mm/transparent_hugepage/defrag")
    return {"supported": enabled is not None, "enabled": parse_bracketed(enabled)[0],
            "defrag": parse_bracketed(defrag)[0], "enabled_choices": parse_bracketed(enabled)[1],
            "defrag_choices": parse_bracketed(defrag)[1]}


def read_swap(sysroot):
    """Return active swap areas of ``proc/swaps`` (sizes in KiB there, MiB here; man 5 proc)."""
    areas = parse_proc_swaps(read_text(sysroot, "/proc/swaps", ""))
    devices = [{"name": area["filename"], "type": area["type"], "size_mb": area["size_kb"] // 1024,
                "priority": area["priority"]} for area in areas]
    return {"devices": devices, "total_mb": sum(area["size_kb"] for area in areas) // 1024}


def read_memory_mb(sysroot):
    """Return ``MemTotal`` of ``proc/meminfo`` in MiB, or None."""
    total_kib = parse_meminfo(read_text(sysroot, "/proc/meminfo", "")).get("MemTotal")
    return None if total_kib is None else total_kib // 1024


def detect_hypervisor(sysroot, live, hypervisor_flag):
    """Return the hypervisor name as ``systemd-detect-virt --vm`` prints it, or ``none``.

    Live, the tool itself is run when installed (it reads CPUID, which files do not show). Otherwise,
    in systemd's order: Xen (``sys/hypervisor/type``), the KVM paravirtual clock, DMI vendor strings,
    then the cpuinfo ``hypervisor`` flag (``vm-other``).
    """
    tool = shutil.which("systemd-detect-virt") if live else None
    if tool:
        result = subprocess.run([tool, "--vm"], capture_output=True, text=True, check=False)
        if result.stdout.strip():
            return result.stdout.strip()
    if read_text(sysroot, "/sys/hypervisor/type") == "xen":
        return "xen"
    if "kvm-clock" in read_text(sysroot, "/sys/devices/system/clocksource/clocksource0/available_clocksource", ""):
        return "kvm"
    for name in ("sys_vendor", "product_name", "board_vendor", "bios_vendor"):
        value = read_text(sysroot, "/sys/class/dmi/id/" + name, "")
        if name == "sys_vendor" and value == "Microsoft Corporation":
            return "microsoft"
        for prefix, hypervisor in DMI_VENDORS:
            if value.startswith(prefix):
                return hypervisor
    return "vm-other" if hypervisor_flag else "none"


def detect_container(sysroot):
    """Return the container manager name as ``systemd-detect-virt --container`` does, or ``none``."""
    environ = read_text(sysroot, "/proc/1/environ", "")
    for variable in environ.split("\0"):
        if variable.startswith("container=") and variable[len("container="):]:
            return variable[len("container="):]
    manager = read_text(sysroot, "/run/systemd/container")
    if manager:
        return manager
    if os.path.exists(sysroot_path(sysroot, "/run/.containerenv")):
        return "podman"
    if os.path.exists(sysroot_path(sysroot, "/.dockerenv")):
        return "docker"
    return "none"


def slice_path(name):
    """Return the cgroup path of systemd slice ``name``: ``a-b.slice`` is ``/a.slice/a-b.slice`` (systemd.slice(5)).

    ``-.slice`` is the root slice (``/``). Raises TopologyError for a name that is not a slice.
    """
    if name == "-.slice":
        return "/"
    stem = name[:-len(".slice")] if name.endswith(".slice") else ""
    parts = stem.split("-")
    if not stem or "" in parts or "/" in stem:
        raise TopologyError("slice %r is not a systemd slice name such as system.slice or llm-inference.slice "
                            "(systemd.slice(5))" % name)
    return "".join("/%s.slice" % "-".join(parts[:n]) for n in range(1, len(parts) + 1))


def read_proc_cgroup(sysroot, pid):
    """Return ``{controller: path}`` of ``proc/PID/cgroup`` ("" for the v2 hierarchy; man 7 cgroups), {} if absent."""
    paths = {}
    for line in read_text(sysroot, "/proc/%s/cgroup" % pid, "").splitlines():
        _hierarchy, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            paths[controller] = path
    return paths


def service_cgroup(pid1_path, slice_name):
    """Return the cgroup path a service of ``slice_name`` gets in one hierarchy where PID 1 is at ``pid1_path``.

    systemd puts itself in ``init.scope`` under the root cgroup it manages (the host's, or a container's); its
    slices are beside it. A PID 1 that is not in ``init.scope`` (no systemd) is taken as that root.
    """
    root = (pid1_path or "/").rstrip("/") or "/"
    if os.path.basename(root) == "init.scope":
        root = os.path.dirname(root)
    return os.path.join(root, slice_path(slice_name).lstrip("/")).rstrip("/") or "/"


def cgroup_dirs(sysroot, mount, path):
    """Return the directories of cgroup ``path`` and its ancestors that exist under ``mount``, leaf first.

    A slice systemd has not made yet, or a path printed from another cgroup namespace, is left out: the
    limits that apply are those of its nearest existing ancestor and above.
    """
    dirs = []
    current = "/" + (path or "").strip("/")
    while True:
        directory = mount + ("" if current == "/" else current)
        if current == "/" or os.path.isdir(sysroot_path(sysroot, directory)):
            dirs.append(directory)
        if current == "/":
            return dirs
        current = os.path.dirname(current)


def first_list(sysroot, files):
    """Return the first non-empty cpulist/nodelist among ``files``, or None.

    A cgroup's effective cpuset already reflects its ancestors, so the nearest readable file is the answer.
    """
    return next((values for values in (read_cpulist(sysroot, f) for f in files) if values), None)


def read_cgroup(sysroot, slice_name="system.slice"):
    """Return cgroup version, cpuset, memory nodes, CPU quota (CPUs) and memory limit (MiB) of the service's cgroup.

    The service runs in ``slice_name`` under systemd's root cgroup (see :func:`service_cgroup`), not in the
    cgroup of whoever runs this module (an Ansible login's ``user.slice`` session, with its own quota and
    cpuset). Limits are the most restrictive of that cgroup and every ancestor. Sources:
    Documentation/admin-guide/cgroup-v2.rst (``cpu.max``, ``memory.max``, ``cpuset.cpus.effective``,
    ``cpuset.mems.effective``), cgroup-v1/cpusets.rst and scheduler/sched-bwc.rst (``cpu.cfs_quota_us``,
    ``cpu.cfs_period_us``), man 7 cgroups.
    """
    pid1 = read_proc_cgroup(sysroot, 1)
    result = {"version": None, "slice": slice_name, "path": None, "cpuset": None, "mems": None, "cpu_quota": None,
              "memory_limit_mb": None}
    quotas, limits = [], []
    if os.path.exists(sysroot_path(sysroot, CGROUP_DIR + "/cgroup.controllers")):
        result.update(version=2, path=service_cgroup(pid1.get(""), slice_name))
        dirs = cgroup_dirs(sysroot, CGROUP_DIR, result["path"])
        for directory in dirs:
            fields = read_text(sysroot, directory + "/cpu.max", "max").split()
            if fields[0] != "max":
                quotas.append(int(fields[0]) / int(fields[1]))
            memory = read_text(sysroot, directory + "/memory.max", "max")
            if memory != "max":
                limits.append(int(memory))
        cpuset_files = [d + "/cpuset.cpus.effective" for d in dirs]
        mems_files = [d + "/cpuset.mems.effective" for d in dirs]
    else:
        mounts = {name: CGROUP_DIR + "/" + name for name in os.listdir(sysroot_path(sysroot, CGROUP_DIR))} \
            if os.path.isdir(sysroot_path(sysroot, CGROUP_DIR)) else {}
        cpu_mount = next((m for n, m in sorted(mounts.items()) if "cpu" in n.split(",")), None)

        def dirs_of(controller, mount):
            return cgroup_dirs(sysroot, mount, service_cgroup(pid1.get(controller), slice_name)) if mount else []

        if cpu_mount or "cpuset" in mounts or "memory" in mounts:
            result.update(version=1, path=service_cgroup(pid1.get("cpu"), slice_name))
        for directory in dirs_of("cpu", cpu_mount):
            quota = read_int(sysroot, directory + "/cpu.cfs_quota_us")
            period = read_int(sysroot, directory + "/cpu.cfs_period_us")
            if quota is not None and quota > 0 and period:
                quotas.append(quota / period)
        for directory in dirs_of("memory", mounts.get("memory")):
            limit = read_int(sysroot, directory + "/memory.limit_in_bytes")
            if limit is not None and limit < V1_UNLIMITED_BYTES:
                limits.append(limit)
        cpuset_dirs = dirs_of("cpuset", mounts.get("cpuset"))
        cpuset_files = [d + "/cpuset.effective_cpus" for d in cpuset_dirs]
        mems_files = [d + "/cpuset.effective_mems" for d in cpuset_dirs]
    result["cpuset"] = first_list(sysroot, cpuset_files)
    result["mems"] = first_list(sysroot, mems_files)
    result["cpu_quota"] = min(quotas) if quotas else None
    result["memory_limit_mb"] = min(limits) // (1024 * 1024) if limits else None
    return result


def read_affinity(sysroot, live):
    """Return the CPUs a service may run on: the affinity of PID 1, which services inherit, or None when unknown.

    systemd applies its ``CPUAffinity=`` (systemd-system.conf(5)) to itself and its services, and ``isolcpus=``
    gives PID 1 the housekeeping CPUs. ``Cpus_allowed_list`` of ``proc/1/status`` (proc(5)) shows it; where that
    file cannot be read, this process's own affinity stands in (sched_getaffinity(2) live, ``proc/self/status``
    under a sysroot).
    """
    for pid in ("1", "self"):
        blocks = parse_key_values(read_text(sysroot, "/proc/%s/status" % pid, ""))
        allowed = blocks[0].get("Cpus_allowed_list") if blocks else None
        if allowed is not None:
            return parse_cpu_list(allowed)
        if live:
            return sorted(os.sched_getaffinity(0))
    return None


def probe_numa_policy(architecture):
    """Return whether ``set_mempolicy(2)`` is permitted: True, False on EPERM/ENOSYS, None if unknown.

    Calls ``set_mempolicy(MPOL_DEFAULT, NULL, 0)``, which only resets this short-lived process to the
    default policy. Container seccomp profiles (podman's default) deny it with EPERM.
    """
    number = SET_MEMPOLICY_NR.get(architecture)
    if number is None:
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(ctypes.c_long(number), ctypes.c_int(MPOL_DEFAULT), ctypes.c_void_p(None), ctypes.c_ulong(0)) == 0:
        return True
    return False if ctypes.get_errno() in (errno.EPERM, errno.ENOSYS) else None


def cap_threads(count, quota):
    """Return ``count`` capped by the CPU quota (rounded down, so the service is not throttled), at least 1."""
    if quota is not None:
        count = min(count, math.floor(quota))
    return max(1, count)


def plural(count, noun):
    """Return ``count noun`` with an English plural ``s`` when count is not 1."""
    return "%d %s%s" % (count, noun, "" if count == 1 else "s")


def read_isolation(sysroot):
    """Return ``{"isolated": [...], "nohz_full": [...]}``: CPUs set aside at boot (lists of int, [] when none).

    ``sys/devices/system/cpu/isolated`` lists the CPUs ``isolcpus=`` removed from scheduler load balancing;
    ``nohz_full`` the adaptive-tick CPUs of ``nohz_full=`` (Documentation/ABI/testing/sysfs-devices-system-cpu,
    Documentation/admin-guide/kernel-parameters.txt). A file is absent without the kernel feature
    (nohz_full needs CONFIG_NO_HZ_FULL) and holds an empty line when nothing was given at boot; nohz_full
    reads ``(null)`` on kernels that allocate its mask only when the parameter is given.
    """
    lists = {}
    for name in ("isolated", "nohz_full"):
        text = read_text(sysroot, "%s/%s" % (CPU_DIR, name), "")
        lists[name] = [] if text == "(null)" else parse_cpu_list(text)
    return lists


def describe_isolation(isolated, nohz_full, cpus):
    """Return e.g. ``isolated (isolcpus=) CPUs 2-15, nohz_full CPUs 2-15``, limited to ``cpus`` (set of int)."""
    parts = []
    for label, listed in (("isolated (isolcpus=)", isolated), ("nohz_full", nohz_full)):
        shown = cpus.intersection(listed)
        if shown:
            parts.append("%s CPUs %s" % (label, format_cpu_list(shown)))
    return " and ".join(parts)


def service_candidates(cores, usable, allowed, isolation, use_isolated):
    """Return ``(cpus, on_isolated, note)``: the CPUs the recommendation picks from, and why.

    ``usable`` (set) is online & affinity & cpuset, ``allowed`` (set) online & cpuset: isolcpus gives every
    process the housekeeping CPUs as affinity, so isolated CPUs are only ever in ``allowed``. By default CPUs
    set aside at boot (isolated or nohz_full) are left out; with ``use_isolated`` only cores whose online CPUs
    are all set aside are used (a sibling of a housekeeping CPU shares its core with that work).
    """
    reserved = set(isolation["isolated"]) | set(isolation["nohz_full"])
    seen = allowed & reserved
    if not seen:
        return usable, False, "use_isolated: no CPU is isolated or nohz_full" if use_isolated else None
    described = describe_isolation(isolation["isolated"], isolation["nohz_full"], seen)
    housekeeping = usable - reserved
    if use_isolated:
        whole = set()
        for core in cores:
            if set(core["cpus"]) <= reserved:
                whole.update(seen.intersection(core["cpus"]))
        if whole:
            note = "on the %s, as asked (use_isolated)" % described
            shared = seen - whole
            if shared:
                note += "; CPUs %s left out, their cores also run housekeeping CPUs" % format_cpu_list(shared)
            return whole, True, note
        return housekeeping or usable, not housekeeping, \
            "use_isolated: no core is entirely isolated or nohz_full (%s), housekeeping CPUs used" % described
    if housekeeping:
        return housekeeping, False, "%s left out: set aside at boot for dedicated work " \
            "(use_isolated=true runs the service there)" % described
    return usable, True, "every usable CPU is set aside at boot (%s): used anyway" % described


def memory_nodes(cpu_node, numa_nodes, mems):
    """Return ``(nodes, note)``: the NUMA nodes an engine on ``cpu_node``'s cores binds its memory to, and why.

    Only nodes that have memory (``memory_mb`` not 0; unknown counts as having it) and that the service's
    cgroup allows (``mems``, None when unknown) qualify: set_mempolicy(2) refuses a node outside the cpuset's
    mems with EINVAL, and a node without memory can satisfy no allocation (POWER LPARs, whose CPU nodes may
    have no memory; CXL and HBM memory-only nodes). The CPU node itself when it qualifies, else the nearest by
    its row of the SLIT distance table (``distances``, in the order of the online nodes), every node at that
    distance. ``note`` (str) names a remote choice, None for a local one. ``nodes`` is [] without NUMA nodes.
    """
    if cpu_node is None or not numa_nodes:
        return [], None
    ids = [node["id"] for node in numa_nodes]
    fit = [node["id"] for node in numa_nodes if node["memory_mb"] != 0 and (mems is None or node["id"] in mems)]
    if cpu_node in fit:
        return [cpu_node], None
    own = numa_nodes[ids.index(cpu_node)]
    why = "has no memory" if own["memory_mb"] == 0 else \
        "is outside the service's memory nodes (cpuset.mems.effective %s)" % format_cpu_list(mems)
    if not fit:
        return [], "NUMA node %d %s and no node with memory is allowed: memory not bound" % (cpu_node, why)
    row = own["distances"]
    distance = {node: row[ids.index(node)] if ids.index(node) < len(row) else math.inf for node in fit}
    nearest = min(distance.values())
    nodes = sorted(node for node in fit if distance[node] == nearest)
    return nodes, "NUMA node %d %s: memory bound to node%s %s, the nearest with memory%s" % (
        cpu_node, why, "s" if len(nodes) > 1 else "", format_cpu_list(nodes),
        "" if nearest == math.inf else " (distance %d)" % nearest)


def recommend(cores, usable, allowed, quota, isolation, use_isolated, numa_nodes=(), mems=None):
    """Choose CPUs, thread count and NUMA nodes (CPUs, memory) for a compute-bound inference service.

    One thread per physical core: SMT siblings share the core's vector units, so a second thread
    on a sibling adds contention, not throughput. Efficiency cores are left out when performance
    cores are usable, because the slowest thread sets the pace of each parallel matrix multiply.
    CPUs set aside at boot are handled by ``service_candidates`` (arguments as there; ``quota`` in CPUs or None).
    Memory goes to the nodes :func:`memory_nodes` picks (``numa_nodes`` as read, ``mems`` the cgroup's nodes):
    CPUs only ever come from nodes that have them (the cores), memory only from nodes that have it.
    """
    usable, on_isolated, isolation_note = service_candidates(cores, usable, allowed, isolation, use_isolated)
    picks = [(core, min(usable.intersection(core["cpus"]))) for core in cores if usable.intersection(core["cpus"])]
    performance = [pick for pick in picks if pick[0]["kind"] == "performance"]
    dropped = len(picks) - len(performance) if performance and len(performance) < len(picks) else 0
    if performance:
        picks = performance
    by_node = {}
    for core, cpu in picks:
        by_node.setdefault(core["numa_node"], []).append(cpu)
    per_node, notes = [], {}
    for node, cpus in sorted(by_node.items(), key=lambda item: (item[0] is None, item[0])):
        memory, notes[node] = memory_nodes(node, list(numa_nodes), mems)
        # One engine per node: the slice's quota is shared by all of them, each gets its share by cores.
        share = quota * len(cpus) / len(picks) if quota is not None and len(by_node) > 1 else quota
        per_node.append({"numa_node": node, "cpus": sorted(cpus), "threads": cap_threads(len(cpus), share),
                         "memory_nodes": memory})
    if not per_node:
        return {"cpus": [], "threads": 1, "numa_node": None, "memory_nodes": [], "per_node": [],
                "on_isolated": False, "bind_threads": False,
                "reason": "no usable CPU found (online, affinity and cpuset do not intersect)"}
    best = max(per_node, key=lambda entry: (len(entry["cpus"]), -(entry["numa_node"] or 0)))
    reasons = ["%s among %s, one CPU per core" % (plural(len(picks) + dropped, "physical core"),
                                                  plural(len(usable), "usable CPU"))]
    if len(picks) + dropped < len(usable):
        reasons[0] += " (SMT siblings left out)"
    if dropped:
        reasons.append("%s left out" % plural(dropped, "efficiency core"))
    local = best["memory_nodes"] == [best["numa_node"]]
    if len(per_node) > 1:
        reasons.append("NUMA node %d chosen of %d nodes with usable cores (most cores, lowest id on a tie)%s"
                       % (best["numa_node"], len(per_node), ", memory bound there" if local else ""))
    elif local:
        reasons.append("memory bound to NUMA node %d" % best["numa_node"])
    if notes.get(best["numa_node"]):
        reasons.append(notes[best["numa_node"]])
    paired = ["CPU node %d with memory node%s %s" % (e["numa_node"], "s" if len(e["memory_nodes"]) > 1 else "",
                                                      format_cpu_list(e["memory_nodes"]))
              for e in per_node if e["memory_nodes"] and e["memory_nodes"] != [e["numa_node"]]]
    if len(per_node) > 1 and paired:
        reasons.append("one engine per node pairs %s" % ", ".join(paired))
    threads = cap_threads(len(best["cpus"]), quota)
    if quota is not None and threads < len(best["cpus"]):
        reasons.append("threads capped at %d by the cgroup CPU quota of %g CPUs" % (threads, quota))
    bind_threads = on_isolated and len(set(best["cpus"]).intersection(isolation["isolated"])) > 1
    if isolation_note:
        reasons.append(isolation_note)
    if bind_threads:
        reasons.append("the scheduler does not balance threads between isolated CPUs: bind each engine thread "
                       "to one CPU")
    return {"cpus": best["cpus"], "threads": threads, "numa_node": best["numa_node"],
            "memory_nodes": best["memory_nodes"], "reason": "; ".join(reasons), "per_node": per_node,
            "on_isolated": on_isolated, "bind_threads": bind_threads}


def gather(sysroot="/", use_isolated=False, service_slice="system.slice"):
    """Return the ``cpu_topology`` facts of ``sysroot`` (str); ``use_isolated`` (bool) and ``service_slice`` (str)
    as the module options ``use_isolated`` and ``slice``.

    Raises TopologyError for a non-sysfs tree or a bad slice name.
    """
    if not os.path.isdir(sysroot_path(sysroot, CPU_DIR)):
        raise TopologyError("sysroot %s has no sys/devices/system/cpu: not a Linux sysfs tree "
                            "(capture one with tests/fixtures/topology/capture.sh)" % sysroot)
    live = os.path.realpath(sysroot) == "/"
    online = read_cpulist(sysroot, CPU_DIR + "/online")
    if not online:
        raise TopologyError("sysroot %s: sys/devices/system/cpu/online is missing or empty" % sysroot)
    present = read_cpulist(sysroot, CPU_DIR + "/present") or online
    cpuinfo = read_cpuinfo(sysroot, live)
    numa_nodes = read_numa(sysroot)
    cpu_node = {cpu: node["id"] for node in numa_nodes for cpu in node["cpus"]}
    kinds = core_kinds(sysroot, online)
    cores = read_cores(sysroot, online, cpu_node, kinds)
    cgroup = read_cgroup(sysroot, service_slice)
    affinity = read_affinity(sysroot, live)
    allowed = set(online) if cgroup["cpuset"] is None else set(online) & set(cgroup["cpuset"])
    usable = allowed if affinity is None else allowed & set(affinity)
    isolation = read_isolation(sysroot)
    return {
        "sysroot": sysroot,
        "architecture": cpuinfo["architecture"],
        "kernel_release": kernel_release(sysroot, live),
        "vendor": cpuinfo["vendor"],
        "model_name": cpuinfo["model_name"],
        "sockets": len({core["socket"] for core in cores}),
        "physical_cores": len(cores),
        "logical_cpus": len(present),
        "threads_per_core": max(len(core["cpus"]) for core in cores),
        "online_cpus": online,
        "isolated_cpus": isolation["isolated"],
        "nohz_full_cpus": isolation["nohz_full"],
        "hybrid": bool(kinds),
        "cores": cores,
        "numa_nodes": numa_nodes,
        "caches": read_caches(sysroot, online),
        "isa": cpuinfo["isa"],
        "cpufreq": read_cpufreq(sysroot),
        "cpuidle": read_cpuidle(sysroot, online, live),
        "thp": read_thp(sysroot),
        "swap": read_swap(sysroot),
        "memory_mb": read_memory_mb(sysroot),
        "virtualization": {"hypervisor": detect_hypervisor(sysroot, live, cpuinfo["hypervisor_flag"]),
                           "container": detect_container(sysroot)},
        "cgroup": cgroup,
        "affinity": affinity,
        "usable_cpus": sorted(usable),
        "numa_policy_permitted": probe_numa_policy(cpuinfo["architecture"]) if live else None,
        "recommended": recommend(cores, usable, allowed, cgroup["cpu_quota"], isolation, use_isolated, numa_nodes,
                                 cgroup["mems"]),
    }


def main():
    """Run the module: gather facts, never change anything."""
    module = AnsibleModule(argument_spec={"sysroot": {"type": "path", "default": "/"},
                                          "use_isolated": {"type": "bool", "default": False},
                                          "slice": {"type": "str", "default": "system.slice"}},
                           supports_check_mode=True)
    try:
        facts = gather(module.params["sysroot"], module.params["use_isolated"], module.params["slice"])
    except TopologyError as error:
        module.fail_json(msg=str(error))
    module.exit_json(changed=False, ansible_facts={"cpu_topology": facts})


if __name__ == "__main__":
    main()
