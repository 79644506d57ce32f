"""site.yml's stages run alone with tags (docs/how-it-works.md: `--tags serve`, `--tags validate`): what a stage takes
from an earlier role must run under its tag too. Read from ansible-playbook --list-tasks, as ansible-core selects
them."""

import glob
import os
import subprocess

import pytest
import yaml
from conftest import ROOT, VENV_BIN


def listed_tasks(tags):
    """Names ("role : task") of the tasks site.yml runs with --tags TAGS, in order (static imports only)."""
    proc = subprocess.run([os.path.join(VENV_BIN, "ansible-playbook"), "-i", os.path.join(ROOT, "inventory", "vm"),
                           "--list-tasks", "--tags", tags, os.path.join(ROOT, "site.yml")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, check=True)
    return [line.split("\tTAGS:")[0].strip() for line in proc.stdout.splitlines() if "\tTAGS:" in line]


@pytest.mark.parametrize("tags", ["serve", "autotune"])
def test_a_deploy_alone_binds_the_service_to_its_numa_node(tags):
    # The numa role's binding facts (CPUAffinity, NUMAPolicy, NUMAMask of the unit): `site.yml --tags serve` in the
    # two-node VM served with the memory policy "default" while they ran under the numa tag alone.
    tasks = listed_tasks(tags)
    assert "numa : Set the service binding facts" in tasks
    if tags == "serve":
        assert tasks.index("numa : Set the service binding facts") < tasks.index("inference_service : Write the systemd unit")


def test_the_tuning_stage_alone_leaves_the_service_out():
    tasks = listed_tasks("numa")
    assert "numa : Set the service binding facts" in tasks
    assert "inference_service : Write the systemd unit" not in tasks


def tasks_of(items):
    """Every task of a play's task lists, blocks' rescue and always sections included."""
    for task in items or []:
        yield task
        for section in ("block", "rescue", "always"):
            yield from tasks_of(task.get(section))


PLAYBOOKS = [os.path.join(ROOT, "site.yml")] + sorted(glob.glob(os.path.join(ROOT, "playbooks", "*.yml")))


@pytest.mark.parametrize("path", PLAYBOOKS, ids=os.path.basename)
def test_a_role_included_under_every_tag_runs_its_tasks_under_every_tag(path):
    # The include of a tag "always" runs with --tags, but its role's tasks keep their own tags and are left out: with
    # `site.yml --tags serve,validate` a failed host was not rolled back and wrote no row of the fleet report.
    with open(path, encoding="utf-8") as handle:
        plays = yaml.safe_load(handle) or []
    leaky = [task["name"] for play in plays for section in ("pre_tasks", "tasks", "post_tasks")
             for task in tasks_of(play.get(section)) if "ansible.builtin.include_role" in task
             and "always" in task.get("tags", [])
             and "always" not in (task["ansible.builtin.include_role"].get("apply") or {}).get("tags", [])]
    assert leaky == []
