"""site.yml's stages run alone with tags (docs/how-it-works.md: `--tags serve`, `--tags validate`): what a stage takes
from an earlier role must run under its tag too. Read from ansible-playbook --list-tasks, as ansible-core selects
them."""

import os
import subprocess

import pytest
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
