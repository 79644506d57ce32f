#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module engine_adapter: what an engine's adapter says of it, and its part of the service's unit."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: engine_adapter
short_description: An inference engine's facts and its part of the service's systemd unit, from its adapter
description:
  - Every engine-specific fact of the service (command line, environment, health path, key file, memory lock,
    system packages, sandbox additions) lives in one adapter file per engine,
    C(module_utils/llmtune_engine_<engine>.py); C(module_utils/llmtune_engine.py) says what an adapter holds.
    The role renders what this module returns; its templates have no engine branches.
  - Without O(setting) it returns the engine's facts only; with it also the engine's part of the unit.
  - With O(layout) it also returns the service's engines (module_utils/llmtune_service_layout.py) and fails, naming
    the variable, on ports that collide or run past 65535.
  - It reads and changes nothing on the host.
options:
  engine:
    description:
      - The engine, as in inference_service_engine.
    type: str
    required: true
  os_family:
    description:
      - The host's OS family (C(ansible_os_family)), for the engine's system packages.
    type: str
    default: Debian
  model_path:
    description:
      - The model on the host (a GGUF file or a model folder), for the name clients send.
    type: str
    default: ""
  setting:
    description:
      - The served setting (the keys of C(SETTING_KEYS) in module_utils/llmtune_engine.py).
    type: dict
  instances:
    description:
      - A template unit's instances (each with C(unit) and C(cpus)), for the environment of each drop-in.
    type: list
    elements: dict
    default: []
  layout:
    description:
      - The role variables the service's engines are decided from, without their C(inference_service_) prefix
        (C(INPUTS) in module_utils/llmtune_service_layout.py; C(firewall_ports) is
        C(inference_service_engine_firewall_ports)).
    type: dict
  topology:
    description:
      - The host's C(cpu_topology) facts (role topology), for one engine per NUMA node.
    type: dict
    default: {}
author:
  - llmtune
"""

EXAMPLES = r"""
- name: Read the engine's facts
  engine_adapter:
    engine: llama_cpp
    os_family: "{{ ansible_os_family }}"
  register: adapter

- name: The engine's facts and the service's engines
  engine_adapter:
    engine: llama_cpp
    layout:
      name: llm-inference
      listen: 127.0.0.1
      port: 8000
      proxy_port: 8080
      layout: per_node
      tuned: true
      parallel: 4
      cpu_affinity: "0 1"
      threads: 2
      numa_policy: ""
      numa_mask: ""
      firewall_ports: [8100]
    topology: "{{ cpu_topology }}"
  register: adapter

- name: The engine's part of its unit
  engine_adapter:
    engine: vllm
    model_path: /var/lib/llm-inference/models/qwen3-0.6b
    setting:
      model_path: /var/lib/llm-inference/models/qwen3-0.6b
      host: 127.0.0.1
      port: 8000
      threads: 2
      tuned: true
      template: false
      slots: 4
      context_tokens: 4096
      dtype: bfloat16
      cpus: "0 1"
      venv: /opt/llmtune/venv
      program_dir: ""
      cache_dir: /var/cache/llm-inference
      api_key_file: ""
      mlock: false
      cache_ram_mib: 0
      kv_bytes: 469762048
      continuous_batching: false
      extra_args: []
  register: engine_unit
"""

RETURN = r"""
engine:
  description: The engine's facts (C(Engine.facts) in module_utils/llmtune_engine.py).
  returned: always
  type: dict
  sample: {"name": "llama_cpp", "weights": "gguf", "health_path": "/health",
           "key_file": true, "unkeyed_why": "", "mlock": true, "shm_mb": 0, "system_packages": ["libgomp1"],
           "unused_packages": [], "reads_config": false, "batched_bench": true, "model_name": "qwen3-0.6b-q8_0"}
unit:
  description: The engine's part of the unit; C(exec_start) is the whole command line as ExecStart= takes it,
    C(environment) and each C(instance_environment) a list of C(NAME=value), C(sandbox) and C(comment) lines.
  returned: when O(setting) is given
  type: dict
  sample: {"argv": ["/opt/llmtune/b/llama-server", "--model", "/m.gguf"], "exec_start": "/opt/llmtune/b/llama-server --model /m.gguf",
           "environment": [], "instance_environment": {}, "sandbox": [], "comment": ["4 slots of 4096 tokens"]}
layout:
  description: The service's engines and where they are reached (C(layout) in module_utils/llmtune_service_layout.py).
  returned: when O(layout) is given
  type: dict
  sample: {"instances": [{"unit": "llm-inference.service", "node": null, "port": 8000, "cpus": "0 1", "threads": 2,
                          "numa_policy": "", "numa_mask": "", "slots": 4}],
           "units": ["llm-inference.service"], "per_node": false, "loopback": true, "proxied": false,
           "engine_host": "127.0.0.1", "engine_base": "http://127.0.0.1", "engine_urls": ["http://127.0.0.1:8000"],
           "unit_file": "/etc/systemd/system/llm-inference.service", "twin_ports": [8100], "access_ports": [8000, 8100]}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.llmtune_engines import adapter
from ansible.module_utils.llmtune_service_layout import INPUTS, layout


def main():
    module = AnsibleModule(
        argument_spec={
            "engine": {"type": "str", "required": True},
            "os_family": {"type": "str", "default": "Debian"},
            "model_path": {"type": "str", "default": ""},
            "setting": {"type": "dict"},
            "instances": {"type": "list", "elements": "dict", "default": []},
            "layout": {"type": "dict"},
            "topology": {"type": "dict", "default": {}},
        },
        supports_check_mode=True,
    )
    params = module.params
    try:
        engine = adapter(params["engine"])
        result = {"engine": engine.facts(params["os_family"], params["model_path"])}
        if params["setting"] is not None:
            result["unit"] = engine.unit(params["setting"], params["instances"])
        if params["layout"] is not None:
            missing = sorted(set(INPUTS) - set(params["layout"]))
            if missing:
                module.fail_json(msg=f"engine_adapter: layout needs {', '.join(missing)}")
            result["layout"] = layout(params["layout"], params["topology"])
    except (ValueError, KeyError, TypeError) as error:
        module.fail_json(msg=f"engine_adapter: {error}")
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
