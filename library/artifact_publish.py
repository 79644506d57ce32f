#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: put an artifact into a content-addressed store for hosts to fetch from a mirror."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: artifact_publish
short_description: Put an artifact's files into a content-addressed store, with a manifest of their SHA-256 sums
description:
  - Puts every file of O(path) (a file, or a folder such as a Hugging Face model folder) into O(store) as
    C(sha256/<hex>), named by its SHA-256, and writes C(manifests/<name>.json) with each file's path inside the
    artifact, sum and size. A file already in the store is not written again; a hard link is used where the store
    and the artifact share a file system, a copy otherwise; both land atomically.
  - Sums are kept in C(sums.json) by path, size, modification time and inode, so a second run reads no file again.
  - Hidden entries of a folder (a hub download's C(.cache) metadata) are left out.
  - Several forks publishing the same artifact wait for each other on the store's lock, so a file is read once.
  - Meant for the controller (C(delegate_to=localhost)). The operator serves the store over HTTP(S) as it is (any
    web server or object store); hosts fetch C(<base URL>/sha256/<hex>) and check the sum before using the file.
version_added: "0.3.0"
author: llmtune contributors
options:
  path:
    description: The artifact on the controller, a file or a folder.
    type: path
    required: true
  store:
    description: The store's folder; made when missing.
    type: path
    required: true
  name:
    description: The manifest's name. Default is the basename of O(path).
    type: str
  dest:
    description: The path the artifact takes on a host; each file of RV(files) then names its own path there.
    type: str
attributes:
  check_mode:
    support: full
    details: Computes the sums and reports what would be written, writing nothing.
  diff_mode:
    support: none
notes:
  - Fails with a message when O(path) is missing or an empty folder, or when the store cannot be written.
"""

EXAMPLES = r"""
- name: Publish the GGUF file for the fleet's mirror
  artifact_publish:
    path: /var/cache/llmtune/models/qwen3-0.6b-q8_0.gguf
    store: /var/cache/llmtune/mirror
  delegate_to: localhost
  register: published

- name: Fetch it on the host from the mirror, checked
  ansible.builtin.get_url:
    url: "https://mirror.example.com/llmtune/sha256/{{ published.files[0].sha256 }}"
    checksum: "sha256:{{ published.files[0].sha256 }}"
    dest: /opt/llmtune/models/qwen3-0.6b-q8_0.gguf
    mode: "0644"
"""

RETURN = r"""
name:
  description: The manifest's name.
  returned: always
  type: str
  sample: qwen3-0.6b-2l-proxy
manifest:
  description: The manifest's path in the store.
  returned: always
  type: str
  sample: /var/cache/llmtune/mirror/manifests/qwen3-0.6b-2l-proxy.json
files:
  description: Each file of the artifact, by name; C(path) is empty for an artifact that is one file; C(dest), its
    path on a host, with O(dest).
  returned: always
  type: list
  elements: dict
  sample: [{"path": "model.safetensors", "sha256": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
            "size": 1192135096, "dest": "/opt/llmtune/models/qwen3-0.6b/model.safetensors"}]
folders:
  description: The folders of an artifact that is a folder, by path inside it (an empty string for itself); empty
    for an artifact that is one file.
  returned: always
  type: list
  elements: str
  sample: ["", "tokenizer"]
placed:
  description: The sums of the files new in the store (written by this run, or to be written in check mode).
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.llmtune_artifacts import ArtifactError, publish


def main():
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "store": {"type": "path", "required": True},
            "name": {"type": "str"},
            "dest": {"type": "str"},
        },
        supports_check_mode=True,
    )
    try:
        result = publish(module.params["path"], module.params["store"], module.params["name"], module.check_mode,
                         module.params["dest"])
    except ArtifactError as error:
        module.fail_json(msg=str(error))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
