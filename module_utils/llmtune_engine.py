# -*- coding: utf-8 -*-
"""What an engine adapter holds: the base class of module_utils/llmtune_engine_<engine>.py, one file per engine.

An adapter overrides what differs from these defaults; everything engine-specific of the service is there, and
module_utils/llmtune_engines.py lists the adapters. A SETTING (argv, environment, comment) holds the keys of
SETTING_KEYS: model_path, host, port, threads (each a value, or a systemd ${VARIABLE} of a template unit), tuned,
template (one engine per NUMA node: a template unit), slots, context_tokens, dtype, cpus, venv, program_dir (the
llama.cpp build's folder), cache_dir, api_key_file ("" for none), mlock, cache_ram_mib, kv_bytes,
continuous_batching and extra_args (appended, each shell-quoted).
"""

from __future__ import annotations

import abc
import shlex

SETTING_KEYS = ("model_path", "host", "port", "threads", "tuned", "template", "slots", "context_tokens", "dtype",
                "cpus", "venv", "program_dir", "cache_dir", "api_key_file", "mlock", "cache_ram_mib", "kv_bytes",
                "continuous_batching", "extra_args")


class Engine(abc.ABC):
    """An engine's facts and its part of the service's unit."""

    # Its value of inference_service_engine, and what reports call it.
    name = ""
    title = ""
    # "gguf" (one file) or "folder" (config.json and safetensors); venv: its program lives in the venv.
    weights = "folder"
    venv = True
    # "torch" or "ggml": the kernels its formats run on (module_utils/llmtune_kernels.py's tables).
    kernels = "torch"
    # It decodes a fixed number of sequences together (inference_service_parallel).
    slots = False
    # It is told its KV cache's size in bytes (the setting's kv_bytes).
    kv_cache_sized = False
    # Answers 200 once the model serves.
    health_path = "/health"
    # It checks a key file of its own behind nginx; else unkeyed_why says why not.
    key_file = False
    unkeyed_why = ""
    # It can lock its weights in RAM.
    mlock = False
    # MiB of /dev/shm it needs free at start.
    shm_mb = 0
    # {OS family: [packages]} it needs on the host; pip packages its requirements pull in that it does not use.
    system_packages = {}
    unused_packages = []
    # nginx's body limit comes from the model's config.json (the engine is not told a context length).
    reads_config = False
    # module_utils/llmtune_capacity.py can run its own batched benchmark beside the service.
    batched_bench = False
    # Lines added to the unit's sandbox (systemd.exec(5)), comments included.
    sandbox = []

    def model_name(self, model_path):
        """The model name clients send: the file's or folder's name."""
        return model_path.rstrip("/").rsplit("/", 1)[-1]

    @abc.abstractmethod
    def argv(self, s):
        """The command line for the setting S (every adapter has its own)."""

    def environment(self, s):  # pylint: disable=unused-argument
        """{name: value} the engine runs with, beyond the unit's own."""
        return {}

    def thread_environment(self, cpus):  # pylint: disable=unused-argument
        """{name: value} that binds its threads to CPUS (space-separated): a template unit's instance sets it."""
        return {}

    def comment(self, s):  # pylint: disable=unused-argument
        """The unit's comment lines on the setting S."""
        return []

    def fixed_length(self, max_tokens):  # pylint: disable=unused-argument
        """Request fields that make it generate exactly MAX_TOKENS tokens, end-of-sequence ignored: the ignore_eos
        field of vLLM's sampling parameters and llama.cpp's server."""
        return {"ignore_eos": True}

    def facts(self, os_family, model_path=""):
        """What the role needs of the engine before it writes a unit: on a host of OS_FAMILY, serving MODEL_PATH."""
        return {"name": self.name, "weights": self.weights, "venv": self.venv, "slots": self.slots,
                "kv_cache_sized": self.kv_cache_sized, "health_path": self.health_path,
                "key_file": self.key_file, "unkeyed_why": self.unkeyed_why,
                "mlock": self.mlock, "shm_mb": self.shm_mb,
                "system_packages": list(self.system_packages.get(os_family, [])),
                "unused_packages": list(self.unused_packages), "reads_config": self.reads_config,
                "batched_bench": self.batched_bench, "model_name": self.model_name(model_path) if model_path else ""}

    def unit(self, setting, instances=()):
        """The engine's part of its systemd unit for SETTING: exec_start (the command line as ExecStart= takes it),
        environment (["NAME=value"]), sandbox and comment lines, and the environment of each of INSTANCES (dicts
        with unit and cpus: a template unit's) by unit."""
        missing = [key for key in SETTING_KEYS if key not in setting]
        if missing:
            raise ValueError(f"the setting lacks {', '.join(missing)}")
        argv = [str(arg) for arg in self.argv(setting)]
        return {"argv": argv,
                "exec_start": " ".join(argv + [shlex.quote(str(arg)) for arg in setting["extra_args"]]),
                "environment": [f"{name}={value}" for name, value in self.environment(setting).items()],
                "instance_environment": {
                    instance["unit"]: [f"{name}={value}" for name, value in self.thread_environment(instance["cpus"]).items()]
                    for instance in instances},
                "sandbox": list(self.sandbox), "comment": list(self.comment(setting))}
