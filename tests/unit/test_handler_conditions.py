"""A role's handlers keep the conditions of the first block that included it (ansible-core 2.19): a role with
handlers taken in by include_role inside a block with `when` (directly, or through include_tasks) skips its handlers
for the rest of the play once that condition is false, when an import_role of it notifies them. Found in the demo: the auto-tune's rows deployed the service
inside a block `when: a row is planned`; after the last row the serve stage rewrote the unit, its "Restart the
inference service" was skipped, and the validation measured the engine of the sweep's last row (1 thread on CPU 0)
while its direct-run twin ran the unit's 2 threads: 18 % slower in every round. Conditions go on the include itself.
"""

import glob
import os
import subprocess

import pytest
import yaml
from conftest import ROOT, VENV_BIN

ROLES_WITH_HANDLERS = sorted(os.path.basename(os.path.dirname(os.path.dirname(path)))
                             for path in glob.glob(os.path.join(ROOT, "roles", "*", "handlers", "main.yml")))
TASK_FILES = sorted(
    [os.path.join(ROOT, "site.yml")]
    + glob.glob(os.path.join(ROOT, "playbooks", "*.yml")) + glob.glob(os.path.join(ROOT, "playbooks", "tasks", "*.yml"))
    + glob.glob(os.path.join(ROOT, "roles", "*", "tasks", "*.yml"))
    + glob.glob(os.path.join(ROOT, "molecule", "*", "*.yml")))

INCLUDE_ROLE = ("ansible.builtin.include_role", "include_role")
INCLUDE_TASKS = ("ansible.builtin.include_tasks", "include_tasks", "ansible.builtin.import_tasks", "import_tasks")


def load(path):
    with open(path, encoding="utf-8") as handle:
        return yaml.safe_load(handle) or []


def tasks_of(node):
    """The task lists of a play list, a play, a task list or a block."""
    if isinstance(node, list):
        for item in node:
            yield from tasks_of(item)
    elif isinstance(node, dict):
        if any(key in node for key in ("block", "tasks", "pre_tasks", "post_tasks", "rescue", "always")):
            yield node
            for key in ("block", "tasks", "pre_tasks", "post_tasks", "rescue", "always"):
                yield from tasks_of(node.get(key, []))
        else:
            yield node


def roles_included(node, folder, seen):
    """Names of the roles NODE include_role's, in itself, its blocks and the task files it includes by a literal
    path (FOLDER: where those paths start)."""
    out = []
    for task in tasks_of(node):
        for key in INCLUDE_ROLE:
            if key in task:
                out.append(task[key]["name"])
        for key in INCLUDE_TASKS:
            target = task.get(key)
            target = target.get("file") if isinstance(target, dict) else target
            if isinstance(target, str) and "{{" not in target:
                path = os.path.normpath(os.path.join(folder, target))
                if os.path.exists(path) and path not in seen:
                    out += roles_included(load(path), os.path.dirname(path), seen | {path})
    return out


def conditional_blocks(path):
    """(block name, its when) of every block with a condition in the file at PATH."""
    for node in tasks_of(load(path)):
        if "block" in node and node.get("when"):
            yield node


@pytest.mark.parametrize("path", TASK_FILES, ids=[os.path.relpath(path, ROOT) for path in TASK_FILES])
def test_no_role_with_handlers_is_included_under_a_conditional_block(path):
    found = []
    for block in conditional_blocks(path):
        roles = roles_included(block["block"], os.path.dirname(path), frozenset({path}))
        found += [f"{block.get('name', '(unnamed block)')} (when: {block['when']}) includes {role}"
                  for role in roles if role in ROLES_WITH_HANDLERS]
    assert found == []


def test_the_fault_is_real(tmp_path):
    """The behaviour this guards against, on ansible-core as installed: the handler of a role first included under a
    block whose condition later turns false is skipped when the role, imported later (as the serve stage imports
    inference_service), notifies it again."""
    role = tmp_path / "roles" / "r"
    (role / "tasks").mkdir(parents=True)
    (role / "handlers").mkdir()
    (role / "tasks" / "main.yml").write_text(
        "- {name: change, ansible.builtin.command: 'true', changed_when: true, notify: h}\n"
        "- {name: flush, ansible.builtin.meta: flush_handlers}\n")
    (role / "handlers" / "main.yml").write_text("- {name: h, ansible.builtin.debug: {msg: 'ran x={{ x }}'}}\n")
    (tmp_path / "play.yml").write_text(
        "- hosts: localhost\n  gather_facts: false\n  tasks:\n"
        "    - ansible.builtin.set_fact: {x: 1}\n"
        "    - {name: under a condition, when: x | int == 1, block: [{ansible.builtin.include_role: {name: r}}]}\n"
        "    - ansible.builtin.set_fact: {x: 0}\n"
        "    - {ansible.builtin.import_role: {name: r}}\n")
    proc = subprocess.run([os.path.join(VENV_BIN, "ansible-playbook"), "-i", "localhost,", "-c", "local",
                           "-e", "ansible_python_interpreter=" + os.path.join(VENV_BIN, "python"),
                           str(tmp_path / "play.yml")], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          check=True, env=dict(os.environ, ANSIBLE_ROLES_PATH=str(tmp_path / "roles")))
    assert proc.stdout.count("ran x=1") == 1 and "ran x=0" not in proc.stdout
