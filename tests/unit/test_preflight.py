"""playbooks/preflight.yml (site.yml's first step on the hosts): every role's variables checked before any change.

Runs the real playbook with the real topology module against this machine (connection local; the play only reads).
Each bad input is one an operator sent, with the message it must get.
"""

import json
import os
import subprocess

import pytest
from conftest import ROOT, VENV_BIN

KEY = "abcdefghijklmnopqrstuvwxyz0123456789ABCD"
# Another machine's sysfs/procfs (the topology role's topology_sysroot): its checks run against that machine.
TOPOLOGY = os.path.join(ROOT, "tests", "fixtures", "topology")

# Each bad input an operator sent, with the message it must get.
CASES = [
    # Wrote an nginx configuration that nginx -t rejects (issue 20, input 8).
    ({"inference_service_max_concurrent": 0}, 'inference_service_max_concurrent must be >= 1 (got 0)'),
    # Rejected only after the swap, THP, C-state and NUMA roles wrote their files (issue 20, input 8).
    ({"grub_variable": "NOPE"}, "value of grub_variable must be one of: GRUB_CMDLINE_LINUX, "
                                "GRUB_CMDLINE_LINUX_DEFAULT, got: NOPE"),
    ({"inference_service_user": "root"}, "inference_service_user must be a system user name other than root"),
    ({"inference_service_max_output_tokens": 0}, "inference_service_max_output_tokens must be >= 1 (got 0)"),
    # llama-server takes any negative --cache-ram as no bound.
    ({"inference_service_llama_cpp_cache_ram_mib": -2},
     "inference_service_llama_cpp_cache_ram_mib must be >= -1 (-1: no bound, 0: off) (got -2)"),
    # Written into the nftables rule that keeps local users off the engine.
    ({"inference_service_engine_firewall_users": ["root", "x } accept"]},
     "inference_service_engine_firewall_users must be a list of user names or uids"),
    ({"inference_service_packages": []},
     "inference_service_packages must be non-empty for an engine whose program lives in the venv"),
    ({"inference_service_port": 70000}, 'inference_service_port must be 1-65535 (got 70000)'),
    ({"inference_service_listen": "0.0.0.0", "inference_service_api_key": KEY, "inference_service_proxy_port": 8000},
     "inference_service_proxy_port must be 1-65535, other than the engines' ports"),
    # The direct-run twin's port taken by an engine.
    ({"inference_service_engine_firewall_ports": [8000]},
     "inference_service_engine_firewall_ports must be other than the engines' ports"),
    ({"inference_service_layout": "both"}, "value of inference_service_layout must be one of: single, per_node, got: both"),
    ({"inference_service_listen": "0.0.0.0", "inference_service_api_key": "short"},
     "every API key (inference_service_api_key or inference_proxy_api_key, and each of the extra keys) must be at"),
    ({"inference_service_listen": "0.0.0.0", "inference_service_api_key": KEY,
      "inference_service_extra_api_keys": [KEY + " "]}, "every API key"),
    ({"inference_service_listen": "0.0.0.0"}, "is not loopback: set inference_service_api_key"),
    ({"numa_bind_node": 7}, "numa_bind_node must be null or one of the host's NUMA nodes"),
    ({"numa_bind_cpus": [4096]}, "numa_bind_cpus must be usable CPUs of the host"),
    # Issue 39, input 5: node 2 of a POWER LPAR has the CPUs but no memory; set_mempolicy(2) refuses it.
    ({"topology_sysroot": os.path.join(TOPOLOGY, "power9-lpar-memless"), "numa_bind_node": 2},
     "numa_bind_node must be null or one of the host's NUMA nodes with memory that the service's cgroup allows "
     "[0, 1]: set_mempolicy(2) refuses the others and the service would not start (got 2)"),
    ({"swap_swappiness": 300}, "swap_swappiness must be 0-200"),
    ({"cstates_max_latency_us": -1}, "must be >= 0"),
    ({"thp_enabled": "bogus"}, "value of thp_enabled must be one of: always, madvise, never, got: bogus"),
    ({"tuned_profile_name": "../etc"}, "tuned_profile_name must be letters, digits"),
    ({"grub_reboot_timeout": 5}, "grub_reboot_timeout must be at least 60 s"),
    ({"cpufreq_before_units": ["llm inference"]}, "cpufreq_before_units and cpufreq_disable_agents must be systemd"),
    # Issue 39, input 3: intel_pstate refuses any EPP but performance under the performance governor (EBUSY), after
    # the governor was already written, and the boot unit failed the same way at every boot.
    ({"topology_sysroot": os.path.join(TOPOLOGY, "xeon-2socket"), "cpufreq_epp": "balance_performance"},
     'cpufreq_epp must be performance, or "" to leave EPP alone, with cpufreq_governor performance on intel_pstate: '
     "the driver pins EPP to performance under that governor and refuses balance_performance with EBUSY"),
    # intel_pstate offers performance and powersave only.
    ({"topology_sysroot": os.path.join(TOPOLOGY, "xeon-2socket"), "cpufreq_governor": "schedutil"},
     "cpufreq_governor must be one of this host's governors ['performance', 'powersave'] (intel_pstate"),
    ({"inference_service_after_units": ["llmtune-cstates.service", "x\nExecStartPre=/bin/sh"]},
     "inference_service_after_units must be a list of systemd unit names"),
    ({"benchmark_concurrency": [0, 2]}, "benchmark_concurrency must be a non-empty list of levels >= 1"),
    ({"benchmark_fail_below": {"decode_tokens_per_s": 0}}, "benchmark_fail_below must be ratios > 0"),
    ({"inference_service_threads": "abc"}, "inference_service_threads"),
    # The auto-tune stage deployed llama-server --parallel 0 and showed it only as a failed row.
    ({"autotune_parallel": [0]}, "autotune_parallel must be a list of slot counts >= 1 (got [0])"),
    # The node exporter's textfile collector reads only *.prom files: metrics written elsewhere reach no scraper.
    ({"metrics_textfile": "/var/lib/prometheus/node-exporter/llmtune.txt"},
     "metrics_textfile must be an absolute path of a .prom file"),
    ({"llmtune_autotune": "maybe"}, "llmtune_autotune is 'maybe'"),
    ({"llmtune_on_failure": "reboot"}, "llmtune_on_failure is 'reboot'"),
]
GOOD = {"inference_service_listen": "0.0.0.0", "inference_service_api_key": KEY,
        "inference_service_extra_api_keys": [KEY.lower()]}


