"""Every kind of stored auto-tune result goes through the serve stage's variable resolution and argument checks as
ansible-core runs them (issue 40): the inference_service role's `setting` tasks (module service_setting, the one
mapping), then its argument spec and its tasks/variables.yml checks, on localhost hosts that each hold one stored
result.
"""

import json
import os
import subprocess

import cpu_topology
import pytest
import yaml
from conftest import FIXTURES, ROOT, VENV_BIN, stored_choices

PLAYBOOK = """
- name: Resolve and check the setting each host would serve
  hosts: all
  gather_facts: false
  tasks:
    - name: Take the stored choice
      ansible.builtin.import_role:
        name: inference_service
        tasks_from: setting
      vars:
        inference_service_serve_autotuned: true

    # Its entry point "variables" carries the options of "main": ansible-core checks them first, as at the deploy.
    - name: Check the role's arguments and variables
      ansible.builtin.include_role:
        name: inference_service
        tasks_from: variables

    - name: Report what would be served
      ansible.builtin.debug:
        msg:
          engine: "{{ inference_service_engine }}"
          dtype: "{{ inference_service_dtype }}"
          gguf_type: "{{ inference_service_gguf_type }}"
          threads: "{{ inference_service_threads | int }}"
          cpus: "{{ inference_service_cpu_affinity }}"
          allocator: "{{ inference_service_allocator }}"
          parallel: "{{ inference_service_parallel | int }}"
          continuous_batching: "{{ inference_service_continuous_batching | bool }}"
          layout: "{{ inference_service_layout }}"
          engines: "{{ __inference_service_engines.units }}"
"""

BAD = {"engine": "llama_cpp", "format": "q3_k", "gguf_type": "q3_k", "threads": 2, "cpus": "0 1", "tuned": True}


def run_serve_stage(tmp_path, results, topology_fixture="qemu-2node"):
    """Run PLAYBOOK with one local host per entry of RESULTS (name: stored result or None for no file); returns
    {host: (failed, message or the resolved variables)}."""
    hosts = {}
    for index, (name, result) in enumerate(results.items()):
        path = tmp_path / f"autotune-{index}.json"
        if result is not None:
            path.write_text(json.dumps(result))
        hosts[f"h{index}"] = {"ansible_connection": "local", "ansible_python_interpreter": os.path.join(VENV_BIN, "python"),
                              "inference_service_autotune_path": str(path), "case": name}
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    (tmp_path / "play.yml").write_text(PLAYBOOK)
    facts = cpu_topology.gather(os.path.join(FIXTURES, "topology", topology_fixture))
    facts["numa_policy_permitted"] = True
    extra = {"cpu_topology": facts, "inference_service_api_key": "k" * 40}
    (tmp_path / "extra.json").write_text(json.dumps(extra))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
               ANSIBLE_CALLBACKS_ENABLED="ansible.posix.json", ANSIBLE_FORKS="8")
    proc = subprocess.run([os.path.join(VENV_BIN, "ansible-playbook"), "-i", str(tmp_path / "inventory.yml"),
                           "-e", "@" + str(tmp_path / "extra.json"), str(tmp_path / "play.yml")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    report = json.loads(proc.stdout)
    out = {}
    for host, values in hosts.items():
        case = values["case"]
        for task in report["plays"][0]["tasks"]:
            result = task["hosts"].get(host)
            if result and result.get("failed"):
                out[case] = (True, result.get("msg", ""))
                break
            if result and task["task"]["name"] == "Report what would be served":
                out[case] = (False, result["msg"])
    return out


def test_every_kind_of_stored_result_passes_the_serve_stages_checks(tmp_path):
    results = {name: {"chosen": setting} for name, setting in stored_choices()}
    results["no stored result"] = None
    results["a choice that would not deploy"] = {"chosen": BAD}
    served = run_serve_stage(tmp_path, results)
    assert served["a choice that would not deploy"][0]
    assert "value of inference_service_gguf_type must be one of" in served["a choice that would not deploy"][1]
    for name, (failed, resolved) in served.items():
        if name == "a choice that would not deploy":
            continue
        assert not failed, f"{name}: {resolved}"
        setting = (results[name] or {}).get("chosen") or {}
        assert resolved["engine"] == setting.get("engine", "transformers"), name
        if setting:
            assert resolved["threads"] == setting["threads"] and resolved["cpus"] == setting["cpus"], name
    # The input: a transformers bf16 winner, gguf_type null, deploys as transformers bfloat16.
    assert served["the demo's transformers winner, gguf_type null"][1]["dtype"] == "bfloat16"
    # Older results name no layout or slots: one engine, nginx's limit as slots.
    assert served["llama.cpp q8_0 before batching and layouts"][1]["layout"] == "single"
    assert served["llama.cpp q8_0 before batching and layouts"][1]["parallel"] == 4
    # One engine per NUMA node on the captured two-node machine: two engines.
    assert served["one engine per NUMA node"][1]["engines"] == ["llm-inference@0.service", "llm-inference@1.service"]
    # Without a stored result the variables stand: the topology's recommendation, one engine.
    assert served["no stored result"][1]["engines"] == ["llm-inference.service"]
