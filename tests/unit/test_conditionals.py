"""Every condition Ansible evaluates is a string: an unquoted assertion or `when` holding ": " (a regex, a message) is
a YAML mapping, valid to yamllint and ansible-lint, and fails only when the task runs ("Conditional expressions must be
strings"). Found in molecule llama_cpp's verify.yml, 25 minutes into the test command: `... is search('Served: ...')`.
"""

import glob
import os

import pytest
import yaml
from conftest import ROOT
from test_handler_conditions import TASK_FILES, load, tasks_of

FILES = sorted(set(TASK_FILES + glob.glob(os.path.join(ROOT, "molecule", "*", "tasks", "*.yml"))
                   + glob.glob(os.path.join(ROOT, "tests", "vm", "*.yml"))))
ASSERT = ("ansible.builtin.assert", "assert")
CONDITIONS = ("when", "failed_when", "changed_when", "until")


def conditions(tasks):
    """(task name, keyword, value) of each condition in TASKS: when and its kin, and each assertion."""
    for task in tasks_of(tasks):
        name = task.get("name", "?")
        for key in CONDITIONS:
            values = task.get(key)
            for value in values if isinstance(values, list) else [values]:
                if value is not None:
                    yield name, key, value
        for key in ASSERT:
            that = (task.get(key) or {}).get("that") if isinstance(task.get(key), dict) else None
            for value in that if isinstance(that, list) else [that]:
                if value is not None:
                    yield name, "that", value


def bad_conditions(tasks):
    """(task name, keyword, value) of each condition in TASKS that is not a string or a bool."""
    return [(name, key, value) for name, key, value in conditions(tasks) if not isinstance(value, (str, bool))]


@pytest.mark.parametrize("path", FILES, ids=[os.path.relpath(path, ROOT) for path in FILES])
def test_every_condition_is_a_string(path):
    assert bad_conditions(load(path)) == []


def test_the_fault_is_real():
    tasks = yaml.safe_load("""
- name: Check the report
  ansible.builtin.assert:
    that:
      - report is search('Served: nginx admits 4')
      - "report is search('Served: nginx admits 4')"
  when: ok
""")
    assert bad_conditions(tasks) == [("Check the report", "that", {"report is search('Served": "nginx admits 4')"})]
