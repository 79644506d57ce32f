"""The strategy ansible.cfg names (strategy_plugins/mitogen_linear.py) and its settings: a command a task starts may
run on every CPU the controller gives Ansible, as under the linear strategy (a compile, a benchmark), and a host slow
to start Python is still reached."""

import os
import shutil
import subprocess

import pytest

from conftest import ROOT

IMAGE = os.environ.get("LLMTUNE_IMAGE", "localhost/llmtune-node:bookworm")

PLAYBOOK = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Describe the task's process and its parent
      ansible.builtin.shell: grep Cpus_allowed_list /proc/self/status; ps -o args= -p "$PPID"
      register: described
      changed_when: false
    - name: Hand it over
      ansible.builtin.copy: {content: "{{ described.stdout }}\\n", dest: "%(out)s", mode: "0644"}
"""


def cpu_list(cpus):
    """The kernel's Cpus_allowed_list form of a set of CPUs: 0-2,5,7-8."""
    ranges = []
    for cpu in sorted(cpus):
        if ranges and ranges[-1][1] == cpu - 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ",".join(f"{first}-{last}" if last != first else f"{first}" for first, last in ranges)


def test_cpu_list_form():
    assert cpu_list({0, 1, 2, 5, 7, 8}) == "0-2,5,7-8"
    assert cpu_list({3}) == "3"


def test_a_task_command_runs_on_every_cpu_of_the_controller(tmp_path):
    out = tmp_path / "described.txt"
    (tmp_path / "playbook.yml").write_text(PLAYBOOK % {"out": out})
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"))
    run = subprocess.run(["ansible-playbook", str(tmp_path / "playbook.yml")], cwd=ROOT, env=env,
                         capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    allowed, parent = out.read_text().splitlines()
    # The module ran in Mitogen's interpreter, not one Python per task.
    assert "(mitogen:" in parent
    assert allowed.split(":")[1].strip() == cpu_list(os.sched_getaffinity(0))


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("podman") is None
                    or subprocess.run(["podman", "image", "exists", IMAGE], check=False).returncode != 0,
                    reason=f"needs root, podman and the node image {IMAGE} (scripts/build-node-image.sh)")
def test_a_node_whose_python_starts_slowly_is_reached(tmp_path):
    """Mitogen bounds a connection's start by ansible.cfg's timeout: a node whose Python takes longer than Ansible's
    default 10 s to start (a busy host) still runs the task."""
    name = f"llmtune-strategy-test-{os.getpid()}"
    subprocess.run(["podman", "run", "--detach", "--systemd", "always", "--name", name, IMAGE, "/lib/systemd/systemd"],
                   check=True, capture_output=True)
    try:
        subprocess.run(["podman", "exec", name, "sh", "-c", "printf '#!/bin/sh\\nsleep 11\\nexec python3 \"$@\"\\n' "
                        ">/usr/local/bin/slow-python && chmod +x /usr/local/bin/slow-python"], check=True)
        (tmp_path / "playbook.yml").write_text(
            "- hosts: all\n  gather_facts: false\n  tasks:\n    - name: Reach the node\n      ansible.builtin.ping:\n")
        env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"))
        run = subprocess.run(["ansible-playbook", "-i", f"{name},", "-c", "podman", "-e",
                              "ansible_python_interpreter=/usr/local/bin/slow-python", str(tmp_path / "playbook.yml")],
                             cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    finally:
        subprocess.run(["podman", "rm", "--force", "--time", "0", name], check=False, capture_output=True)
    assert run.returncode == 0 and "ok=1" in run.stdout, run.stdout[-3000:] + run.stderr[-3000:]
