# -*- coding: utf-8 -*-
"""llama.cpp's llama-server: the engine adapter (module_utils/llmtune_engine.py holds the defaults)."""

from __future__ import annotations

from ansible.module_utils.llmtune_engine import Engine


class LlamaCpp(Engine):
    name = "llama_cpp"
    title = "llama.cpp"
    kernels = "ggml"
    # A GGUF file holds its own weight type; the server is a program of its own (the llama.cpp build).
    weights = "gguf"
    venv = False
    slots = True
    # /health: 503 while the model loads, 200 once it serves (tools/server/README.md).
    key_file = True
    mlock = True
    # The OpenMP runtime the ggml CPU backend links.
    system_packages = {"Debian": ["libgomp1"], "RedHat": ["libgomp"]}
    # llama-batched-bench of the same build runs the served kernels.
    batched_bench = True

    def model_name(self, model_path):
        """The file's name without .gguf (--alias)."""
        name = super().model_name(model_path)
        return name[:-len(".gguf")] if name.endswith(".gguf") else name

    def argv(self, s):
        slots = int(s["slots"])
        out = [f"{s['program_dir']}/llama-server", "--model", s["model_path"], "--alias", self.model_name(s["model_path"]),
               "--host", s["host"], "--port", str(s["port"]), "--parallel", str(slots),
               # A context of each slot: the slots share one KV cache.
               "--ctx-size", str(int(s["context_tokens"]) * slots), "--no-webui", "--metrics",
               "--cache-ram", str(int(s["cache_ram_mib"]))]
        if s["api_key_file"]:
            out += ["--api-key-file", s["api_key_file"]]
        if s["mlock"]:
            out += ["--load-mode", "mmap+mlock"]
        # Untuned, the server picks its own thread count.
        if s["tuned"]:
            out += ["--threads", str(s["threads"]), "--threads-batch", str(s["threads"])]
        return out

    def comment(self, s):
        each = " on each engine" if s["template"] else ""
        lines = [f"{s['slots']} slots of {s['context_tokens']} tokens{each}, decoded together (continuous batching)."]
        if s["api_key_file"]:
            lines.append("Behind nginx it checks a host key of its own (--api-key-file): no local user gets past "
                         "nginx's key check on loopback.")
        return lines
