#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module service_setting: the inference_service variables that serve a measured setting."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: service_setting
short_description: Map a measured setting, or the auto-tune's stored choice, to the inference_service variables
description:
  - The one mapping from a setting the auto-tune measures (engine, weight format, threads, CPUs, allocator, slots or
    continuous batching, layout, tuned) to the variables of the inference_service role, used by every deploy (each
    row of the auto-tune, the serve stage of C(site.yml), and C(playbooks/verify.yml)). Keys a setting lacks or holds as
    null (results stored by earlier versions) take the role's defaults.
  - With O(setting), maps it. Otherwise, with O(result_path), maps the C(chosen) setting of the auto-tune's stored
    result there, with the llama.cpp slots and the requests nginx admits from its capacity stage; RV(source) is
    C(none) and RV(variables) empty when there is no such file.
  - The variables are checked against O(argument_spec) (the role's own argument spec, as the role checks them when
    it starts); a setting that fails fails here, naming it and each error.
  - Never changes the host.
version_added: "0.3.0"
author: llmtune project
options:
  setting:
    description: A setting or row of the auto-tune.
    type: dict
  result_path:
    description: The auto-tune's stored result, read when O(setting) is not given.
    type: path
  max_concurrent:
    description:
      - The operator's C(inference_service_max_concurrent), the requests nginx admits and the llama.cpp slots of a
        setting that names neither.
    type: int
    required: true
  context_tokens:
    description:
      - The operator's C(inference_service_context_tokens), the context of each llama.cpp slot of a setting that
        names none.
    type: int
    default: 4096
  argument_spec:
    description: The options of the inference_service role's C(main) entry point.
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Map the auto-tune's stored choice
  service_setting:
    result_path: /var/lib/llmtune/autotune.json
    max_concurrent: 4
    context_tokens: 4096
    argument_spec: "{{ (lookup('ansible.builtin.file', role_path ~ '/meta/argument_specs.yml') | from_yaml).argument_specs.main.options }}"
  register: mapped
"""

RETURN = r"""
variables:
  description: inference_service variable names and values; empty when there is nothing to serve from.
  returned: always
  type: dict
  sample: {inference_service_engine: llama_cpp, inference_service_gguf_type: bf16, inference_service_threads: 2}
source:
  description: C(setting), C(result) (the stored choice) or C(none).
  returned: always
  type: str
setting:
  description: The setting mapped.
  returned: always
  type: dict
result_path:
  description: O(result_path), for a caller that sets a stored result aside when its deploy fails.
  returned: always
  type: str
"""

import json

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.llmtune_autotune import check_service_variables, served_setting, service_variables


def resolve(params):
    """(source, setting, variables, errors) for the module's PARAMS."""
    setting, source = params["setting"], "setting"
    if setting is None and params["result_path"]:
        try:
            with open(params["result_path"], encoding="utf-8") as handle:
                setting = served_setting(json.load(handle))
        except FileNotFoundError:
            setting = None
        except ValueError as error:
            return "result", None, {}, [f"{params['result_path']} is not JSON: {error}"]
        source = "result"
        if setting is None:
            return "none", None, {}, []
    if setting is None:
        return "none", None, {}, []
    variables = service_variables(setting, params["max_concurrent"], params["context_tokens"])
    return source, setting, variables, check_service_variables(variables, params["argument_spec"])


def main():
    """Map and check; never changes anything."""
    module = AnsibleModule(argument_spec={
        "setting": {"type": "dict"},
        "result_path": {"type": "path"},
        "max_concurrent": {"type": "int", "required": True},
        "context_tokens": {"type": "int", "default": 4096},
        "argument_spec": {"type": "dict", "required": True},
    }, supports_check_mode=True)
    source, setting, variables, errors = resolve(module.params)
    if errors:
        where = module.params["result_path"] if source == "result" else "the setting"
        module.fail_json(msg=f"{where} does not deploy: {'; '.join(errors)} (setting {json.dumps(setting)})",
                         source=source, setting=setting, variables=variables, result_path=module.params["result_path"])
    module.exit_json(changed=False, source=source, setting=setting, variables=variables,
                     result_path=module.params["result_path"])


if __name__ == "__main__":
    main()
