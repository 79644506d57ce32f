#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module gguf_quality: a quantized GGUF against its bf16 source, by llama.cpp's llama-perplexity."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gguf_quality
short_description: Measure how far a quantized GGUF model's next-token distributions are from its bf16 source
description:
  - Runs llama.cpp's C(llama-perplexity) of O(tools) twice on the same text (O(text)), once on the bf16 GGUF
    (O(base)), keeping its next-token log-probabilities (C(--kl-divergence-base), about 300 KB per scored token with
    a vocabulary of 152k), then on the quantized GGUF (O(model)) with C(--kl-divergence), and returns the figures
    llama.cpp prints (C(tools/perplexity/README.md)), the mean and 99th percentile of the per-token
    Kullback-Leibler divergence, how often both models rank the same token first, and the ratio of their
    perplexities.
  - The text is split into O(chunks) chunks of O(context_tokens) tokens; llama-perplexity scores the second half of
    each chunk. The default text is the C(LICENSE.txt) of the Python that runs this module, which every CPython
    install carries (about 3,500 Qwen3 tokens of English prose), so every host and controller has the same text.
  - The base's log-probabilities are kept in O(base_logits) and the figures in O(dest) with what they were
    measured from (the two files' sizes and modification times, the text's SHA-256, the chunks, context and
    program); a later call with the same inputs returns them without running anything (RV(measured) false).
  - Never changes the host it runs on beyond those two files (C(changed) says whether they were written).
version_added: "0.1.0"
author: llmtune project
options:
  tools:
    description: Folder with C(llama-perplexity) and its libraries (a llama.cpp build).
    type: path
    required: true
  model:
    description: The quantized GGUF file.
    type: path
    required: true
  base:
    description: The GGUF file of the same model in bf16 (or f16, f32), the reference.
    type: path
    required: true
  text:
    description: Plain-text file to score. Default the C(LICENSE.txt) beside Python's standard library.
    type: path
  context_tokens:
    description: Tokens per chunk (C(-c)).
    type: int
    default: 256
  chunks:
    description: Chunks of the text to score (C(--chunks)); the text must hold that many.
    type: int
    default: 4
  threads:
    description: Threads of llama-perplexity (C(-t)); 0 = every CPU this module may run on.
    type: int
    default: 0
  base_logits:
    description: File for the base's log-probabilities. Default O(base) with C(.kld) appended.
    type: path
  dest:
    description: JSON file for the figures. Default O(model) with C(.quality.json) appended.
    type: path
  timeout:
    description: Seconds each llama-perplexity run may take.
    type: int
    default: 1800
