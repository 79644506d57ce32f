"""Roles depend on each other through documented variables only.

A role's defaults are loaded only when that role runs: another role that reads one bare works where the owner ran
first (site.yml's baseline runs the benchmark role before the auto-tune) and fails where it did not. Found in
molecule llama_cpp's verify.yml: playbooks/autotune.yml alone failed with "'benchmark_fail_below' is undefined".
What one role needs of another's variables comes through that role's own fact (benchmark_settings) or is read with
a default.

A role's `__` names are its own: another role, a playbook or a scenario that reads one breaks when the role renames
it (autotune read five of the benchmark role's; it reads the benchmark_measurement fact now).
"""

import glob
import os
import re
import subprocess

import pytest
import yaml
from conftest import ROOT
from test_conditionals import conditions

ROLES = sorted(os.path.basename(path) for path in glob.glob(os.path.join(ROOT, "roles", "*")))
EXPRESSION = re.compile(r"\{\{(.*?)\}\}|\{%(.*?)%\}", re.S)
# Not an attribute (hostvars[host].name reads that host's variables, loaded with its inventory).
NAME = re.compile(r"(?<![.\w])[a-z][a-z0-9_]*\b")


def role_defaults(role):
    path = os.path.join(ROOT, "roles", role, "defaults", "main.yml")
    if not os.path.exists(path):
        return set()
    with open(path, encoding="utf-8") as f:
        return set(yaml.safe_load(f) or {})


def bare_reads(text, names, tasks=None):
    """The NAMES that TEXT's Jinja, and the conditions of TASKS (bare Jinja), read without a `| default(...)` right
    after them."""
    chunks = [a or b for a, b in EXPRESSION.findall(text)]
    chunks += [value for _, _, value in conditions(tasks or []) if isinstance(value, str)]
    found = set()
    for chunk in chunks:
        for match in NAME.finditer(chunk):
            if match.group(0) in names and not re.match(r"\s*\|\s*default\b", chunk[match.end():]):
                found.add(match.group(0))
    return found


def role_files(role):
    return sorted(path for path in glob.glob(os.path.join(ROOT, "roles", role, "**", "*"), recursive=True)
                  if path.endswith((".yml", ".j2")) and os.path.isfile(path))


@pytest.mark.parametrize("role", ROLES)
def test_no_role_reads_another_roles_default_bare(role):
    others = set().union(*(role_defaults(other) for other in ROLES if other != role))
    faults = {}
    for path in role_files(role):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        found = bare_reads(text, others, yaml.safe_load(text) if path.endswith(".yml") else None)
        if found:
            faults[os.path.relpath(path, ROOT)] = sorted(found)
    assert faults == {}


def test_the_fault_is_real():
    names = {"benchmark_fail_below", "inference_service_api_key"}
    text = """
- name: Start the sweep
  autotune_sweep:
    config:
      validation_floor: "{{ benchmark_fail_below }}"
      api_key_set: "{{ inference_service_api_key | default('') | length > 0 }}"
- name: Check the floor
  ansible.builtin.assert:
    that:
      - inference_service_api_key | length > 0
"""
    assert bare_reads(text, names, yaml.safe_load(text)) == {"benchmark_fail_below", "inference_service_api_key"}
    fixed = text.replace("{{ benchmark_fail_below }}", "{{ benchmark_settings.fail_below }}").replace(
        "- inference_service_api_key |", "- inference_service_api_key | default('') |")
    assert bare_reads(fixed, names, yaml.safe_load(fixed)) == set()


def private_reads(path, text):
    """The other roles' `__<role>_` names that TEXT (the file at PATH, relative to the project) reads."""
    return sorted({match.group(0) for role in ROLES if not path.startswith(f"roles/{role}/")
                   for match in re.finditer(rf"\b__{role}_\w+", text)})


def test_no_file_reads_another_roles_private_names():
    files = subprocess.run(["git", "ls-files", "*.yml", "*.j2"], cwd=ROOT, check=True, capture_output=True,
                           text=True).stdout.split()
    faults = {}
    for path in files:
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            found = private_reads(path, f.read())
        if found:
            faults[path] = found
    assert faults == {}


def test_a_private_read_is_found():
    text = "measurement: \"{{ {'result': __benchmark_result, 'own': __autotune_state} }}\"\n"
    assert private_reads("roles/autotune/tasks/measure_row.yml", text) == ["__benchmark_result"]
    assert private_reads("roles/benchmark/tasks/workload.yml", text) == ["__autotune_state"]
