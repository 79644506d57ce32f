"""Tests of library/cpu_topology.py on sysfs/procfs fixture trees and on this machine.

Each tree under tests/fixtures/topology/ has the kernel's own layout and formats (see the README there);
the expected values are those of the machine the tree describes. lscpu --sysroot reads the same trees
and serves as an independent check of the counts.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest

import cpu_topology

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TREES = os.path.join(ROOT, "tests", "fixtures", "topology")
ALL_TREES = sorted(name for name in os.listdir(TREES) if os.path.isdir(os.path.join(TREES, name)))


def read_tree(tree, path):
    """Text of file PATH of fixture TREE, without the newline."""
    with open(os.path.join(TREES, tree, path), encoding="utf-8") as handle:
        return handle.read().strip()


def facts(tree):
    """Return the cpu_topology facts of fixture ``tree``."""
    return cpu_topology.gather(os.path.join(TREES, tree))


def lscpu(*args):
    """Return lscpu -J output as {field without colon: data}, nested children flattened."""
    if shutil.which("lscpu") is None:
        pytest.skip("lscpu (util-linux) is not installed")
    out = json.loads(subprocess.run(["lscpu", "-J", *args], capture_output=True, text=True, check=True).stdout)
    fields = {}

    def walk(entries):
        for entry in entries:
            fields[entry["field"].rstrip(":")] = entry["data"]
            walk(entry.get("children", []))

    walk(out["lscpu"])
    return fields


def assert_agrees_with_lscpu(result, fields):
    """Compare the counts lscpu prints with ours."""
    assert result["logical_cpus"] == int(fields["CPU(s)"])
    assert result["sockets"] == int(fields["Socket(s)"])
    assert result["physical_cores"] == int(fields["Socket(s)"]) * int(fields["Core(s) per socket"])
    assert result["threads_per_core"] == int(fields["Thread(s) per core"])
    assert len(result["numa_nodes"]) == int(fields["NUMA node(s)"])


def test_every_machine_has_a_tree():
    assert ALL_TREES == ["arm-graviton3", "container-cgroup2", "epyc-1socket", "epyc-isolcpus", "epyc-slice-cpuset",
                         "epyc-user-quota", "epyc-zen3-kvm-2vcpu", "epyc-zen4-kvm-2vcpu", "intel-hybrid", "kvm-ci-vm",
                         "kvm-socket-per-vcpu", "power9-lpar-memless", "qemu-2node", "xeon-2socket"]


@pytest.mark.parametrize("tree", ALL_TREES)
def test_counts_agree_with_lscpu_sysroot(tree):
    result = facts(tree)
    fields = lscpu("--sysroot", os.path.join(TREES, tree))
    assert_agrees_with_lscpu(result, fields)
    assert result["model_name"] == fields["Model name"]
    assert len(result["caches"]["l3"]) == int(fields["L3 cache"].split("(")[1].split()[0])


def test_qemu_two_nodes_captured_on_a_real_kernel():
    # numactl --hardware in the same boot: node 0 cpus 0, size 1510 MB; node 1 cpus 1, size 1465 MB; distances
    # 10 20 / 20 10 (tests/fixtures/jinja/vm-topology-tools).
    result = facts("qemu-2node")
    assert (result["sockets"], result["physical_cores"], result["logical_cpus"]) == (2, 2, 2)
    assert result["numa_nodes"] == [
        {"id": 0, "cpus": [0], "memory_mb": 1510, "distances": [10, 20]},
        {"id": 1, "cpus": [1], "memory_mb": 1465, "distances": [20, 10]}]
    # One process on one node: its CPUs and its memory stay local; each node's own choice for one per node.
    assert (result["recommended"]["cpus"], result["recommended"]["numa_node"]) == ([0], 0)
    assert [(n["numa_node"], n["cpus"], n["threads"]) for n in result["recommended"]["per_node"]] == [
        (0, [0], 1), (1, [1], 1)]


def test_xeon_two_sockets_with_repeating_core_ids():
    result = facts("xeon-2socket")
    assert (result["vendor"], result["architecture"]) == ("GenuineIntel", "x86_64")
    assert (result["sockets"], result["physical_cores"], result["logical_cpus"], result["threads_per_core"]) == (2, 4, 8, 2)
    # core_id 0 and 1 exist in both sockets: four cores, not two.
    assert [(c["socket"], c["core_id"], c["numa_node"], c["cpus"]) for c in result["cores"]] == [
        (0, 0, 0, [0, 4]), (0, 1, 0, [1, 5]), (1, 0, 1, [2, 6]), (1, 1, 1, [3, 7])]
    assert result["numa_nodes"] == [
        {"id": 0, "cpus": [0, 1, 4, 5], "memory_mb": 63488, "distances": [10, 20]},
        {"id": 1, "cpus": [2, 3, 6, 7], "memory_mb": 63488, "distances": [20, 10]}]
    assert result["caches"] == {"l1d_kib": 48, "l1i_kib": 32, "l2_kib": 1280, "l3_kib": 43008, "l3": [
        {"cpus": [0, 1, 4, 5], "size_kib": 43008}, {"cpus": [2, 3, 6, 7], "size_kib": 43008}]}
    assert result["isa"] == {"avx2": True, "avx512f": True, "avx512_bf16": False, "avx512_vnni": True,
                             "amx_tile": False, "amx_bf16": False, "amx_int8": False}
    assert result["cpufreq"] == {"present": True, "driver": "intel_pstate", "available_governors": ["performance", "powersave"],
                                 "governors": {"policy%d" % n: "powersave" for n in range(8)}, "epp": True,
                                 "epp_choices": ["default", "performance", "balance_performance", "balance_power",
                                                 "power"]}
    assert result["cpuidle"] == {"driver": "intel_idle", "governor": "menu", "intel_idle_builtin": True, "states": [
        {"name": "POLL", "desc": "CPUIDLE CORE POLL IDLE", "latency_us": 0, "disabled": False},
        {"name": "C1", "desc": "MWAIT 0x00", "latency_us": 1, "disabled": False},
        {"name": "C1E", "desc": "MWAIT 0x01", "latency_us": 4, "disabled": False},
        {"name": "C6", "desc": "MWAIT 0x20", "latency_us": 170, "disabled": False}]}
    assert result["thp"] == {"supported": True, "enabled": "always", "defrag": "madvise",
                             "enabled_choices": ["always", "madvise", "never"],
                             "defrag_choices": ["always", "defer", "defer+madvise", "madvise", "never"]}
    assert result["kernel_release"] == read_tree("xeon-2socket", "proc/sys/kernel/osrelease")
    assert result["swap"] == {"devices": [{"name": "/dev/sda3", "type": "partition", "size_mb": 8191, "priority": -2}],
                              "total_mb": 8191}
    assert result["memory_mb"] == 126976
    assert result["virtualization"] == {"hypervisor": "none", "container": "none"}
    # Captured in a login session: the session scope's files are not the service's (no system.slice in the tree,
    # so the root's limits apply, and the root has none).
    assert result["cgroup"] == {"version": 2, "slice": "system.slice", "path": "/system.slice", "cpuset": None,
                                "mems": None, "cpu_quota": None, "memory_limit_mb": None}
    assert result["usable_cpus"] == list(range(8))
    assert result["numa_policy_permitted"] is None
    assert result["recommended"] == {
        "cpus": [0, 1], "threads": 2, "numa_node": 0, "memory_nodes": [0],
        "reason": "4 physical cores among 8 usable CPUs, one CPU per core (SMT siblings left out); "
                  "NUMA node 0 chosen of 2 nodes with usable cores (most cores, lowest id on a tie), memory bound there",
        "per_node": [{"numa_node": 0, "cpus": [0, 1], "threads": 2, "memory_nodes": [0]},
                     {"numa_node": 1, "cpus": [2, 3], "threads": 2, "memory_nodes": [1]}],
        "on_isolated": False, "bind_threads": False}


def test_epyc_one_socket_four_l3_domains():
    result = facts("epyc-1socket")
    assert (result["vendor"], result["sockets"], result["physical_cores"], result["logical_cpus"]) == ("AuthenticAMD", 1, 8, 16)
    assert [c["core_id"] for c in result["cores"]] == [0, 1, 4, 5, 8, 9, 12, 13]
    assert result["caches"]["l3"] == [{"cpus": [0, 1, 8, 9], "size_kib": 8192}, {"cpus": [2, 3, 10, 11], "size_kib": 8192},
                                      {"cpus": [4, 5, 12, 13], "size_kib": 8192}, {"cpus": [6, 7, 14, 15], "size_kib": 8192}]
    assert result["isa"]["avx2"] and not result["isa"]["avx512f"]
    assert (result["cpufreq"]["driver"], result["cpufreq"]["governors"]["policy15"], result["cpufreq"]["epp"]) == (
        "acpi-cpufreq", "schedutil", False)
    assert [(s["name"], s["latency_us"]) for s in result["cpuidle"]["states"]] == [("POLL", 0), ("C1", 1), ("C2", 400)]
    assert result["cpuidle"]["driver"] == "acpi_idle"
    assert result["swap"] == {"devices": [], "total_mb": 0}
    assert result["recommended"] == {
        "cpus": [0, 1, 2, 3, 4, 5, 6, 7], "threads": 8, "numa_node": 0, "memory_nodes": [0],
        "reason": "8 physical cores among 16 usable CPUs, one CPU per core (SMT siblings left out); memory bound to NUMA node 0",
        "per_node": [{"numa_node": 0, "cpus": [0, 1, 2, 3, 4, 5, 6, 7], "threads": 8, "memory_nodes": [0]}],
        "on_isolated": False, "bind_threads": False}


def test_intel_hybrid_leaves_efficiency_cores_out():
    result = facts("intel-hybrid")
    assert result["hybrid"] is True
    assert (result["physical_cores"], result["logical_cpus"], result["threads_per_core"]) == (10, 16, 2)
    assert [(c["cpus"], c["kind"]) for c in result["cores"]] == (
        [([n, n + 1], "performance") for n in range(0, 12, 2)] + [([n], "efficiency") for n in range(12, 16)])
    assert result["isa"]["avx2"] and not result["isa"]["avx512f"]
    assert [s["name"] for s in result["cpuidle"]["states"]] == ["POLL", "C1E", "C6", "C8", "C10"]
    assert result["recommended"] == {
        "cpus": [0, 2, 4, 6, 8, 10], "threads": 6, "numa_node": 0, "memory_nodes": [0],
        "reason": "10 physical cores among 16 usable CPUs, one CPU per core (SMT siblings left out); "
                  "4 efficiency cores left out; memory bound to NUMA node 0",
        "per_node": [{"numa_node": 0, "cpus": [0, 2, 4, 6, 8, 10], "threads": 6, "memory_nodes": [0]}],
        "on_isolated": False, "bind_threads": False}


def test_isolcpus_left_out_by_default_and_named():
    # 16 CPUs booted with isolcpus=2-15 nohz_full=2-15: every process gets CPUs 0-1 as affinity.
    result = facts("epyc-isolcpus")
    assert result["isolated_cpus"] == result["nohz_full_cpus"] == list(range(2, 16))
    assert result["usable_cpus"] == [0, 1]
    assert result["recommended"] == {
        "cpus": [0, 1], "threads": 2, "numa_node": 0, "memory_nodes": [0],
        "reason": "2 physical cores among 2 usable CPUs, one CPU per core; memory bound to NUMA node 0; "
                  "isolated (isolcpus=) CPUs 2-15 and nohz_full CPUs 2-15 left out: set aside at boot for dedicated "
                  "work (use_isolated=true runs the service there)",
        "per_node": [{"numa_node": 0, "cpus": [0, 1], "threads": 2, "memory_nodes": [0]}],
        "on_isolated": False, "bind_threads": False}


def test_isolcpus_used_when_asked_one_thread_per_whole_isolated_core():
    result = cpu_topology.gather(os.path.join(TREES, "epyc-isolcpus"), use_isolated=True)
    # CPUs 8 and 9 are isolated but are the SMT siblings of housekeeping CPUs 0 and 1.
    assert result["recommended"] == {
        "cpus": [2, 3, 4, 5, 6, 7], "threads": 6, "numa_node": 0, "memory_nodes": [0],
        "reason": "6 physical cores among 12 usable CPUs, one CPU per core (SMT siblings left out); memory bound to "
                  "NUMA node 0; on the isolated (isolcpus=) CPUs 2-15 and nohz_full CPUs 2-15, as asked (use_isolated); "
                  "CPUs 8-9 left out, their cores also run housekeeping CPUs; the scheduler does not balance threads "
                  "between isolated CPUs: bind each engine thread to one CPU",
        "per_node": [{"numa_node": 0, "cpus": [2, 3, 4, 5, 6, 7], "threads": 6, "memory_nodes": [0]}],
        "on_isolated": True, "bind_threads": True}


def test_power_lpar_binds_memory_to_the_nearest_node_that_has_it():
    # Issue 39, input 5: a POWER9 LPAR whose CPUs are on node 2, which has no memory; nodes 0 and 1 have memory and
    # no CPUs. Node 2 is not in the cpuset's memory nodes (the kernel's top cpuset holds the nodes with memory), so
    # set_mempolicy(2) refuses it: memory goes to node 0, nearer (20) than node 1 (40).
    result = facts("power9-lpar-memless")
    assert (result["architecture"], result["vendor"], result["model_name"]) == (
        "ppc64le", "IBM", "POWER9 (architected), altivec supported")
    assert result["numa_nodes"] == [
        {"id": 0, "cpus": [], "memory_mb": 8664, "distances": [10, 40, 20]},
        {"id": 1, "cpus": [], "memory_mb": 5601, "distances": [40, 10, 40]},
        {"id": 2, "cpus": list(range(8)), "memory_mb": 0, "distances": [20, 40, 10]}]
    assert result["cgroup"]["mems"] == [0, 1]
    assert [(c["numa_node"], c["cpus"]) for c in result["cores"]] == [(2, [0, 1, 2, 3]), (2, [4, 5, 6, 7])]
    assert result["recommended"] == {
        "cpus": [0, 4], "threads": 2, "numa_node": 2, "memory_nodes": [0],
        "reason": "2 physical cores among 8 usable CPUs, one CPU per core (SMT siblings left out); NUMA node 2 has "
                  "no memory: memory bound to node 0, the nearest with memory (distance 20)",
        # One node with cores: one engine, on node 2's cores with node 0's memory.
        "per_node": [{"numa_node": 2, "cpus": [0, 4], "threads": 2, "memory_nodes": [0]}],
        "on_isolated": False, "bind_threads": False}


def test_memory_only_nodes_get_no_engine_and_cpu_nodes_keep_their_memory(tmp_path):
    # A two-socket Xeon with a CXL memory expander (node 2: memory, no CPUs), as on current x86 servers.
    root = tree_with(tmp_path, "xeon-2socket", {
        "sys/devices/system/node/online": "0-2\n",
        "sys/devices/system/node/node0/distance": "10 21 14\n",
        "sys/devices/system/node/node1/distance": "21 10 24\n",
        "sys/devices/system/node/node2/cpulist": "\n",
        "sys/devices/system/node/node2/distance": "14 24 10\n",
        "sys/devices/system/node/node2/meminfo": "Node 2 MemTotal:       268435456 kB\nNode 2 MemFree:        "
                                                 "268000000 kB\n"})
    recommended = cpu_topology.gather(root)["recommended"]
    assert [(n["numa_node"], n["cpus"], n["memory_nodes"]) for n in recommended["per_node"]] == [
        (0, [0, 1], [0]), (1, [2, 3], [1])]
    assert (recommended["numa_node"], recommended["memory_nodes"]) == (0, [0])


def test_memory_nodes_outside_the_service_cgroup_are_not_bound(tmp_path):
    # systemctl set-property system.slice AllowedMemoryNodes=1: node 0's engine pairs with node 1, the only one left.
    root = tree_with(tmp_path, "xeon-2socket", {"sys/fs/cgroup/cpuset.mems.effective": "0-1\n",
                                                "sys/fs/cgroup/system.slice/cpuset.mems.effective": "1\n"})
    recommended = cpu_topology.gather(root)["recommended"]
    assert [(n["numa_node"], n["memory_nodes"]) for n in recommended["per_node"]] == [(0, [1]), (1, [1])]
    assert recommended["reason"] == (
        "4 physical cores among 8 usable CPUs, one CPU per core (SMT siblings left out); NUMA node 0 chosen of 2 nodes "
        "with usable cores (most cores, lowest id on a tie); NUMA node 0 is outside the service's memory nodes "
        "(cpuset.mems.effective 1): memory bound to node 1, the nearest with memory (distance 20); one engine per "
        "node pairs CPU node 0 with memory node 1")


def test_engines_of_every_node_share_the_slice_quota(tmp_path):
    # One engine per node runs each in system.slice: a quota of 3 CPUs there is all theirs together.
    root = tree_with(tmp_path, "xeon-2socket", {"sys/fs/cgroup/system.slice/cpu.max": "300000 100000\n"})
    recommended = cpu_topology.gather(root)["recommended"]
    assert [(n["numa_node"], n["cpus"], n["threads"]) for n in recommended["per_node"]] == [(0, [0, 1], 1), (1, [2, 3], 1)]
    # One engine alone (the single layout) may use the whole quota on its node's 2 cores.
    assert (recommended["cpus"], recommended["threads"]) == ([0, 1], 2)


def test_equally_near_memory_nodes_are_all_bound():
    nodes = [{"id": 0, "cpus": [], "memory_mb": 4096, "distances": [10, 40, 20, 20]},
             {"id": 1, "cpus": [0, 1], "memory_mb": 0, "distances": [40, 10, 40, 40]},
             {"id": 2, "cpus": [], "memory_mb": 4096, "distances": [20, 40, 10, 20]},
             {"id": 3, "cpus": [], "memory_mb": 4096, "distances": [20, 40, 20, 10]}]
    assert cpu_topology.memory_nodes(1, nodes, None) == (
        [0, 2, 3], "NUMA node 1 has no memory: memory bound to nodes 0,2-3, the nearest with memory (distance 40)")
    assert cpu_topology.memory_nodes(1, nodes, [2, 3])[0] == [2, 3]
    assert cpu_topology.memory_nodes(0, nodes, None) == ([0], None)
    assert cpu_topology.memory_nodes(None, [], None) == ([], None)


def tree_with(tmp_path, tree, files):
    """Copy fixture ``tree`` to tmp_path and write ``files`` ({relative path: text}) into the copy."""
    root = tmp_path / tree
    shutil.copytree(os.path.join(TREES, tree), root)
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return str(root)


def test_nohz_full_without_isolcpus_needs_no_thread_binding(tmp_path):
    # tuned's cpu-partitioning style: nohz_full=2-7 and systemd CPUAffinity=0-1, no isolcpus (CPUs stay balanced).
    root = tree_with(tmp_path, "arm-graviton3", {
        "sys/devices/system/cpu/isolated": "\n", "sys/devices/system/cpu/nohz_full": "2-7\n",
        "proc/self/status": "Name:\tcat\nCpus_allowed_list:\t0-1\n"})
    default = cpu_topology.gather(root)
    assert (default["isolated_cpus"], default["nohz_full_cpus"]) == ([], list(range(2, 8)))
    assert (default["recommended"]["cpus"], default["recommended"]["on_isolated"]) == ([0, 1], False)
    assert default["recommended"]["reason"].endswith(
        "; nohz_full CPUs 2-7 left out: set aside at boot for dedicated work (use_isolated=true runs the service there)")
    asked = cpu_topology.gather(root, use_isolated=True)["recommended"]
    assert (asked["cpus"], asked["threads"], asked["on_isolated"], asked["bind_threads"]) == (
        [2, 3, 4, 5, 6, 7], 6, True, False)


def test_nohz_full_null_and_empty_isolated_mean_none(tmp_path):
    # Kernels built with CONFIG_NO_HZ_FULL but booted without nohz_full= may print "(null)".
    root = tree_with(tmp_path, "epyc-1socket", {
        "sys/devices/system/cpu/isolated": "\n", "sys/devices/system/cpu/nohz_full": "(null)\n"})
    default = cpu_topology.gather(root)
    assert (default["isolated_cpus"], default["nohz_full_cpus"]) == ([], [])
    assert default["recommended"] == facts("epyc-1socket")["recommended"]
    asked = cpu_topology.gather(root, use_isolated=True)["recommended"]
    assert asked["cpus"] == default["recommended"]["cpus"]
    assert asked["reason"] == default["recommended"]["reason"] + "; use_isolated: no CPU is isolated or nohz_full"


def test_arm_without_smt_or_cpuinfo_core_id():
    result = facts("arm-graviton3")
    assert (result["architecture"], result["vendor"], result["model_name"]) == ("aarch64", "ARM", "Neoverse-V1")
    assert (result["sockets"], result["physical_cores"], result["logical_cpus"], result["threads_per_core"]) == (1, 8, 8, 1)
    assert result["hybrid"] is False
    assert result["isa"] == {"asimd": True, "sve": True, "bf16": True, "i8mm": True}
    assert [c["die"] for c in result["cores"]] == [-1] * 8
    # No cpufreq, no cpuidle directory: absent interfaces, not errors.
    assert result["cpufreq"] == {"present": False, "driver": None, "available_governors": [], "governors": {}, "epp": False,
                                 "epp_choices": []}
    assert result["cpuidle"] == {"driver": None, "governor": None, "states": [], "intel_idle_builtin": False}
    assert result["virtualization"] == {"hypervisor": "amazon", "container": "none"}
    assert result["recommended"]["cpus"] == list(range(8))
    assert result["recommended"]["threads"] == 8


def test_kvm_guest_with_one_socket_per_vcpu():
    result = facts("kvm-socket-per-vcpu")
    assert (result["sockets"], result["physical_cores"], result["threads_per_core"]) == (4, 4, 1)
    assert [c["socket"] for c in result["cores"]] == [0, 1, 2, 3]
    assert len(result["caches"]["l3"]) == 4
    assert result["virtualization"] == {"hypervisor": "kvm", "container": "none"}
    assert result["cpuidle"]["driver"] == "haltpoll"
    assert result["cpuidle"]["intel_idle_builtin"] is None
    assert result["swap"]["total_mb"] == 2047
    # Four "sockets" but one NUMA node: all vCPUs, memory on node 0.
    assert result["recommended"] == {
        "cpus": [0, 1, 2, 3], "threads": 4, "numa_node": 0, "memory_nodes": [0],
        "reason": "4 physical cores among 4 usable CPUs, one CPU per core; memory bound to NUMA node 0",
        "per_node": [{"numa_node": 0, "cpus": [0, 1, 2, 3], "threads": 4, "memory_nodes": [0]}],
        "on_isolated": False, "bind_threads": False}


def test_container_quota_and_cpuset_with_smt_siblings():
    result = facts("container-cgroup2")
    assert (result["physical_cores"], result["logical_cpus"]) == (4, 8)
    # The container's own cgroup is the root of its namespace: no system.slice there, the root's limits apply.
    assert result["cgroup"] == {"version": 2, "slice": "system.slice", "path": "/system.slice", "cpuset": [0, 1, 2, 4],
                                "mems": None, "cpu_quota": 2.0, "memory_limit_mb": 8192}
    assert result["affinity"] == [0, 1, 2, 4]
    assert result["usable_cpus"] == [0, 1, 2, 4]
    assert result["virtualization"] == {"hypervisor": "none", "container": "podman"}
    assert [(s["name"], s["disabled"]) for s in result["cpuidle"]["states"]][-1] == ("C6", True)
    # CPUs 0 and 4 are SMT siblings: 3 physical cores, and the quota of 2 CPUs caps threads at 2.
    assert result["recommended"] == {
        "cpus": [0, 1, 2], "threads": 2, "numa_node": 0, "memory_nodes": [0],
        "reason": "3 physical cores among 4 usable CPUs, one CPU per core (SMT siblings left out); "
                  "memory bound to NUMA node 0; threads capped at 2 by the cgroup CPU quota of 2 CPUs",
        "per_node": [{"numa_node": 0, "cpus": [0, 1, 2], "threads": 2, "memory_nodes": [0]}],
        "on_isolated": False, "bind_threads": False}


def test_a_per_user_quota_of_the_login_does_not_cap_the_service():
    # Issue 39, input 4A: Ansible's login runs the module in user-1000.slice/session-3.scope, whose slice has a
    # per-user quota of half a CPU (set from PAM); system.slice, where the service runs, has none.
    result = facts("epyc-user-quota")
    assert result["cgroup"] == {"version": 2, "slice": "system.slice", "path": "/system.slice", "cpuset": list(range(16)),
                                "mems": [0], "cpu_quota": None, "memory_limit_mb": None}
    assert result["usable_cpus"] == list(range(16))
    assert result["recommended"] == {
        "cpus": [0, 1, 2, 3, 4, 5, 6, 7], "threads": 8, "numa_node": 0, "memory_nodes": [0],
        "reason": "8 physical cores among 16 usable CPUs, one CPU per core (SMT siblings left out); memory bound to NUMA node 0",
        "per_node": [{"numa_node": 0, "cpus": [0, 1, 2, 3, 4, 5, 6, 7], "threads": 8, "memory_nodes": [0]}],
        "on_isolated": False, "bind_threads": False}
    # A service whose unit runs in that user's slice (Slice=user-1000.slice) would get the quota, from the parent.
    capped = cpu_topology.gather(os.path.join(TREES, "epyc-user-quota"), service_slice="user-1000.slice")
    assert (capped["cgroup"]["path"], capped["cgroup"]["cpu_quota"]) == ("/user.slice/user-1000.slice", 0.5)
    assert capped["recommended"]["threads"] == 1
    assert capped["recommended"]["reason"].endswith("threads capped at 1 by the cgroup CPU quota of 0.5 CPUs")


def test_the_cpuset_of_the_service_slice_not_the_login():
    # Issue 39, input 4B: the login is unrestricted, system.slice has AllowedCPUs=2-11; systemd intersects the
    # unit's CPUAffinity with it, so CPUs 0-1 and 12-15 are not the service's. One CPU of each of the 8 cores is
    # still usable: 2-7 and the siblings 8, 9 of cores 0 and 1.
    result = facts("epyc-slice-cpuset")
    assert (result["cgroup"]["cpuset"], result["cgroup"]["cpu_quota"]) == (list(range(2, 12)), None)
    assert result["usable_cpus"] == list(range(2, 12))
    assert result["recommended"] == {
        "cpus": [2, 3, 4, 5, 6, 7, 8, 9], "threads": 8, "numa_node": 0, "memory_nodes": [0],
        "reason": "8 physical cores among 10 usable CPUs, one CPU per core (SMT siblings left out); memory bound to NUMA node 0",
        "per_node": [{"numa_node": 0, "cpus": [2, 3, 4, 5, 6, 7, 8, 9], "threads": 8, "memory_nodes": [0]}],
        "on_isolated": False, "bind_threads": False}


def test_the_affinity_of_the_login_is_not_the_service_s(tmp_path):
    # systemctl set-property user.slice AllowedCPUs=0-3 keeps logins (and the module) on CPUs 0-3; services get
    # PID 1's affinity.
    root = tree_with(tmp_path, "epyc-user-quota", {
        "proc/self/status": "Name:\tpython3\nCpus_allowed:\t000f\nCpus_allowed_list:\t0-3\nMems_allowed_list:\t0\n"})
    result = cpu_topology.gather(root)
    assert (result["affinity"], result["recommended"]["cpus"]) == (list(range(16)), list(range(8)))


def test_slice_names_map_to_nested_cgroups():
    assert [cpu_topology.slice_path(n) for n in ("system.slice", "llm-inference.slice", "a-b-c.slice", "-.slice")] == [
        "/system.slice", "/llm.slice/llm-inference.slice", "/a.slice/a-b.slice/a-b-c.slice", "/"]
    for bad in ("system", "../etc.slice", "a--b.slice", "-a.slice", ".slice"):
        with pytest.raises(cpu_topology.TopologyError, match="is not a systemd slice name"):
            cpu_topology.slice_path(bad)
    # systemd's root: the parent of PID 1's init.scope (a container without its own cgroup namespace, here).
    assert cpu_topology.service_cgroup("/machine.slice/libpod-1f2e.scope/init.scope", "system.slice") == \
        "/machine.slice/libpod-1f2e.scope/system.slice"
    assert cpu_topology.service_cgroup("/", "system.slice") == "/system.slice"


def test_cgroup_v1_quota_of_the_service_slice_and_its_parent(tmp_path):
    # The CI machine's hybrid v1 hierarchy with systemd's slices in it: the login's user-1000.slice has a quota of
    # half a CPU, system.slice none, and a unit slice under a parent with 3 CPUs gets the parent's.
    tree = tmp_path / "kvm-ci-vm"
    shutil.copytree(os.path.join(TREES, "kvm-ci-vm"), tree)
    (tree / "proc" / "1").mkdir()
    (tree / "proc" / "1" / "cgroup").write_text(
        "9:name=systemd:/init.scope\n4:memory:/init.scope\n3:cpuset:/\n2:cpuacct:/init.scope\n1:cpu:/init.scope\n")
    (tree / "proc" / "self" / "cgroup").write_text(
        "9:name=systemd:/user.slice/user-1000.slice/session-3.scope\n4:memory:/user.slice/user-1000.slice/session-3.scope\n"
        "3:cpuset:/\n2:cpuacct:/user.slice/user-1000.slice/session-3.scope\n1:cpu:/user.slice/user-1000.slice/session-3.scope\n")
    cpu = tree / "sys" / "fs" / "cgroup" / "cpu"
    for path, quota in (("user.slice", -1), ("user.slice/user-1000.slice", 50000), ("system.slice", -1),
                        ("llm.slice", 300000), ("llm.slice/llm-inference.slice", -1)):
        (cpu / path).mkdir(parents=True)
        (cpu / path / "cpu.cfs_quota_us").write_text("%d\n" % quota)
        (cpu / path / "cpu.cfs_period_us").write_text("100000\n")
    result = cpu_topology.gather(str(tree))
    assert (result["cgroup"]["version"], result["cgroup"]["cpu_quota"], result["recommended"]["threads"]) == (1, None, 2)
    nested = cpu_topology.gather(str(tree), service_slice="llm-inference.slice")
    assert (nested["cgroup"]["path"], nested["cgroup"]["cpu_quota"]) == ("/llm.slice/llm-inference.slice", 3.0)


def test_ci_vm_without_cpufreq_and_cpuidle_driver_none():
    result = facts("kvm-ci-vm")
    assert (result["sockets"], result["physical_cores"], result["logical_cpus"], result["threads_per_core"]) == (1, 2, 2, 1)
    assert result["isa"] == {flag: True for flag in cpu_topology.X86_ISA}
    assert result["cpufreq"]["present"] is False
    assert result["cpuidle"] == {"driver": "none", "governor": "menu", "states": [], "intel_idle_builtin": None}
    assert result["virtualization"] == {"hypervisor": "kvm", "container": "docker"}
    # cgroup v1 (hybrid mount): the module ran in memory:/sandbox/job, the service's system.slice is not in the tree
    # (no systemd there): the roots' limits apply, unlimited.
    assert result["cgroup"] == {"version": 1, "slice": "system.slice", "path": "/system.slice", "cpuset": [0, 1],
                                "mems": None, "cpu_quota": None, "memory_limit_mb": None}
    assert result["recommended"]["cpus"] == [0, 1]
    assert result["recommended"]["threads"] == 2


def test_zen3_vm_with_avx2_alone():
    """The 2-vCPU AMD EPYC of 2026-12-06 (family 25 model 1, Zen 3), captured: AVX2 without AVX-512 or bf16."""
    result = facts("epyc-zen3-kvm-2vcpu")
    assert (result["model_name"], result["physical_cores"], result["threads_per_core"]) == ("AMD EPYC", 2, 1)
    assert result["isa"] == {flag: flag == "avx2" for flag in cpu_topology.X86_ISA}
    assert (result["caches"]["l2_kib"], result["caches"]["l3_kib"]) == (512, 32768)
    assert (result["cpufreq"]["present"], result["cpuidle"]["driver"]) == (False, "none")
    assert (result["recommended"]["cpus"], result["recommended"]["threads"]) == ([0, 1], 2)


def test_zen4_vm_with_avx512_bf16_and_haltpoll():
    """The 2-vCPU AMD EPYC of 2026-12-07 (family 25 model 17, Zen 4), captured: AVX-512 with bf16, haltpoll idle."""
    result = facts("epyc-zen4-kvm-2vcpu")
    assert (result["model_name"], result["physical_cores"], result["threads_per_core"]) == ("AMD EPYC", 2, 1)
    assert result["isa"] == {flag: not flag.startswith("amx") for flag in cpu_topology.X86_ISA}
    assert (result["caches"]["l2_kib"], result["caches"]["l3_kib"]) == (1024, 32768)
    assert (result["cpufreq"]["present"], result["cpuidle"]["driver"]) == (False, "haltpoll")
    assert (result["recommended"]["cpus"], result["recommended"]["threads"]) == ([0, 1], 2)


def test_missing_optional_interfaces_give_absent_values(tmp_path):
    shutil.copytree(os.path.join(TREES, "container-cgroup2", "sys", "devices", "system", "cpu"),
                    tmp_path / "sys" / "devices" / "system" / "cpu")
    shutil.rmtree(tmp_path / "sys" / "devices" / "system" / "cpu" / "cpufreq")
    shutil.rmtree(tmp_path / "sys" / "devices" / "system" / "cpu" / "cpuidle")
    result = cpu_topology.gather(str(tmp_path))
    assert result["physical_cores"] == 4
    assert result["cpufreq"]["present"] is False
    assert result["cpuidle"]["driver"] is None
    assert result["thp"] == {"supported": False, "enabled": None, "defrag": None, "enabled_choices": [],
                             "defrag_choices": []}
    assert result["numa_nodes"] == []
    assert (result["memory_mb"], result["affinity"], result["cgroup"]["version"]) == (None, None, None)
    assert result["vendor"] is None
    assert result["recommended"]["numa_node"] is None
    assert result["recommended"]["cpus"] == [0, 1, 2, 3]


def test_sysroot_without_cpu_sysfs_fails_with_message(tmp_path):
    with pytest.raises(cpu_topology.TopologyError, match="has no sys/devices/system/cpu"):
        cpu_topology.gather(str(tmp_path))


def test_cache_size_units():
    assert [cpu_topology.parse_size_kib(s) for s in ("48K", "2048K", "32M", "1G", None)] == [48, 2048, 32768, 1048576, None]


def run_module(*args):
    """Run the module through ansible on localhost; return (rc, result dict)."""
    ansible = os.path.join(os.path.dirname(sys.executable), "ansible")
    env = dict(os.environ, ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="ansible.posix.json")
    proc = subprocess.run(
        [ansible, "localhost", "-i", "localhost,", "-c", "local", "-m", "cpu_topology",
         "-e", "ansible_python_interpreter=" + sys.executable, *args],
        cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    return proc.returncode, json.loads(proc.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]


def test_module_through_ansible_in_check_mode():
    rc, result = run_module("--check", "-a", "sysroot=" + os.path.join(TREES, "container-cgroup2"))
    assert rc == 0
    assert result["changed"] is False
    assert result["ansible_facts"]["cpu_topology"] == facts("container-cgroup2")


def test_module_through_ansible_fails_cleanly(tmp_path):
    rc, result = run_module("-a", "sysroot=" + str(tmp_path))
    assert rc == 2
    assert result["msg"] == ("sysroot %s has no sys/devices/system/cpu: not a Linux sysfs tree "
                             "(capture one with tests/fixtures/topology/capture.sh)" % tmp_path)
    assert "Traceback" not in json.dumps(result)


def test_live_system_agrees_with_lscpu():
    result = cpu_topology.gather("/")
    assert_agrees_with_lscpu(result, lscpu())
    # The affinity services get: PID 1's.
    with open("/proc/1/status", encoding="utf-8") as status:
        allowed = next(line.split(":", 1)[1].strip() for line in status if line.startswith("Cpus_allowed_list:"))
    assert result["affinity"] == cpu_topology.parse_cpu_list(allowed)
    assert set(result["usable_cpus"]) <= set(result["online_cpus"])
    assert isinstance(result["numa_policy_permitted"], bool)
    assert result["recommended"]["threads"] >= 1


def test_live_container_detection_agrees_with_systemd():
    tool = shutil.which("systemd-detect-virt")
    if tool is None:
        pytest.skip("systemd-detect-virt is not installed")
    expected = subprocess.run([tool, "--container"], capture_output=True, text=True, check=False).stdout.strip()
    assert cpu_topology.gather("/")["virtualization"]["container"] == expected