notes:
  - A random-weight model (the project's proxies) spreads its next-token probability over the whole vocabulary, so
    its perplexity is near the vocabulary size and the same top token is nearly a coin toss between close logits;
    its KLD still grows with the rounding error of the weights (on the Qwen3-0.6B proxy, 4 chunks of 256 tokens,
    q8_0 0.0002, q4_0 0.029, q2_k 0.113), which is what the gate compares.
seealso:
  - name: llama.cpp perplexity and KL divergence
    link: https://github.com/ggml-org/llama.cpp/blob/master/tools/perplexity/README.md
"""

EXAMPLES = r"""
- name: Measure q8_0 against bf16 on the controller
  gguf_quality:
    tools: /srv/llmtune/cache/llama.cpp-0.3.36-x86_64-abc
    model: /srv/llmtune/cache/models/qwen3-0.6b-q8_0.gguf
    base: /srv/llmtune/cache/models/qwen3-0.6b-bf16.gguf
  delegate_to: localhost
  register: quality
"""

RETURN = r"""
quality:
  description: The figures and what they were measured from.
  returned: success
  type: dict
  contains:
    kld_mean: {description: Mean KL divergence per scored token (nats)., type: float, sample: 0.000202}
    kld_p99: {description: 99th percentile of the per-token KL divergence., type: float, sample: 0.00026}
    kld_max: {description: Largest per-token KL divergence., type: float, sample: 0.000265}
    same_top_percent: {description: Scored tokens whose most likely next token is the same in both models., type: float}
    ppl_ratio: {description: Perplexity of the quantized model / perplexity of the base., type: float}
    ppl: {description: Perplexity of the quantized model., type: float}
    ppl_base: {description: Perplexity of the base., type: float}
    chunks: {description: Chunks scored., type: int}
    context_tokens: {description: Tokens per chunk., type: int}
    scored_tokens: {description: Tokens scored (the second half of each chunk)., type: int}
    inputs: {description: What the figures depend on (files, text digest, options)., type: dict}
measured:
  description: Whether llama-perplexity ran in this call (false when O(dest) held figures of the same inputs).
  returned: success
  type: bool
"""

import hashlib
import json
import os
import subprocess

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.llmtune_quality import QualityError, parse_kl_divergence


def default_text():
    """Python's own LICENSE.txt, beside its standard library (os.py)."""
    return os.path.join(os.path.dirname(os.__file__), "LICENSE.txt")


def file_key(path):
    stat = os.stat(path)
    return {"path": path, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def inputs_of(params, text):
    with open(text, "rb") as handle:
        digest = hashlib.sha256(handle.read()).hexdigest()
    program = os.path.join(params["tools"], "llama-perplexity")
    return {"model": file_key(params["model"]), "base": file_key(params["base"]), "text_sha256": digest,
            "text": text, "context_tokens": params["context_tokens"], "chunks": params["chunks"],
            "program": file_key(program)}


def perplexity(params, model, extra):
    """Run llama-perplexity of PARAMS on MODEL with EXTRA arguments; its output, or QualityError with its tail."""
    threads = params["threads"] or len(os.sched_getaffinity(0))
    argv = [os.path.join(params["tools"], "llama-perplexity"), "--model", model, "--ctx-size",
            str(params["context_tokens"]), "--chunks", str(params["chunks"]), "--threads", str(threads)] + extra
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=params["timeout"], check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise QualityError(f"{' '.join(argv)}: {error}") from error
    output = done.stdout + done.stderr
    if done.returncode:
        tail = "\n".join(output.splitlines()[-8:])
        raise QualityError(f"{' '.join(argv)} exited with {done.returncode}:\n{tail}")
    return output


def measure(params):
    """(quality, measured): the stored figures of the same inputs, or a new measurement stored in dest."""
    text = params["text"] or default_text()
    dest = params["dest"] or params["model"] + ".quality.json"
    logits = params["base_logits"] or params["base"] + ".kld"
    inputs = inputs_of(params, text)
    try:
        with open(dest, encoding="utf-8") as handle:
            stored = json.load(handle)
        if stored.get("inputs") == inputs:
            return stored, False
    except (OSError, ValueError):
        pass
    logits_inputs = dict(inputs, model=inputs["base"])
    if not _holds(logits + ".json", logits_inputs) or not os.path.exists(logits):
        perplexity(params, params["base"], ["--file", text, "--kl-divergence-base", logits])
        _write_json(logits + ".json", logits_inputs)
    output = perplexity(params, params["model"], ["--kl-divergence-base", logits, "--kl-divergence"])
    quality = dict(parse_kl_divergence(output), inputs=inputs)
    _write_json(dest, quality)
    return quality, True


def _holds(path, inputs):
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle) == inputs
    except (OSError, ValueError):
        return False


def _write_json(path, value):
    part = f"{path}.{os.getpid()}.part"
    with open(part, "w", encoding="utf-8") as handle:
        json.dump(value, handle, indent=1, sort_keys=True)
    os.replace(part, path)


def main():
    module = AnsibleModule(argument_spec={
        "tools": {"type": "path", "required": True},
        "model": {"type": "path", "required": True},
        "base": {"type": "path", "required": True},
        "text": {"type": "path"},
        "context_tokens": {"type": "int", "default": 256},
        "chunks": {"type": "int", "default": 4},
        "threads": {"type": "int", "default": 0},
        "base_logits": {"type": "path"},
        "dest": {"type": "path"},
        "timeout": {"type": "int", "default": 1800},
    }, supports_check_mode=True)
    params = module.params
    for name in ("model", "base", "text"):
        if params[name] and not os.path.isfile(params[name]):
            module.fail_json(msg=f"gguf_quality: {name} {params[name]} is not a file")
    if not os.access(os.path.join(params["tools"], "llama-perplexity"), os.X_OK):
        module.fail_json(msg=f"gguf_quality: no llama-perplexity in {params['tools']} (a build before it was added?)")
    if params["context_tokens"] < 8 or params["chunks"] < 1 or params["threads"] < 0:
        module.fail_json(msg="gguf_quality: context_tokens must be >= 8, chunks >= 1 and threads >= 0")
    if module.check_mode:
        module.exit_json(changed=False, skipped=True, msg="check mode: nothing measured")
    try:
        quality, measured = measure(params)
    except (QualityError, OSError) as error:
        module.fail_json(msg=f"gguf_quality: {error}")
    module.exit_json(changed=measured, measured=measured, quality=quality)


if __name__ == "__main__":
    main()
