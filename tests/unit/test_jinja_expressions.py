"""Every Jinja regex and backslash escape of the project, rendered as Ansible renders it, on real inputs.

How many backslashes reach the regex engine depends on the YAML scalar style (a double-quoted scalar reads
escapes, folded, literal, plain and single-quoted ones do not) and on where Jinja meets the string: ansible-core
2.19 keeps backslashes of string literals inside {{ }} of a task value as they are, but Jinja reads them as
escapes in {% %} statements, in conditionals (when, that, failed_when) and in template files. So each
expression is taken from its YAML file as ansible-core loads it and rendered with ansible-core's Templar:
template() for task values, evaluate_conditional() for conditionals, template(escape_backslashes=False) for
template files, as the template action does.
"""

import base64
import hashlib
import json
import shutil
import subprocess
import contextlib
import os
import warnings

import cpu_topology
import pytest
from conftest import FIXTURES, ROOT, VENV_BIN, read, role_module

from ansible.errors import AnsibleValueOmittedError
from ansible.module_utils import _internal as module_utils_internal
from ansible.module_utils import llmtune_engines as engines
from ansible.module_utils import llmtune_service_layout as service_layout
from ansible.module_utils.llmtune_swap import parse_systemctl_show
from ansible.parsing.dataloader import DataLoader
from ansible.plugins.loader import init_plugin_loader
from ansible.template import Templar, trust_as_template

# Importing ansible's controller code marks the whole process as the controller, after which modules send their
# warnings to the display instead of their result (which other test files check). Only the renders below run so.
module_utils_internal.is_controller = False

JINJA = os.path.join(FIXTURES, "jinja")
TUNING = os.path.join(FIXTURES, "tuning")

swap_sources = role_module("swap", "swap_sources")


def load(relpath):
    return DataLoader().load_from_file(os.path.join(ROOT, relpath))


def _walk(node):
    if isinstance(node, list):
        for item in node:
            yield from _walk(item)
    elif isinstance(node, dict):
        if "name" in node:
            yield node
        for key in ("tasks", "pre_tasks", "post_tasks", "handlers", "block", "rescue", "always"):
            yield from _walk(node.get(key, []))


def task(relpath, name):
    """The one task or play named ``name`` in ``relpath``, as ansible-core loads it."""
    found = [node for node in _walk(load(relpath)) if node["name"] == name]
    assert len(found) == 1, "%s: %d tasks named %r" % (relpath, len(found), name)
    return found[0]


@contextlib.contextmanager
def controller():
    """Run as ansible-core's controller. Where Jinja reads escapes, an invalid one such as a regex's "\\s" only
    works through a deprecated leniency of Python's codec: that warning is made an error."""
    module_utils_internal.is_controller = True
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", DeprecationWarning)
            yield
    finally:
        module_utils_internal.is_controller = False


def render(expr, **variables):
    with controller():
        return Templar(loader=DataLoader(), variables=variables).template(trust_as_template(expr))


def task_vars(tsk, **variables):
    """VARIABLES plus the task's own ``vars``, each rendered in order (a var may use the ones before it)."""
    resolved = dict(variables)
    for name, expr in tsk.get("vars", {}).items():
        resolved[name] = render(expr, **resolved) if isinstance(expr, str) else expr
    return resolved


def render_tree(node, **variables):
    """A task value of nested dicts and lists, each string rendered (as a task's arguments are)."""
    if isinstance(node, dict):
        return {key: render_tree(value, **variables) for key, value in node.items()}
    if isinstance(node, list):
        return [render_tree(value, **variables) for value in node]
    return render(node, **variables) if isinstance(node, str) else node


def condition(expr, **variables):
    with controller():
        return Templar(loader=DataLoader(), variables=variables).evaluate_conditional(trust_as_template(expr))


def render_template_file(relpath, **variables):
    """The template RELPATH rendered as the template lookup does: its own folder is where its includes are found."""
    loader = DataLoader()
    loader.set_basedir(os.path.dirname(os.path.join(ROOT, relpath)))
    with controller():
        return Templar(loader=loader, variables=variables).template(
            trust_as_template(read(ROOT, relpath)), escape_backslashes=False)


# --- roles/swap: what boot.yml does with swap_sources' facts ---------------------------------------------------

BOOT = "roles/swap/tasks/boot.yml"


MAIN = "roles/swap/tasks/main.yml"
SDA7 = ("/dev/sda7: not enough memory: 3417 MiB of swap in use, MemAvailable 1181 MiB, margin 256 MiB "
        "(2493 MiB short)")


@pytest.mark.parametrize("swap_off_result, required", [
    ({"changed": True, "reboot_required": True, "runtime_reason": SDA7}, True),
    ({"changed": False, "reboot_required": False, "runtime_reason": ""}, False),
    # swap_disable=false: the swap_off task was skipped
    ({"changed": False, "skipped": True, "skip_reason": "Conditional result was False"}, False),
])
def test_swap_reboot_required_fact(swap_off_result, required):
    tsk = task(MAIN, "Note whether swap needs a reboot to be off")
    fact = render(tsk["ansible.builtin.set_fact"]["swap_reboot_required"], swap_off_result=swap_off_result)
    assert fact is required


def test_swap_left_on_message():
    tsk = task(MAIN, "Report swap areas left on")
    variables = {"swap_disable": True, "swap_reboot_required": True,
                 "swap_off_result": {"reboot_required": True, "runtime_reason": SDA7}}
    assert condition(tsk["when"], **variables)
    assert render(tsk["ansible.builtin.debug"]["msg"], **variables) == (
        "swap: left on now: " + SDA7 + "; reboot needed: swap is off at boot from now on")
    assert not condition(tsk["when"], **dict(variables, swap_off_result={"runtime_reason": ""}))


def services_of(host):
    return swap_sources.service_facts(parse_systemctl_show(read(TUNING, "systemctl", host + ".show")))


@pytest.mark.parametrize("reboot_required, names", [
    (False, ["dphys-swapfile.service", "systemd-zram-setup@zram0.service"]),
    # an area left on: stopping a service would run its swapoff without the memory check
    (True, ["dphys-swapfile.service"]),
])
def test_services_disabled_and_stopped(reboot_required, names):
    tsk = task(BOOT, "Disable the services that create swap at boot, stop them when swap is off")
    services = services_of("raspios-dphys") + services_of("debian12-zram")
    variables = {"swap_sources_result": {"services": services}, "swap_reboot_required": reboot_required}
    loop = render(tsk["loop"], **variables)
    assert [s["name"] for s in loop] == names
    args = tsk["ansible.builtin.systemd_service"]
    assert render(args["enabled"], item=loop[0], **variables) is False
    if reboot_required:
        with pytest.raises(AnsibleValueOmittedError):
            render(args["state"], item=loop[0], **variables)
    else:
        assert render(args["state"], item=loop[1], **variables) == "stopped"
        # a static unit (zram-generator's instance) cannot be disabled, only stopped
        with pytest.raises(AnsibleValueOmittedError):
            render(args["enabled"], item=loop[1], **variables)


