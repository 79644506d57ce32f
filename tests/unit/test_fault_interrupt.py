"""tests/faults/interrupt.py kills ansible-playbook at the K-th task header of a play, K drawn from 1 to N. The molecule
scenarios take N from a JSON-callback report of an earlier run, which records handlers as tasks: CI drew K = N = 133
in llama_cpp's deploy of new settings, the run printed fewer headers (its handlers ran as RUNNING HANDLER) and ended
unkilled. Every N the scenarios pass must be reachable: here a real run on localhost, with a skipped task, an
included file and a notified handler."""

import json
import os
import random
import subprocess
import sys

import pytest
from conftest import ROOT, VENV_BIN

sys.path.insert(0, os.path.join(ROOT, "tests", "faults"))
import interrupt  # noqa: E402

PLAYBOOK = """\
- name: Play before
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Not counted
      ansible.builtin.debug:
        msg: other play

- name: Interrupted
  hosts: localhost
  gather_facts: false
  tasks:
    - name: First
      ansible.builtin.debug:
        msg: one
    - name: Skipped
      ansible.builtin.debug:
        msg: never
      when: false
    - name: Included
      ansible.builtin.include_tasks: included.yml
    - name: Notify
      ansible.builtin.command: "true"
      changed_when: true
      notify: Handler that sleeps
  handlers:
    - name: Handler that sleeps
      # 30 s in the interrupted run: the kill must land inside it.
      ansible.builtin.command: sleep {{ handler_seconds | default(0) }}
      changed_when: true
"""

INCLUDED = """\
- name: From the included file
  ansible.builtin.debug:
    msg: included
"""


@pytest.fixture(scope="module")
def playbook(tmp_path_factory):
    folder = tmp_path_factory.mktemp("interrupt")
    (folder / "play.yml").write_text(PLAYBOOK)
    (folder / "included.yml").write_text(INCLUDED)
    return [os.path.join(VENV_BIN, "ansible-playbook"), "-i", "localhost,", "-c", "local",
            "-e", "ansible_python_interpreter=" + sys.executable, str(folder / "play.yml")]


def run(command, **env):
    return subprocess.run(command, capture_output=True, text=True, timeout=300, check=True, cwd=ROOT,
                          env=dict(os.environ, ANSIBLE_NOCOLOR="1", **env)).stdout


def json_tasks(command):
    """Tasks the JSON callback records under the play, as llama_cpp's verify.yml counts them."""
    report = json.loads(run(command, ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
                            ANSIBLE_CALLBACKS_ENABLED="ansible.posix.json"))
    return [task["task"]["name"] for play in report["plays"] if play["play"]["name"] == "Interrupted"
            for task in play["tasks"]]


def test_the_headers_counted_are_the_tasks_the_json_report_records(playbook):
    # Hidden skipped tasks print no header: interrupt.py's own environment shows them, whatever the user's config.
    shown = run(playbook, ANSIBLE_STDOUT_CALLBACK="default", ANSIBLE_DISPLAY_SKIPPED_HOSTS="0")
    assert "Skipped" not in shown
    recorded = json_tasks(playbook)
    assert recorded == ["First", "Skipped", "Included", "From the included file", "Notify", "Handler that sleeps"]
    printed = run(playbook, ANSIBLE_STDOUT_CALLBACK="default", ANSIBLE_DISPLAY_SKIPPED_HOSTS="1")
    assert list(interrupt.play_tasks(printed.splitlines(), "Interrupted")) == recorded


def test_the_last_task_of_the_report_is_killed(playbook):
    total = len(json_tasks(playbook))
    seed = next(s for s in range(10000) if random.Random(s).randint(1, total) == total)
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "faults", "interrupt.py"), "--play",
                           "Interrupted", "--tasks", str(total), "--seed", str(seed), "--"] + playbook
                          + ["-e", "handler_seconds=30"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env=dict(os.environ, ANSIBLE_DISPLAY_SKIPPED_HOSTS="0"))
    result = json.loads(proc.stdout.splitlines()[-1])
    assert (proc.returncode, result["task"], result["seen"], result["rc"]) == (0, "Handler that sleeps", total, -9)
    # Killed inside the handler's 30 s sleep, not after it.
    assert result["killed_after_s"] < 25
    # Nothing of the run outlives it: Mitogen's mux, a fork of ansible-playbook in a session of its own, stayed
    # behind after the group's SIGKILL, one more idle process per test run.
    assert [pid for pid in os.listdir("/proc") if pid.isdigit() and playbook[-1] in cmdline(pid)] == []


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().decode(errors="replace")
    except OSError:
        return ""