@pytest.fixture(scope="module")
def preflight(tmp_path_factory):
    """One run of the preflight over one inventory host per case (all this machine, connection local).

    Returns (rc, stats per host, messages of the failed tasks per host).
    """
    local = {"ansible_connection": "local", "ansible_python_interpreter": os.path.join(VENV_BIN, "python")}
    hosts = {"good": dict(local, **GOOD)}
    hosts.update({f"case-{n}": dict(local, **extra) for n, (extra, _message) in enumerate(CASES)})
    inventory = tmp_path_factory.mktemp("preflight") / "hosts.json"
    inventory.write_text(json.dumps({"inference_nodes": {"hosts": hosts}}))
    # The JSON callback alone: one enabled by the caller (test.sh's profile_tasks) would print into it.
    env = dict(os.environ, ANSIBLE_STDOUT_CALLBACK="ansible.posix.json", ANSIBLE_CALLBACKS_ENABLED="ansible.posix.json")
    # Every host to the end of the play: by default one failed host stops the others.
    proc = subprocess.run([os.path.join(VENV_BIN, "ansible-playbook"), "-i", str(inventory), "--forks", "4",
                           "-e", "llmtune_max_fail_percentage=100", os.path.join(ROOT, "playbooks", "preflight.yml")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    run = json.loads(proc.stdout)
    failed = {host: [] for host in hosts}
    for play in run["plays"]:
        for task in play["tasks"]:
            for host, result in task["hosts"].items():
                for item in result.get("results", [result]):
                    if item.get("failed"):
                        failed[host].append(f"{item.get('msg', '')} {item.get('argument_errors', '')}")
    return proc.returncode, run["stats"], failed


def test_good_variables_pass_and_change_nothing(preflight):
    rc, stats, failed = preflight
    assert rc == 2  # the bad hosts
    assert (failed["good"], stats["good"]["changed"], stats["good"]["failures"]) == ([], 0, 0)


@pytest.mark.parametrize("case", range(len(CASES)), ids=[message[:40] for _extra, message in CASES])
def test_bad_variable_fails_before_any_change(preflight, case):
    _rc, stats, failed = preflight
    host = f"case-{case}"
    assert (stats[host]["changed"], stats[host]["failures"]) == (0, 1)
    assert any(CASES[case][1] in text for text in failed[host]), failed[host]