def run_boot_script(tmp_path, script, config):
    """Run a zram-config boot SCRIPT (text) on CONFIG with logging stand-ins of zramctl, mkswap and swapon; the
    commands it ran."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    log = tmp_path / "commands.log"
    log.write_text("")
    for name, body in (("zramctl", "echo /dev/zram1"), ("mkswap", ""), ("swapon", "")):
        (bindir / name).write_text('#!/bin/sh\necho "%s $*" >> %s\n%s\n' % (name, log, body))
        (bindir / name).chmod(0o755)
    path = tmp_path / "armbian-zram-config.sh"
    path.write_text(script.replace("/etc/default/armbian-zram-config", str(config)))
    subprocess.run(["bash", str(path), "start"], env={"PATH": "%s:/usr/bin:/bin" % bindir}, check=True)
    return log.read_text().splitlines()


@pytest.mark.parametrize("reads_swap, key", [(True, "SWAP"), (False, "ENABLED")])
def test_armbian_zram_config_stops_making_swap(tmp_path, reads_swap, key):
    """Issue 39, input 1: the task's edit of /etc/default/armbian-zram-config, made by the real lineinfile module, and
    the tree's stand-in of the boot script run on the file before and after (an older script reads no SWAP)."""
    block = task(BOOT, "Keep the Armbian / Orange Pi zram-config scripts from making swap")
    tsk = next(t for t in block["block"] if t["name"] == "Turn the zram-config scripts' swap off")
    config = tmp_path / "armbian-zram-config"
    config.write_text(read(TUNING, "armbian-zram", "etc", "default", "armbian-zram-config"))
    script = read(TUNING, "armbian-zram", "usr", "lib", "armbian", "armbian-zram-config")
    if not reads_swap:
        script = "\n".join(line for line in script.splitlines() if "SWAP" not in line)
    assert run_boot_script(tmp_path, script, config)[-1] == "swapon --priority 5 /dev/zram1"
    args = render_tree(tsk["ansible.builtin.lineinfile"], item={"config": str(config), "reads_swap": reads_swap})
    done = subprocess.run([os.path.join(VENV_BIN, "ansible"), "localhost", "-i", "localhost,", "-c", "local", "-m",
                           "ansible.builtin.lineinfile", "-a", json.dumps(args),
                           "-e", "ansible_python_interpreter=" + os.path.join(VENV_BIN, "python")],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout
    assert key + "=false" in config.read_text().splitlines()
    assert run_boot_script(tmp_path, script, config) == []


def test_swap_areas_of_unknown_origin_fail_the_role_by_name():
    find = task(BOOT, "Find what brings swap back at boot")["swap_sources"]
    swaps = {"swaps": [{"filename": "/dev/zram1", "type": "partition", "size_kb": 1999868, "used_kb": 0, "priority": 5}]}
    assert render(find["areas"], swap_off_result=swaps) == ["/dev/zram1"]
    check = task(BOOT, "Fail on swap areas that nothing found sets up")["ansible.builtin.assert"]
    found = {"swap_sources_result": {"unknown_origin": ["/dev/zram1"]}}
    assert not condition(check["that"], **found)
    assert render(check["fail_msg"], **found).startswith("swap: /dev/zram1 was on, and none of fstab, a swap unit file,")
    assert condition(check["that"], swap_sources_result={"unknown_origin": []})


def test_verify_names_the_swap_areas_nothing_known_makes():
    rows = task("roles/swap/tasks/verify.yml", "Compare swap with the running kernel, the sysctl files and fstab")
    expr = rows["tuning_drift"]["rows"]
    zram = {"installed": True, "swap_units": []}
    sources = {"origins_checked": True, "unknown_origin": ["/dev/zram1"]}
    assert render(expr, swap_verify_zram=zram, swap_verify_sources=sources) == [
        {"setting": "swap.zram_generator", "wanted": "no swap unit", "actual": "none", "status": "ok"},
        {"setting": "swap.unknown_origin", "wanted": "none", "actual": "/dev/zram1", "status": "drift"}]
    # Skipped (swap_disable false), or not checked (no systemd, a container): no rows.
    skipped = {"skipped": True}
    assert render(expr, swap_verify_zram=skipped, swap_verify_sources=skipped) == []
    assert render(expr, swap_verify_zram={"installed": False},
                  swap_verify_sources={"origins_checked": False, "unknown_origin": []}) == []


DPHYS_100M = {"config": "/etc/dphys-swapfile", "swapsize": "100", "swapfile": "/var/swap",
              "swapfile_bytes": 104857600}


@pytest.mark.parametrize("dphys, left_on, backup, record", [
    (DPHYS_100M, [], True, False),
    (dict(DPHYS_100M, swapfile_bytes=2147483648), [], False, True),
    # swap_off could not turn it off: the file stays until the next run after a reboot
    (DPHYS_100M, [{"filename": "/var/swap", "reason": "not enough memory"}], False, False),
    (dict(DPHYS_100M, swapfile_bytes=None), [], False, False),
])
def test_dphys_swap_file_backed_up_or_recorded(dphys, left_on, backup, record):
    block = task(BOOT, "Keep dphys-swapfile from making swap")
    variables = {"swap_sources_result": {"dphys_swapfile": dphys}, "swap_off_result": {"left_on": left_on},
                 "swap_file_backup_max_mb": 128}
    variables.update({name: trust_as_template(expr) for name, expr in block["vars"].items()})
    assert condition(block["when"], **variables)
    steps = {t["name"]: t for t in block["block"]}
    assert all(condition(w, **variables) for w in steps["Back up the small dphys-swapfile swap file"]["when"]) is backup
    assert all(condition(w, **variables)
               for w in steps["Record the size of the large dphys-swapfile swap file"]["when"]) is record
    assert condition(steps["Remove the dphys-swapfile swap file"]["when"], **variables) is (backup or record)
    if record:
        args = steps["Record the size of the large dphys-swapfile swap file"]["tuning_state"]
        assert render(args["key"], **variables) == "swap.file./var/swap"
        assert render(args["original"], **variables) == "2147483648"


def test_zram_generator_drop_in_sizes_every_swap_device_zero():
    block = task(BOOT, "Keep zram-generator from making zram swap")
    facts = {"zram_generator": {"installed": True, "config_files": [], "devices": ["zram0", "zram1"],
                                "mount_devices": []}}
    devices = render(block["vars"]["swap_zram_devices"], swap_sources_result=facts)
    assert devices == ["zram0", "zram1"]
    assert render(block["vars"]["swap_zram_devices"], swap_sources_result={"zram_generator": {
        "devices": [], "mount_devices": []}}) == ["zram0"]
    # zram0 formatted as a file system is no swap device: kept (the kernel's systemd.zram=1 only adds defaults).
    assert render(block["vars"]["swap_zram_devices"], swap_sources_result={"zram_generator": {
        "devices": ["zram1"], "mount_devices": ["zram0"]}}) == ["zram1"]
    text = render_template_file("roles/swap/templates/zram-generator.conf.j2", swap_zram_devices=devices,
                                ansible_managed="Ansible managed")
    # Every size key any release reads (tests/unit/test_zram_generator_units.py runs the real generator on it).
    assert text.splitlines()[5:] == ["", "[zram0]", "zram-size = 0", "zram-fraction = 0", "max-zram-size = 0",
                                     "", "[zram1]", "zram-size = 0", "zram-fraction = 0", "max-zram-size = 0"]


# --- the variables' checks against a host's kernel (playbooks/preflight.yml) ----------------------------------

@pytest.mark.parametrize("driver, governor, epp, ok", [
    # Issue 39, input 3, and amd-pstate's active mode (its driver is amd-pstate-epp): EBUSY under performance.
    ("intel_pstate", "performance", "balance_performance", False),
    ("amd-pstate-epp", "performance", "power", False),
    ("intel_pstate", "performance", "performance", True),
    ("intel_pstate", "performance", "", True),
    ("intel_pstate", "powersave", "balance_performance", True),
    # Passive modes (intel_cpufreq, amd-pstate) and acpi-cpufreq do not pin EPP.
    ("intel_cpufreq", "performance", "balance_performance", True),
])
def test_cpufreq_refuses_the_governor_and_epp_pairs_the_driver_refuses(driver, governor, epp, ok):
    tsk = task("roles/cpufreq/tasks/variables.yml", "Check the governor and EPP against the host's cpufreq driver")
    cpufreq = {"present": True, "driver": driver, "available_governors": ["performance", "powersave"], "epp": True,
               "epp_choices": ["default", "performance", "balance_performance", "balance_power", "power"]}
    variables = dict(load("roles/cpufreq/vars/main.yml"), cpufreq_governor=governor, cpufreq_epp=epp,
                     ansible_facts={"cpu_topology": {"cpufreq": cpufreq}})
    variables = task_vars(tsk, **variables)
    assert all(condition(tsk["ansible.builtin.assert"]["that"], item=render_tree(item, **variables))
               for item in tsk["loop"]) is ok


def test_cpufreq_checks_every_policys_governor_and_epp_before_any_write():
    tsk = task("roles/cpufreq/tasks/apply.yml", "Check the governor and EPP against each policy's choices")
    policies = ["/sys/devices/system/cpu/cpufreq/policy0", "/sys/devices/system/cpu/cpufreq/policy1"]
    items = render(tsk["loop"], cpufreq_policy_paths=policies, cpufreq_governor="performance", cpufreq_epp="performance")
    assert [(i[0][-7:], i[1]["file"], i[1]["choices"]) for i in items] == [
        ("policy0", "scaling_governor", "scaling_available_governors"),
        ("policy0", "energy_performance_preference", "energy_performance_available_preferences"),
        ("policy1", "scaling_governor", "scaling_available_governors"),
        ("policy1", "energy_performance_preference", "energy_performance_available_preferences")]
    assert len(render(tsk["loop"], cpufreq_policy_paths=policies, cpufreq_governor="performance", cpufreq_epp="")) == 2
    names = [t["name"] for t in load("roles/cpufreq/tasks/apply.yml")]
    assert names.index("Check the governor and EPP against each policy's choices") < names.index("Set the governor now")


@pytest.mark.parametrize("release, swappiness, ok", [
    # RHEL 7's kernel refuses vm.swappiness above 100 (EINVAL); 5.8 raised the limit to 200.
    ("3.10.0-1160.el7.x86_64", 150, False), ("3.10.0-1160.el7.x86_64", 100, True),
    ("5.4.0-150-generic", 101, False), ("5.8.0-63-generic", 200, True), ("5.15.0-91-generic", 150, True),
    ("6.1.0-27-amd64", 200, True)])
def test_swappiness_above_100_needs_linux_5_8(release, swappiness, ok):
    tsk = task("roles/swap/tasks/variables.yml", "Check vm.swappiness against the host's kernel")
    variables = task_vars(tsk, swap_swappiness=swappiness, ansible_facts={"cpu_topology": {"kernel_release": release}})
    assert condition(tsk["when"], **variables)
    assert condition(tsk["ansible.builtin.assert"]["that"], **variables) is ok


def test_thp_values_the_kernel_does_not_offer_are_refused():
    # RHEL 7's kernel offers no defer or defer+madvise (added in 4.6 and 4.11).
    tsk = task("roles/thp/tasks/variables.yml", "Check the THP values against the host's kernel")
    thp = {"enabled_choices": ["always", "madvise", "never"], "defrag_choices": ["always", "madvise", "never"]}
    variables = task_vars(tsk, thp_enabled="always", thp_defrag="defer+madvise",
                          ansible_facts={"cpu_topology": {"thp": thp}})
    items = [render_tree(item, **variables) for item in tsk["loop"]]
    assert [condition(tsk["ansible.builtin.assert"]["that"], item=item) for item in items] == [True, False]
    assert render(tsk["ansible.builtin.assert"]["fail_msg"], item=items[1]) == (
        "thp_defrag must be one of this host's choices ['always', 'madvise', 'never'] "
        "(/sys/kernel/mm/transparent_hugepage/defrag) (got defer+madvise)")


# --- roles/rollback ------------------------------------------------------------------------------------------

RESTORE = "roles/rollback/tasks/restore.yml"

SETTINGS = {
    "swap.areas": {"original": "/dev/sda3\n/var/swap"},
    "swap.unit.dev-sda3.swap": {"original": "loaded active active Swap Partition"},
    "swap.unit.dev-disk-by\\x2duuid-0b1c.swap": {"original": "loaded active active /dev/disk/by-uuid/0b1c"},
    "swap.unit.var-swap.swap": {"original": "masked inactive dead var-swap.swap"},
    "swap.service.dphys-swapfile.service": {"original": "running enabled"},
    "swap.service.systemd-zram-setup@zram0.service": {"original": "running static"},
    "cpufreq.agent.power-profiles-daemon.service": {"original": "stopped disabled"},
    "swap.file./var/swap": {"original": "2147483648"},
    # keys a regex with an unescaped dot would take
    "swapXunitXdev-sdb2.swap": {"original": "loaded active active /dev/sdb2"},
    "swapXserviceXzramswap.service": {"original": "running enabled"},
    "swapXfileX/srv/swap": {"original": "1048576"},
}


def test_rollback_unmasks_the_swap_units_it_masked():
    tsk = task(RESTORE, "Unmask the swap units the swap role masked")
    loop = render(tsk["loop"], rollback_settings=SETTINGS)
    assert [i["key"] for i in loop] == ["swap.unit.dev-sda3.swap", "swap.unit.dev-disk-by\\x2duuid-0b1c.swap"]
    assert [render(tsk["ansible.builtin.systemd_service"]["name"], item=i) for i in loop] == [
        "dev-sda3.swap", "dev-disk-by\\x2duuid-0b1c.swap"]


def test_rollback_restarts_the_services_it_stopped():
    tsk = task(RESTORE, "Restart and re-enable the agents the tuning stopped")
    loop = render(tsk["loop"], rollback_settings=SETTINGS)
    args = tsk["ansible.builtin.systemd_service"]
    assert [render(args["name"], item=i) for i in loop] == [
        "dphys-swapfile.service", "systemd-zram-setup@zram0.service", "power-profiles-daemon.service"]
    assert render(args["enabled"], item=loop[0]) is True
    assert render(args["state"], item=loop[1]) == "started"


def test_rollback_makes_the_large_swap_files_again():
    assert condition(task(RESTORE, "Make the large swap files the swap role removed again")["when"],
                     rollback_settings=SETTINGS)
    assert not condition(task(RESTORE, "Make the large swap files the swap role removed again")["when"],
                         rollback_settings={"swap.areas": {"original": "/dev/sda3"}})
    tsk = task("roles/rollback/tasks/swapfiles.yml", "Write the removed swap files again, zeros of their recorded size")
    loop = render(tsk["loop"], rollback_settings=SETTINGS)
    assert [i["key"] for i in loop] == ["swap.file./var/swap"]
    argv = [render(arg, item=loop[0]) for arg in tsk["ansible.builtin.command"]["argv"]]
    assert argv == ["dd", "if=/dev/zero", "of=/var/swap", "bs=1M", "count=2147483648", "iflag=count_bytes"]
    assert render(tsk["ansible.builtin.command"]["creates"], item=loop[0]) == "/var/swap"


def test_rollback_finds_the_units_it_created():
    tsk = task(RESTORE, "Look for the units the tuning created")
    files = {"/etc/systemd/system/llm-inference.service": {"existed": False},
             "/etc/systemd/system/llmtune-cstates.service": {"existed": False},
             "/etc/systemd/system/llm-inferenceXservice": {"existed": False},
             "/etc/systemd/system/llm-inference.service.d/override.conf": {"existed": False},
             "/etc/systemd/system/ssh.service": {"existed": True}}
    assert render(tsk["vars"]["rollback_created_units"], rollback_files=files) == [
        "/etc/systemd/system/llm-inference.service", "/etc/systemd/system/llmtune-cstates.service"]


# --- roles/numa -----------------------------------------------------------------------------------------------

def _nodes(count):
    return {"cpu_topology": {"numa_nodes": [{"id": node} for node in range(count)]}}


@pytest.mark.parametrize("disable, facts, off", [
    # The kernel balances only between two or more nodes (mm/mempolicy.c, check_numabalancing_enable).
    (True, _nodes(2), True),
    (True, _nodes(1), False),
    # No NUMA sysfs (a kernel without CONFIG_NUMA): no node listed, and no sysctl either.
    (True, _nodes(0), False),
    # Without the topology facts the role cannot tell: as asked.
    (True, {}, True),
    (False, _nodes(2), False),
])
def test_numa_balancing_turned_off_only_with_two_or_more_nodes(disable, facts, off):
    expr = load("roles/numa/vars/main.yml")["__numa_balancing_off"]
    assert render(expr, numa_balancing_disable=disable, ansible_facts=facts) is off


def numa_binding(facts, **overrides):
    """The facts roles/numa/tasks/binding.yml sets, its set_fact tasks rendered in order on the role's defaults."""
    variables = dict(load("roles/numa/defaults/main.yml"), ansible_facts={"cpu_topology": facts}, **overrides)
    for tsk in load("roles/numa/tasks/binding.yml"):
        for name, expr in tsk.get("ansible.builtin.set_fact", {}).items():
            variables[name] = render(expr, **variables) if isinstance(expr, str) else expr
    return {name: variables[name] for name in ("numa_service_cpu_affinity", "numa_service_policy", "numa_service_mask")}


def test_memory_is_bound_only_to_a_node_that_has_memory():
    """Issue 39, input 5: the POWER LPAR's CPUs are on node 2, which has no memory (NUMAMask=2 failed the unit)."""
    facts = cpu_topology.gather(os.path.join(FIXTURES, "topology", "power9-lpar-memless"))
    facts["numa_policy_permitted"] = True
    assert numa_binding(facts) == {"numa_service_cpu_affinity": "0 4", "numa_service_policy": "bind",
                                   "numa_service_mask": "0"}
    # numa_bind_node still wins (tasks/variables.yml keeps it to nodes with memory the cgroup allows).
    assert numa_binding(facts, numa_bind_node=1)["numa_service_mask"] == "1"
    facts["numa_policy_permitted"] = None
    assert numa_binding(facts)["numa_service_policy"] == ""


# --- roles/inference_service, roles/autotune, roles/grub, roles/fleet_report ----------------------------------

def test_sandbox_exposure_line():
    tsk = task("roles/inference_service/tasks/service.yml", "Show the exposure score")
    out = read(JINJA, "systemd-analyze-security")
    assert render(tsk["ansible.builtin.debug"]["msg"], __inference_service_security={"stdout": out}) == (
        "Overall exposure level for llm-inference.service: 1.9 OK")


def test_grub_bls_args_from_grubby():
    tsk = task("roles/grub/tasks/regenerate-RedHat.yml", "Set the kernel arguments of every BLS entry")
    lines = read(JINJA, "grubby-info-rhel9").splitlines()
    args = render(tsk["vars"]["grub_bls_args"], grub_bls_info={"stdout_lines": lines})
    assert len(args) == 2
    assert args[0][-2:] == ["quiet", "processor.max_cstate=1"]
    assert args[1][0] == "ro" and args[1][-1] == "quiet"


FLEET_HOSTS = {
    "llmtune-fleet-1": {"status": "ok", "settings": ["swap.swappiness"], "files": ["/etc/fstab"], "balancer": "in"},
    "llmtune-fleet-2": {"status": "failed", "action": "rolled back", "balancer": "out", "failed_step": "Validate the gain",
                        "message": "decode_tokens_per_s 3.1 | below\n  baseline 4.0"},
    "llmtune-fleet-3": {"status": "ok", "balancer": "in"},
    "llmtune-fleet-4": {"status": "not reached"},
}


def test_fleet_table_note_and_the_checks_of_the_fleet_scenario():
    text = render_template_file("roles/fleet_report/templates/fleet.md.j2",
                                __fleet_report={"started": "2026-01-05T10:00:00Z", "hosts": FLEET_HOSTS})
    row = [line for line in text.splitlines() if line.startswith("| llmtune-fleet-2 ")][0]
    # white space runs (the newline too) become one space, a pipe is escaped for markdown
    assert row.endswith("| rolled back; left out of the balancer; Validate the gain: decode_tokens_per_s 3.1 \\| below "
                        "baseline 4.0 |")
    # A host in the pool has nothing to note.
    assert [line for line in text.splitlines() if line.startswith("| llmtune-fleet-1 ")][0].endswith("| - |")
    that = task("molecule/fleet/verify.yml", "Check the table has one row per node with its status")
    for check in that["ansible.builtin.assert"]["that"]:
        assert condition(check, __md=text), check
    assert not condition(that["ansible.builtin.assert"]["that"][0], __md=text.replace("| ok |", "| failed |"))


FLEET_ROW = "roles/fleet_report/tasks/main.yml"


@pytest.fixture(scope="module", autouse=True)
def plugins():
    """ansible-core's plugin loader, for expressions and templates that use lookups (file, template): for every test
    of this file, so that none depends on another having run first in its process."""
    init_plugin_loader()


@pytest.mark.parametrize("report, tuned, measured", [
    # this run measured (the report before `reported` existed: its measurement time counts)
    ({"result": {"started": "2026-12-02T04:36:10Z", "summary": {"decode_tokens_per_s": 10.7}}}, 10.7, ""),
    # a re-run reused the stored validation: reported in this run, measured before it (the demo's re-run showed "-")
    ({"reported": "2026-12-02T04:36:50Z", "reused": True,
      "result": {"started": "2026-12-02T04:20:00Z", "summary": {"decode_tokens_per_s": 10.7}}}, 10.7, "2026-12-02T04:20:00Z"),
    # a report left by an earlier run that stopped before validating: stale
    ({"reported": "2026-12-02T03:10:00Z", "reused": False,
      "result": {"started": "2026-12-02T03:09:00Z", "summary": {"decode_tokens_per_s": 9.9}}}, None, ""),
])
def test_fleet_row_takes_this_runs_report_even_when_it_reused_a_validation(tmp_path, report, tuned, measured):
    (tmp_path / "fleet.json").write_text(json.dumps({"started": "2026-12-02T04:35:00Z", "hosts": {}}))
    (tmp_path / "node.json").write_text(json.dumps(report))
    tsk = task(FLEET_ROW, "Put the row together")
    variables = task_vars(tsk, fleet_report_dir=str(tmp_path), inventory_hostname="node", fleet_report_failure={},
                          fleet_report_action="", ansible_facts={}, __fleet_report_baseline={})
    row = tsk["ansible.builtin.set_fact"]["__fleet_report_row"]
    assert render(row["tuned"], **variables).get("decode_tokens_per_s") == tuned
    assert render(row["tuned_measured"], **variables) == measured


# --- molecule and the VM checks ----------------------------------------------------------------------------

@pytest.mark.parametrize("engine, model, context", [
    ("llama_cpp", "qwen3-test-tiny", 2048),
    ("transformers", "/var/lib/llm-inference/models/qwen3-0.6b-proxy", None),
    ("vllm", "qwen3-0.6b-2l-proxy", 1024)])
def test_verify_api_reads_execstart(engine, model, context):
    tsk = task("molecule/default/verify_api.yml", "Take the engine and served model from ExecStart")
    execstart = read(JINJA, "execstart-" + engine).strip()
    variables = {"__exec": execstart}
    variables["__engine"] = render(tsk["vars"]["__engine"], **variables)
    facts = tsk["ansible.builtin.set_fact"]
    assert render(facts["verify_api_engine"], **variables) == engine
    assert render(facts["verify_api_model"], **variables) == model
    assert render(facts["verify_api_context"], **variables) == context


def test_llama_cpp_verify_finds_llama_bench_beside_the_server():
    tsk = task("molecule/llama_cpp/verify.yml", "Run llama-bench on the same GGUF, threads and CPUs")
    status = {"ExecStart": read(JINJA, "execstart-llama_cpp").strip()}
    assert render(tsk["vars"]["__bin"], verify_llama_service={"status": status}) == \
        "/opt/llmtune/llama.cpp-0.3.36-x86_64-2e669cd01475/llama-bench"


def test_llama_cpp_verify_prints_the_concurrency_table():
    tsk = task("molecule/llama_cpp/verify.yml", "Show the concurrency table and the peer reference")
    levels = [{"concurrency": c, "output_tokens_per_s": tps, "ttft_ms": {"p50": 300.0, "p95": 600.0},
               "decode_tokens_per_s": {"p50": 15.5}} for c, tps in ((1, 14.3), (2, 23.5), (4, 38.2), (8, 35.7))]
    lines = render(tsk["ansible.builtin.debug"]["msg"], verify_llama_levels={"levels": levels, "host_load": {
        "loadavg_before": [0.5, 0.4, 0.3]}}, verify_llama_bench={"stdout": '[{"avg_ts": 15.8}]'})
    assert lines[3].split() == ["4", "38.2", "2.67", "300.0", "600.0"]
    assert lines[-1].startswith("single-stream decode 15.5 tok/s, llama-bench tg32 15.8 tok/s (-1.9 %)")


def test_verify_api_checks_the_proxy_keeps_digests_not_keys():
    # The key map holds the first 128 bits of each key's SHA-256 (the presented token's, by njs); the API test checks
    # that on the host, and fails a file that holds a key (what the map's regular expressions held before).
    keys = ["s3cr3t-Token_with.chars~+/aBcDeFgH==", "second-client-key-0123456789abcdefXYZ"]
    conf = render_template_file("roles/inference_proxy/templates/key.conf.j2", inference_proxy_api_key=keys[0],
                                inference_proxy_extra_api_keys=keys[1:], inference_proxy_name="llm-inference",
                                ansible_managed="Ansible managed")
    assert [line.split() for line in conf.splitlines() if not line.startswith("#")] == [
        [hashlib.sha256(key.encode()).hexdigest()[:32], "1;"] for key in keys]
    tsk = task("molecule/default/verify_api.yml", "Check it holds each key's SHA-256 (first 128 bits), not the key")

    def holds(text):
        content = {"content": base64.b64encode(text.encode()).decode()}
        variables = task_vars(tsk, verify_api_keys=keys, verify_api_key_file=content)
        return all(condition(c, **variables) for c in tsk["ansible.builtin.assert"]["that"])

    assert holds(conf)
    assert not holds(conf + '"~^Bearer %s$" 1;\n' % keys[0])
    assert not holds(conf.replace(hashlib.sha256(keys[1].encode()).hexdigest()[:32], "0" * 32))


def test_verify_tuning_finds_no_active_swap_line():
    tsk = task("molecule/default/verify_tuning.yml", "Check the persistent files")
    check = [c for c in tsk["ansible.builtin.assert"]["that"] if "regex_search" in c][0]
    tuned = "UUID=3f5a / ext4 errors=remount-ro 0 1\n#llmtune# /swapfile none swap sw 0 0\n"
    assert condition(check, __f={"/etc/fstab": tuned})
    assert not condition(check, __f={"/etc/fstab": tuned.replace("#llmtune# ", "")})
    assert not condition(check, __f={"/etc/fstab": "UUID=3f5a / ext4 defaults 0 1\n/swapfile\tnone\tswap\tsw\t0\t0\n"})


def test_vm_checks_parse_grep_output():
    play = task("tests/vm/checks.yml", "Check the settings in force on the VM")
    lines = read(JINJA, "vm-grep-tuned").splitlines()
    split = task("tests/vm/checks.yml", "Split the output by file")["ansible.builtin.set_fact"]["vm_checks_text"]
    files = render(split, vm_checks_grep={"stdout_lines": lines})
    assert files["/etc/fstab"] == ("UUID=3f5a8c2e-7d41-4b9a-a6f3-0c2d9e8b1a47 / ext4 errors=remount-ro 0 1\n"
                                   "#llmtune# /swapfile none swap sw 0 0")
    variables = {name: trust_as_template(value) if isinstance(value, str) else value
                 for name, value in play["vars"].items()}
    variables.update(vm_checks_text=files, vm_checks_unit_states={}, vm_checks_answer={}, vm_checks_nodes=2)
    parse = task("tests/vm/checks.yml", "Parse the observed values")["ansible.builtin.set_fact"]["vm_checks_observed"]
    observed = render(parse, **variables)
    assert observed["THP enabled"] == "always" and observed["THP defrag"] == "madvise"
    assert observed["cmdline processor.max_cstate"] == "processor.max_cstate=1"
    assert observed["cmdline intel_idle.max_cstate"] == "absent"
    assert observed["swap lines in fstab"] == "none" and observed["swap areas in use"] == "none"
    assert observed["vm.swappiness"] == "1"


E0, E1 = "llm-inference@0.service", "llm-inference@1.service"


@pytest.mark.parametrize("engines, lines, memory_mb, wrong", [
    # One engine per node as the VM runs them: each on its node's core, memory bound there.
    ([E0, E1], [E0 + " cpus_allowed=0", E0 + " mems_allowed=0", E0 + " mempolicy=bind:0",
                E1 + " cpus_allowed=1", E1 + " mems_allowed=1", E1 + " mempolicy=bind:1"], 1510, []),
    # The second engine on the first node's core and memory.
    ([E0, E1], [E0 + " cpus_allowed=0", E0 + " mems_allowed=0", E0 + " mempolicy=bind:0",
                E1 + " cpus_allowed=0", E1 + " mems_allowed=0", E1 + " mempolicy=bind:0"], 1510,
     ["engine@1 Cpus_allowed_list", "engine@1 Mems_allowed_list", "engine@1 memory policy"]),
    # Memory policy bound but the cgroup allowing every node (no cpuset controller).
    ([E0, E1], [E0 + " cpus_allowed=0", E0 + " mems_allowed=0-1", E0 + " mempolicy=bind:0",
                E1 + " cpus_allowed=1", E1 + " mems_allowed=0-1", E1 + " mempolicy=bind:1"], 1510,
     ["engine@0 Mems_allowed_list", "engine@1 Mems_allowed_list"]),
    # One engine, as the numa role binds it on the two-node VM: CPU 0, memory policy bind to node 0.
    (["llm-inference.service"], ["llm-inference.service cpus_allowed=0", "llm-inference.service mems_allowed=0-1",
                                 "llm-inference.service mempolicy=bind:0"], 1510, []),
    # Unpinned and unbound, where the service ignored the binding.
    (["llm-inference.service"], ["llm-inference.service cpus_allowed=0-1", "llm-inference.service mems_allowed=0-1",
                                 "llm-inference.service mempolicy=default"], 1510,
     ["engine Cpus_allowed_list", "engine memory policy"]),
    # A node size cpu_topology got wrong.
    ([E0, E1], [E0 + " cpus_allowed=0", E0 + " mems_allowed=0", E0 + " mempolicy=bind:0",
                E1 + " cpus_allowed=1", E1 + " mems_allowed=1", E1 + " mempolicy=bind:1"],
     1024, ["NUMA node MiB (numactl)"]),
])
def test_vm_checks_topology_agrees_with_lscpu_and_numactl(engines, lines, memory_mb, wrong):
    topology = cpu_topology.gather(os.path.join(FIXTURES, "topology", "qemu-2node"))
    topology["numa_nodes"][0]["memory_mb"] = memory_mb
    compare = task("tests/vm/checks.yml", "Compare the topology with lscpu's and numactl's")
    rows = render(compare["vars"]["__rows"], vm_checks_tools={"stdout_lines": read(JINJA, "vm-topology-tools").splitlines()},
                  vm_checks_topology={"ansible_facts": {"cpu_topology": topology}}, vm_checks_engines=engines,
                  vm_checks_engine={"stdout": "\n".join(lines), "stdout_lines": lines})
    assert rows["want"]["NUMA node CPUs (numactl)"] == rows["want"]["NUMA node CPUs (lscpu)"] == "0:0; 1:1"
    assert rows["want"]["NUMA node MiB (numactl)"] == "0:1510; 1:1465"
    assert rows["want"]["NUMA distances (numactl)"] == "10 20; 20 10"
    assert rows["want"]["sockets, physical cores"] == "2, 2"
    if len(engines) == 1:
        # One engine: its Mems_allowed_list is shown, not checked.
        assert rows["got"]["engine Mems_allowed_list"] == "0-1" and "engine Mems_allowed_list" not in rows["want"]
    assert sorted(key for key in rows["want"] if rows["want"][key] != rows["got"][key]) == wrong


def test_vm_checks_want_the_memory_nodes_cpu_topology_chose():
    """An engine paired with another node's memory (its own has none, issue 39 input 5) is checked against that node."""
    topology = cpu_topology.gather(os.path.join(FIXTURES, "topology", "qemu-2node"))
    topology["recommended"]["per_node"][1]["memory_nodes"] = [0]
    lines = [E0 + " cpus_allowed=0", E0 + " mems_allowed=0", E0 + " mempolicy=bind:0",
             E1 + " cpus_allowed=1", E1 + " mems_allowed=0", E1 + " mempolicy=bind:0"]
    compare = task("tests/vm/checks.yml", "Compare the topology with lscpu's and numactl's")
    rows = render(compare["vars"]["__rows"], vm_checks_tools={"stdout_lines": read(JINJA, "vm-topology-tools").splitlines()},
                  vm_checks_topology={"ansible_facts": {"cpu_topology": topology}}, vm_checks_engines=[E0, E1],
                  vm_checks_engine={"stdout": "\n".join(lines), "stdout_lines": lines})
    assert (rows["want"]["engine@1 memory policy"], rows["want"]["engine@1 Mems_allowed_list"]) == ("bind:0", "0")
    assert [key for key in rows["want"] if key.startswith("engine") and rows["want"][key] != rows["got"][key]] == []


def test_vm_checks_engine_names_follow_the_nodes_the_vm_boots():
    play = load("tests/vm/checks.yml")[0]
    assert render(play["vars"]["vm_checks_engines"], vm_checks_nodes=2) == [E0, E1]
    assert render(play["vars"]["vm_checks_engines"], vm_checks_nodes=1) == ["llm-inference.service"]
    services = render(play["vars"]["vm_checks_services"], vm_checks_engines=[E0, E1])
    assert services == {"llmtune-cstates.service": "running", E0: "running", E1: "running",
                        "llm-inference-engine-access.service": "exited", "nginx.service": "running"}


def test_tuned_services_from_systemctl_show():
    # The same bookworm output read as the tuned role reads its units: what is installed, in service_facts' terms
    # (active -> running; the unit file state as status), and the units it would stop (running or enabled).
    show = read(JINJA, "systemctl-show-units")
    role_vars = load("roles/tuned/vars/main.yml")
    services = render(role_vars["tuned_services"], tuned_units_show={"stdout": show})
    assert services == {"llmtune-cstates.service": {"state": "running", "status": "enabled"},
                        "getty@tty1.service": {"state": "stopped", "status": "enabled"},
                        "systemd-tmpfiles-setup.service": {"state": "running", "status": "static"},
                        "tuned.service": {"state": "stopped", "status": "masked"}}
    active = render(role_vars["tuned_active_units"], tuned_services=services)
    assert active == ["getty@tty1.service", "llmtune-cstates.service", "systemd-tmpfiles-setup.service"]
    assert render(role_vars["tuned_services"], tuned_units_show={"stdout": ""}) == {}


def test_vm_checks_unit_states():
    # systemctl show of a bookworm node (systemd 252): a running unit, a unit systemd does not know, an enabled one
    # that is not running, a oneshot that ran (exited), and a masked one.
    show = read(JINJA, "systemctl-show-units")
    name = task("tests/vm/checks.yml", "Name each unit's state (absent when systemd has no such unit)")
    states = render(name["ansible.builtin.set_fact"]["vm_checks_unit_states"], vm_checks_units={"stdout": show})
    assert states == {"llmtune-cstates.service": "running", "llm-inference.service": "absent",
                      "getty@tty1.service": "stopped", "systemd-tmpfiles-setup.service": "exited",
                      "tuned.service": "stopped"}


@pytest.mark.parametrize("locked, weights, verdict", [
    # The QEMU VM of the clean-clone run of c14af2b: the tiny proxy's tensors are 19645952 bytes of a 28395360-byte
    # file (the rest is the header's vocabulary); llama.cpp locked them, page-rounded.
    (19188, 19185, "yes"),
    (0, 19185, "no: VmLck 0 kB, weights 19185 kB"),
    # The file size is not the weights' size: the check that compared with it failed a VM that locked them all.
    (19188, 27729, "no: VmLck 19188 kB, weights 27729 kB"),
])
def test_vm_checks_weights_locked(locked, weights, verdict):
    play = task("tests/vm/checks.yml", "Check the settings in force on the VM")
    variables = {name: trust_as_template(value) if isinstance(value, str) else value
                 for name, value in play["vars"].items()}
    lines = read(JINJA, "vm-grep-tuned").splitlines()
    split = task("tests/vm/checks.yml", "Split the output by file")["ansible.builtin.set_fact"]["vm_checks_text"]
    # Each engine's lines, then the host's: the rule's table and the requests nginx's access log shows per engine.
    engine = [f"{E0} locked_kb={locked}", f"{E0} model=/opt/llmtune/models/tiny-bf16.gguf",
              f"{E0} cpu_backend=libggml-cpu-haswell.so", f"{E0} port=8000",
              f"{E1} locked_kb={weights + 3}", f"{E1} cpu_backend=libggml-cpu-haswell.so", f"{E1} port=8001",
              "host access_rule=loaded", "host served_127.0.0.1:8000=3"]
    variables.update(vm_checks_text=render(split, vm_checks_grep={"stdout_lines": lines}), vm_checks_nodes=2,
                     vm_checks_unit_states={}, vm_checks_answer={}, vm_checks_engine={"stdout": "x", "stdout_lines": engine},
                     vm_checks_weights={"stdout_lines": [f"weights_kb={weights}"]})
    parse = task("tests/vm/checks.yml", "Parse the observed values")["ansible.builtin.set_fact"]["vm_checks_observed"]
    observed = render(parse, **variables)
    assert observed["engine@0 weights locked (VmLck)"] == verdict
    assert observed["engine@1 weights locked (VmLck)"] == "yes"
    assert observed["engine@0 llama.cpp CPU backend"] == "libggml-cpu-haswell.so"
    assert observed["engine@0 requests served through nginx"] == "3 (port 8000)"
    # An engine nginx never sent a request to.
    assert observed["engine@1 requests served through nginx"] == "0 (port 8001)"
    assert observed["engine access rule (nftables)"] == "loaded"


# --- roles/autotune: the variables' ranges (its decisions are tested in test_autotune.py) -----------------------

AUTOTUNE_DEFAULTS = load("roles/autotune/defaults/main.yml")


@pytest.mark.parametrize("overrides, failing", [
    ({"autotune_concurrency": 2}, []),
    ({"autotune_concurrency": 4, "autotune_parallel": [1, 2], "autotune_max_ttft_p95_ms": 500,
      "autotune_max_tpot_p95_ms": 80}, []),
    ({"autotune_concurrency": 0}, ["autotune_concurrency"]),
    ({"autotune_parallel": [0, 2]}, ["autotune_parallel"]),
    ({"autotune_max_ttft_p95_ms": -1}, ["autotune_max_ttft_p95_ms"]),
    ({"autotune_max_tpot_p95_ms": -5}, ["autotune_max_tpot_p95_ms"]),
    ({"autotune_threads": [2, 0]}, ["autotune_threads"]),
    ({"autotune_min_gain_percent": 60}, ["autotune_min_gain_percent"]),
    ({"autotune_min_gain_percent": -1}, ["autotune_min_gain_percent"]),
    ({"autotune_min_gain_percent": 0}, []),
    ({"autotune_output_tokens": 1, "autotune_state_path": "var/lib/x.json"},
     ["autotune_output_tokens", "autotune_state_path"]),
])
def test_autotune_refuses_bad_variables(overrides, failing):
    tsk = task("roles/autotune/tasks/variables.yml", "Check the auto-tune's ranges")
    variables = dict(AUTOTUNE_DEFAULTS, **overrides)
    rules = [{key: render(value, **variables) if isinstance(value, str) else value for key, value in rule.items()}
             for rule in tsk["loop"]]
    assert [rule["name"] for rule in rules if not rule["ok"]] == failing


@pytest.mark.parametrize("names, removed", [
    ([], ["/var/cache/llmtune"]),  # absent or empty: the folder
    (["gguf-table-" + "a" * 32 + ".json"], ["/var/cache/llmtune"]),  # only our tables: the folder
    (["gguf-table-" + "a" * 32 + ".json", "notes.txt"], ["/var/cache/llmtune/gguf-table-" + "a" * 32 + ".json"]),
])
def test_rollback_removes_only_the_cached_tables(names, removed):
    tsk = task("roles/rollback/tasks/service.yml", "Remove the tensor tables the rooflines cached")
    found = {"files": [{"path": "/var/cache/llmtune/" + name} for name in names]}
    variables = task_vars(tsk, rollback_cache_dir="/var/cache/llmtune", rollback_cache_content=found)
    assert render(tsk["loop"], **variables) == removed


GGUF_BF16 = "/opt/llmtune/models/qwen3-0.6b-proxy-bf16.gguf"


@pytest.mark.parametrize("engine, gguf_type, model_path, deployed", [
    ("llama_cpp", "bf16", GGUF_BF16, True),
    ("llama_cpp", "q8_0", GGUF_BF16, False),  # another GGUF file: the main tasks convert and copy it
    ("transformers", "bf16", GGUF_BF16, False),  # another engine
    # A deploy that failed after the model copy: the role's model path moved on, the running service did not.
    ("llama_cpp", "bf16", "/opt/llmtune/models/qwen3-0.6b-proxy-q8_0.gguf", False),
])
def test_autotune_changes_the_unit_alone_only_of_the_deployed_engine_and_file(engine, gguf_type, model_path, deployed):
    tsk = task("roles/inference_service/tasks/unit.yml", "Check that the engine and model of this setting are deployed")
    running = {"engine": "llama_cpp", "gguf_type": "bf16", "model_path": GGUF_BF16}
    variables = task_vars(tsk, inference_service_running=running, inference_service_engine=engine,
                          inference_service_gguf_type=gguf_type, __inference_service_model_path=model_path)
    assert all(condition(that, **variables) for that in tsk["ansible.builtin.assert"]["that"]) is deployed



# --- roles/benchmark: the memory bandwidth probe ------------------------------------------------------------------

@pytest.mark.parametrize("result, attempts, done", [
    ({"probe": {"stable": True}, "attempts": 1}, 3, True),
    # The demo of 19d53fb: a test run beside the probe spread its passes by 19.9 %; probed again after a pause.
    ({"probe": {"stable": False, "spread_percent": 19.91}, "attempts": 1}, 3, False),
    ({"probe": {"stable": False}, "attempts": 2}, 3, False),
    # The last attempt's figure is used (once, not stored) instead of failing the host.
    ({"probe": {"stable": False}, "attempts": 3}, 3, True),
    ({"probe": {"stable": False}, "attempts": 1}, 1, True),
    # A module that failed has no probe: no retry hides the failure.
    ({"failed": True, "msg": "torch is missing", "attempts": 1}, 3, True),
])
def test_bandwidth_probe_is_repeated_until_it_settles(result, attempts, done):
    tsk = task("roles/benchmark/tasks/bandwidth.yml", "Probe the memory bandwidth while the host is idle")
    assert condition(tsk["until"], __benchmark_bandwidth_probe=result, benchmark_bandwidth_attempts=attempts) is done
    assert render(tsk["retries"], benchmark_bandwidth_attempts=attempts) == attempts - 1


# --- roles/benchmark: the paired comparison with the direct-run twin ---------------------------------------------

TWIN = "roles/benchmark/tasks/twin.yml"
# The figures report.txt.j2 prints of a validation (the demo's, fresh machine).
VALIDATION = {"noisy": False, "host_load": {"other_cpus_before": 0.05, "loadavg_before": [1.2], "loadavg_after": [1.38]},
              "summary": {"ttft_ms_p50": 179.808, "ttft_ms_p95": 217.655, "tpot_ms_p50": 52.308,
                          "decode_tokens_per_s": 19.124, "e2e_ms_p50": 1787.275, "errors": 0}}


@pytest.mark.parametrize("decode, e2e, verdict, said, named", [
    # The demo's validation (fresh machine): the service 2.5 % faster in decode, 0.6 % end to end.
    (-2.5, -0.6, "within", "within 5 %", False),
    (5.1, 0.0, "over", "OUTSIDE 5 %: slower in every round, the unit costs speed", True),
    (0.0, 5.1, "unresolved", "not resolved (the rounds disagree), beyond 5 %", True),
])
def test_twin_row_takes_the_medians_of_the_paired_rounds(decode, e2e, verdict, said, named):
    gap = {"rounds": 4, "decode_tokens_per_s": {"median": decode, "min": -6.8, "max": 6.0},
           "ttft_ms": {"median": 1.0, "min": -2.0, "max": 3.0}, "e2e_ms": {"median": e2e, "min": -6.5, "max": 6.0},
           "verdict": verdict}
    result = dict(VALIDATION, twin={"url": "http://127.0.0.1:8100", "gap_percent": gap,
                                    "summary": {"decode_tokens_per_s": 18.668, "ttft_ms_p50": 163.985,
                                                "e2e_ms_p50": 1830.205}})
    process = {"item": "llm-inference.service", "url": "http://127.0.0.1:8100",
               "argv": ["llama-server", "--port", "8100"], "user": "llm", "cpus": [0, 1], "pid": 4242}
    tsk = task(TWIN, "Keep the paired comparison")
    resolved = task_vars(tsk, __benchmark_result=result, __benchmark_twin_started=[process],
                         benchmark_direct_max_gap_percent=5)
    assert condition(tsk["when"], **resolved)
    row = render_tree(tsk["ansible.builtin.set_fact"]["__benchmark_twin_row"], **resolved)
    assert row["twins"] == [{"unit": "llm-inference.service", "url": "http://127.0.0.1:8100",
                             "argv": ["llama-server", "--port", "8100"], "user": "llm", "cpus": [0, 1]}]
    assert row["gap_percent"] == {"decode_tokens_per_s": decode, "ttft_ms": 1.0, "e2e_ms": e2e}
    assert row["verdict"] == verdict and row["rounds"] == gap
    text = render_template_file("roles/benchmark/templates/report.txt.j2", __benchmark_result=result,
                                __benchmark_twin_row=row, benchmark_direct_max_gap_percent=5)
    line = next(line for line in text.splitlines() if line.startswith("direct run"))
    assert (f"service slower by {decode} % (decode, -6.8 to 6.0), {e2e} % (end to end, -6.5 to 6.0), medians of "
            f"4 paired rounds: {said}") in line
    # A gap beyond the limit is named on its own, in the report's words.
    name = task(TWIN, "Name the gap between the service and its twin")
    assert condition(name["when"], __benchmark_twin_row=row) is named
    assert render(name["ansible.builtin.debug"]["msg"], __benchmark_twin_row=row, benchmark_direct_max_gap_percent=5,
                  ansible_search_path=[os.path.join(ROOT, "roles/benchmark")]) == line


def test_twin_skipped_for_memory_is_said_in_the_report():
    process = {"skipped": True, "changed": False,
               "msg": "not enough memory for the twin beside the service: VmRSS 7901 MiB + margin 512 MiB > "
                      "MemAvailable 6120 MiB"}
    result = VALIDATION
    tsk = task(TWIN, "Say why there is no twin")
    assert condition(tsk["when"], __benchmark_result=result)
    row = render_tree(tsk["ansible.builtin.set_fact"]["__benchmark_twin_row"], benchmark_direct_twin=True,
                      __benchmark_twins={"results": [process]})
    assert not condition(task(TWIN, "Name the gap between the service and its twin")["when"], __benchmark_twin_row=row)
    text = render_template_file("roles/benchmark/templates/report.txt.j2", __benchmark_result=result,
                                __benchmark_twin_row=row, benchmark_direct_max_gap_percent=5)
    assert "direct run: none (not enough memory for the twin beside the service: VmRSS 7901 MiB" in text
    # One engine per NUMA node: the first engine's twin started, the second's found no room; none is compared.
    started = {"item": "llm-inference@0.service", "url": "http://127.0.0.1:8100", "pid": 7, "changed": False}
    row = render_tree(tsk["ansible.builtin.set_fact"]["__benchmark_twin_row"], benchmark_direct_twin=True,
                      __benchmark_twins={"results": [started, process]})
    assert row == {"skipped": process["msg"]}
    # Twins turned off: every start was skipped by its condition.
    row = render_tree(tsk["ansible.builtin.set_fact"]["__benchmark_twin_row"], benchmark_direct_twin=False,
                      __benchmark_twins={"results": [{"skipped": True, "skip_reason": "Conditional result was False"}]})
    assert row == {"skipped": "benchmark_direct_twin is false"}


def test_the_benchmark_pairs_every_engine_with_its_twin():
    """One engine per NUMA node: a twin per engine, and the benchmark gets them in the engines' order, or none when
    one is missing."""
    measure = "roles/benchmark/tasks/measure.yml"
    start = task(measure, "Start the same engines directly, outside systemd, beside the service")
    units = ["llm-inference@0.service", "llm-inference@1.service"]
    assert [render(start["engine_direct"]["port"], benchmark_direct_port=8100, __index=i) for i in range(2)] == [8100, 8101]
    keep = task(measure, "Keep the twins that started")
    twins = [{"item": unit, "url": f"http://127.0.0.1:810{i}", "pid": 70 + i} for i, unit in enumerate(units)]
    started = render(keep["ansible.builtin.set_fact"]["__benchmark_twin_started"],
                     __benchmark_twins={"results": twins + [{"skipped": True, "msg": "no room"}]})
    assert started == twins
    bench = task(measure, "Measure the service ({{ benchmark_mode }})")
    options = bench["inference_benchmark"]
    for found, wanted in ((twins, twins), (twins[:1], [])):
        values = dict(task_vars(bench, __benchmark_twin_started=found, __benchmark_units=units), omit="OMIT")
        assert render(options["twin_url"], **values) == (wanted[0]["url"] if wanted else "OMIT")
        assert render(options["more_twin_urls"], **values) == [t["url"] for t in wanted[1:]]
        assert render(options["more_twin_engine_pids"], **values) == [t["pid"] for t in wanted[1:]]


# --- roles/inference_service: the engines of each layout, from real machines' topologies ------------------------------

def service_vars(fixture, permitted=None, **overrides):
    """The role's defaults and vars, with the cpu_topology facts of FIXTURE (as the topology role sets them, memory
    binding PERMITTED or not) and the engine adapter's return as tasks/variables.yml registers it."""
    variables = {name: trust_as_template(value) if isinstance(value, str) else value
                 for relpath in ("roles/inference_service/defaults/main.yml", "roles/inference_service/vars/main.yml")
                 for name, value in load(relpath).items()}
    facts = cpu_topology.gather(os.path.join(FIXTURES, "topology", fixture))
    facts["numa_policy_permitted"] = permitted
    variables.update(cpu_topology=facts, ansible_facts={"cpu_topology": facts}, **overrides)
    inputs = {key: render("{{ inference_service_%s }}" % ("engine_" + key if key == "firewall_ports" else key),
                          **variables) for key in service_layout.INPUTS}
    engine = engines.adapter(render("{{ inference_service_engine }}", **variables))
    variables["__inference_service_adapter"] = {"engine": engine.facts("Debian"),
                                                "layout": service_layout.layout(inputs, facts)}
    return variables


def test_the_benchmark_measures_every_engine_the_deploy_published():
    variables = service_vars("qemu-2node", permitted=True, inference_service_layout="per_node")
    publish = task("roles/inference_service/tasks/service.yml", "Publish the endpoints for the benchmark and clients")
    facts = publish["ansible.builtin.set_fact"]
    endpoints = render(facts["inference_service_endpoints"], **variables)
    assert endpoints == ["http://127.0.0.1:8000", "http://127.0.0.1:8001"]
    # nginx is the clients' one endpoint, on the listen address and the proxy port.
    assert render(facts["inference_service_public_endpoint"], **variables) == "http://127.0.0.1:8080"
    instances = variables["__inference_service_adapter"]["layout"]["instances"]
    bench = {name: trust_as_template(value) if isinstance(value, str) else value
             for name, value in load("roles/benchmark/defaults/main.yml").items()}
    bench.update(inference_service_endpoints=endpoints, inference_service_running={"instances": instances},
                 inference_service_endpoint=endpoints[0])
    assert render("{{ benchmark_url }}", **bench) == "http://127.0.0.1:8000"
    assert render("{{ benchmark_more_urls }}", **bench) == ["http://127.0.0.1:8001"]
    assert render("{{ benchmark_service_unit }}", **bench) == "llm-inference@0.service"
    assert render("{{ benchmark_more_units }}", **bench) == ["llm-inference@1.service"]
    # One engine: no others, the unit of the single layout.
    single = dict(bench, inference_service_endpoints=endpoints[:1],
                  inference_service_running={"instances": [dict(instances[0], unit="llm-inference.service")]})
    assert render("{{ benchmark_more_urls }}", **single) == [] and render("{{ benchmark_more_units }}", **single) == []
    assert render("{{ benchmark_service_unit }}", **single) == "llm-inference.service"


def test_the_report_gives_each_engines_share():
    # tests/vm/run.sh greps the second engine's line of the VM's validation.
    engines = [{"url": "http://127.0.0.1:8000", "requests": 1, "errors": 0, "output_tokens": 8, "ttft_ms_p50": 812.4,
                "decode_tokens_per_s_p50": 3.1},
               {"url": "http://127.0.0.1:8001", "requests": 1, "errors": 0, "output_tokens": 8, "ttft_ms_p50": 790.0,
                "decode_tokens_per_s_p50": 3.3}]
    result = dict(VALIDATION, levels=[{"concurrency": 1, "engines": engines}])
    text = render_template_file("roles/benchmark/templates/report.txt.j2", __benchmark_result=result,
                                __benchmark_twin_row={"skipped": "no room"},
                                benchmark_direct_max_gap_percent=5)
    assert ("concurrency 1, engine 1 (http://127.0.0.1:8001): 1 requests, 0 errors, 8 output tokens, TTFT p50 790.0 ms, "
            "decode p50 3.3 tokens/s") in text.splitlines()
    # Beside their twins, each engine's line gives its own twin's figures.
    twins = [dict(e, url=e["url"].replace(":80", ":81"), ttft_ms_p50=800.0 + i) for i, e in enumerate(engines)]
    result = dict(result, twin={"levels": [{"concurrency": 1, "engines": twins}]})
    text = render_template_file("roles/benchmark/templates/report.txt.j2", __benchmark_result=result,
                                __benchmark_twin_row={"skipped": "no room"}, benchmark_direct_max_gap_percent=5)
    assert ("concurrency 1, engine 1 (http://127.0.0.1:8001): 1 requests, 0 errors, 8 output tokens, TTFT p50 790.0 ms, "
            "decode p50 3.3 tokens/s; its twin (http://127.0.0.1:8101): TTFT p50 801.0 ms, decode p50 3.3 tokens/s"
            ) in text.splitlines()


WANTED = {"cpus": "0 1", "threads": 2, "size_mb": 1024}
UNSETTLED = {"bandwidth_gb_s": 31.0, "probe": {"stable": False}, "wanted": WANTED}
STORED_PROBE = {"bandwidth_gb_s": 32.4, "probe": {"stable": True}, "wanted": WANTED}


@pytest.mark.parametrize("stored, in_play, remeasure, known", [
    (None, None, False, {}),                       # nothing yet: probe
    (STORED_PROBE, None, False, STORED_PROBE),     # stored for these CPUs and threads
    (dict(STORED_PROBE, wanted=dict(WANTED, threads=1)), None, False, {}),  # stored for other threads: probe
    (STORED_PROBE, None, True, {}),                # benchmark_remeasure_bandwidth: probe ...
    (STORED_PROBE, STORED_PROBE, True, STORED_PROBE),  # ... once a run
    # A busy host: the probe did not settle and was not stored; the auto-tune's next row uses it, not a new probe.
    (None, UNSETTLED, False, UNSETTLED),
    (STORED_PROBE, dict(UNSETTLED, wanted=dict(WANTED, cpus="0")), False, STORED_PROBE),
])
def test_bandwidth_is_probed_at_most_once_a_run(stored, in_play, remeasure, known):
    tsk = task("roles/benchmark/tasks/bandwidth.yml", "Decide whether to probe")
    found = {"content": base64.b64encode(json.dumps(stored).encode()).decode()} if stored else {}
    variables = dict(__benchmark_bandwidth_file=found, benchmark_remeasure_bandwidth=remeasure,
                     benchmark_roofline_cpus="0 1", benchmark_roofline_threads=2, benchmark_bandwidth_min_size_mb=1024,
                     cpu_topology={"caches": {"l3": [{"size_kib": 32768}]}})
    if in_play:
        variables["benchmark_host_bandwidth"] = in_play
    variables = task_vars(tsk, **variables)
    # A dict var: Ansible renders each of its values.
    variables["__wanted"] = render_tree(tsk["vars"]["__wanted"], **variables)
    assert render(tsk["ansible.builtin.set_fact"]["__benchmark_bandwidth_known"], **variables) == known


def test_the_rollback_purges_the_deploys_packages_that_nothing_depends_on():
    """apt-get -s autoremove --purge (apt 2.6, Depends only) after the deploy's packages (recorded with the
    dependencies apt added: g++, binutils, libnuma1) were marked as installed automatically: binutils, which
    python3.11 only suggests, goes with them; a package the deploy did not install stays."""
    tsk = task("roles/rollback/tasks/deploy.yml", "Purge those the deploy installed")
    after = ("Reading package lists...\nThe following packages will be REMOVED:\n  binutils* g++* libnuma1*\n"
             "Purg g++ [4:12.2.0-3]\nPurg binutils [2.40-2]\nPurg libnuma1 [2.0.16-1]\n"
             "Purg linux-image-6.1.0-25-amd64 [6.1.106-3]\n")
    variables = dict(tsk["vars"], rollback_autoremove={"stdout": after},
                     rollback_dpkg={"stdout_lines": ["ii  g++", "ii  binutils", "ii  libnuma1", "un  python3-dev"]})
    variables["__installed"] = render(task("roles/rollback/tasks/deploy.yml", "Remove the packages the deploy installed")
                                      ["vars"]["__installed"], **variables)
    assert sorted(render(tsk["vars"]["__removable"], **variables)) == ["binutils", "g++", "libnuma1"]
    argv = render("{{ __rollback_autoremove_argv }}", **load("roles/rollback/vars/main.yml"))
    assert "APT::AutoRemove::SuggestsImportant=false" in argv and "APT::AutoRemove::RecommendsImportant=false" in argv
