"""The podman_pipelined connection (molecule fleet's, and any node's without Mitogen) on a real systemd container of the
node image: runc exec and the container's root folder where it can, the process podman exec would start, and a
container made again under the same name found again."""

import os
import shutil
import subprocess

import pytest
from conftest import ROOT

IMAGE = os.environ.get("LLMTUNE_IMAGE", "localhost/llmtune-node:bookworm")
# What a task's process is: its cgroups, capabilities, seccomp mode and environment.
PROBE = ("cat /proc/self/cgroup; grep -E '^(CapEff|Seccomp):' /proc/self/status; "
         "echo container=$container; echo PATH=$PATH")

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("podman") is None
    or subprocess.run(["podman", "image", "exists", IMAGE], check=False).returncode != 0,
    reason=f"needs root, podman and the node image {IMAGE} (scripts/build-node-image.sh)")

PLAYBOOK = """
- hosts: node
  gather_facts: false
  tasks:
    - name: Write a file
      ansible.builtin.copy: {content: "one line\\n", dest: /root/written.txt, mode: "0640"}
    - name: Describe the task's process
      ansible.builtin.shell: "(%(probe)s; stat -c '%%U %%a' /root/written.txt) > /root/probe.txt"
      changed_when: false
    - name: Fetch both
      ansible.builtin.fetch: {src: "/root/{{ item }}.txt", dest: "%(fetched)s/", flat: true}
      loop: [written, probe]
"""


@pytest.fixture(name="node")
def fixture_node():
    name = f"llmtune-connection-test-{os.getpid()}"

    def start():
        subprocess.run(["podman", "rm", "--force", "--time", "0", name], check=False, capture_output=True)
        subprocess.run(["podman", "run", "--detach", "--systemd", "always", "--name", name, IMAGE,
                        "/lib/systemd/systemd"], check=True, capture_output=True)

    start()
    yield name, start
    subprocess.run(["podman", "rm", "--force", "--time", "0", name], check=False, capture_output=True)


def play(tmp_path, name):
    """Run the playbook against the container: (its -vvv output, the probe's lines, the written file as fetched)."""
    (tmp_path / "inventory").write_text(
        f"node ansible_host={name} ansible_connection=podman_pipelined ansible_python_interpreter=/usr/bin/python3\n")
    fetched = tmp_path / "fetched"
    shutil.rmtree(fetched, ignore_errors=True)
    (tmp_path / "playbook.yml").write_text(PLAYBOOK % {"fetched": fetched, "probe": PROBE})
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"))
    run = subprocess.run(["ansible-playbook", "-vvv", "-i", str(tmp_path / "inventory"),
                          str(tmp_path / "playbook.yml")], cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run.stdout, (fetched / "probe.txt").read_text().splitlines(), (fetched / "written.txt").read_text()


def commands(output):
    """The programs the connection ran, from -vvv output: (podman's, runc's)."""
    run = [line for line in output.splitlines() if " RUN [" in line]
    podman = [line for line in run if "/podman'" in line]
    return podman, [line for line in run if "/runc'" in line or "runc'," in line]


def podman_exec(name):
    return subprocess.run(["podman", "exec", name, "sh", "-c", PROBE], check=True, capture_output=True,
                          text=True).stdout.splitlines()


def test_tasks_run_through_runc_as_podman_exec_would_run_them(tmp_path, node):
    name, dummy = node
    output, lines, fetched = play(tmp_path, name)
    podman, runc = commands(output)
    assert runc and all("'exec'" in line for line in runc), runc
    # One podman call for the whole run: its container's ID, kept for the tasks after.
    assert len(podman) == 1 and "'inspect'" in podman[0], podman
    assert fetched == "one line\n"
    assert lines == podman_exec(name) + ["root 640"]


def test_a_container_made_again_under_its_name_is_found_again(tmp_path, node):
    name, start = node
    play(tmp_path, name)
    first = subprocess.run(["podman", "inspect", "--format", "{{.Id}}", name], check=True, capture_output=True,
                           text=True).stdout.strip()
    start()
    output, lines, fetched = play(tmp_path, name)
    second = subprocess.run(["podman", "inspect", "--format", "{{.Id}}", name], check=True, capture_output=True,
                            text=True).stdout.strip()
    assert first != second
    podman, runc = commands(output)
    assert len(podman) == 1 and "'inspect'" in podman[0], podman
    assert runc and all(second in line for line in runc), runc
    assert first not in output
    assert lines == podman_exec(name) + ["root 640"]
    assert fetched == "one line\n"
