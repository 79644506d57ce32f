#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module memory_bandwidth: STREAM-style read bandwidth probe and the decode roofline of a model."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: memory_bandwidth
short_description: Measure memory read bandwidth and the decode upper bound (roofline) of an LLM on a host
description:
  - Runs a short STREAM-style read probe in the inference service's Python environment (O(python)), pinned to
    the service's CPUs (O(cpus), with sched_setaffinity(2)) and thread count (O(threads), via
    C(torch.set_num_threads) and C(OMP_NUM_THREADS)), so it reads memory the way the engine's matrix-vector
    products do. The probe sums a float32 array of O(size_mb) MiB (keep it at least 4x the last-level cache,
    so that the cache serves a negligible share) pass after pass until the last O(repeats) passes agree within
    O(spread_percent) (spread = (slowest - fastest) / median of those passes), at most O(max_passes) passes; a
    pass reads the array as many times as fit in about 0.2 s (timed on a read after the one that pages it in);
    bandwidth = array bytes / median time of those last passes, in GB/s (10^9 bytes/s). A probe that never
    settles returns its figure with RV(probe.stable) false and a warning. It uses torch when the environment
    has it (multi-threaded reduction), else numpy (the array split among O(threads) Python threads; numpy
    releases the GIL while it sums).
  - Where systemd is the service manager the probe runs in a transient scope of the service's slice (O(slice),
    C(systemd-run --scope)), under that slice's quota and cpuset rather than those of the Ansible login's session
    the module runs in.
  - With O(bandwidth_gb_s) no probe runs; the given figure (one probe per host, taken while it was idle) bounds
    the model's decode, so every row of a comparison is measured against the same bandwidth.
  - With O(model_path), reads the model's weight sizes from the safetensors headers alone (8-byte
    little-endian header length, then a JSON map of tensor name to dtype, shape and data offsets; see
    U(https://huggingface.co/docs/safetensors/index)), no torch needed, and the attention shape from its
    C(config.json). With a C(.gguf) file as O(model_path) (llama.cpp), reads its tensor table and attention
    metadata with the C(gguf) library in O(python) (GGUF format, U(https://github.com/ggml-org/ggml/blob/master/docs/gguf.md));
    quantized tensors count their stored bytes, and the
    KV cache counts 2 bytes per element (llama.cpp's default C(f16) cache type).
  - "Bytes read per decoded token = weight bytes + KV cache bytes. Decode at batch 1 reads every weight once per
    token. The input embedding is a row lookup (one row read), but with C(tie_word_embeddings) the same matrix
    is the output projection and is read in full; it is stored and counted once. KV cache read per token =
    num_hidden_layers x 2 (K and V) x num_key_value_heads x head_dim x O(context_tokens) x bytes per element."
  - Decode upper bound (tokens/s) = bandwidth / bytes read per decoded token. Compute, attention arithmetic and
    activations are left out, so a real engine stays below it; the fraction reached shows how much tuning
    can still gain.
  - Never changes the host (C(changed) is always false). Runs in check mode too (it only reads).
version_added: "0.1.0"
author: llmtune project
options:
  python:
    description:
      - Python interpreter of the inference service's environment.
    type: path
    default: /opt/llmtune/venv/bin/python
  cpus:
    description:
      - Logical CPUs to pin the probe to, in the syntax of systemd's C(CPUAffinity=) (systemd.exec(5)), CPU
        numbers or ranges separated by spaces or commas, for example C(0-3 8). Default (empty) the CPUs this
        module may run on (sched_getaffinity(2)).
    type: str
    default: ""
  threads:
    description:
      - Probe threads, as the service's C(OMP_NUM_THREADS). Default the number of O(cpus).
    type: int
  slice:
    description:
      - systemd slice the inference service runs in; the probe runs in a transient scope of it. Empty runs the probe
        in the module's own cgroup.
    type: str
    default: system.slice
  size_mb:
    description:
      - Probe array size in MiB. Keep it several times the last-level cache.
    type: int
    default: 256
  repeats:
    description:
      - Consecutive timed passes over the array that must agree within O(spread_percent); their median counts.
    type: int
    default: 5
  spread_percent:
    description:
      - Largest accepted spread of the last O(repeats) passes, percent of their median time.
    type: float
    default: 5
  max_passes:
    description:
      - Timed passes at most, before the probe gives up waiting for a stable figure.
    type: int
    default: 40
  bandwidth_gb_s:
    description:
      - Bandwidth measured before, in GB/s; skips the probe (O(cpus), O(threads) and O(size_mb) are then unused;
        O(python) must still exist, it reads a C(.gguf) O(model_path)).
    type: float
  probe:
    description:
      - C(false) measures nothing and returns only RV(model) (O(model_path) is then required; O(python) is only used
        to read a C(.gguf) file), e.g. to size a KV cache of O(context_tokens) tokens.
    type: bool
    default: true
  timeout:
    description:
      - Seconds the probe may take, imports included.
    type: int
    default: 120
  model_path:
    description:
      - Directory holding the model's C(*.safetensors) and C(config.json), or a C(.gguf) file (needs the C(gguf)
        package in O(python)). Without it only the bandwidth is returned.
    type: path
  dtype:
    description:
      - Dtype the service computes in (its C(--dtype)); C(auto) keeps each tensor's stored dtype and the
        C(dtype) (or C(torch_dtype)) of C(config.json) for the KV cache. Must be C(auto) for a C(.gguf) file.
    type: str
    default: auto
    choices: [auto, bfloat16, float16, float32]
  context_tokens:
    description:
      - Mean context length during decode (prompt plus half the output) for the KV cache term, in tokens.
    type: int
    default: 256
  table_cache_dir:
    description:
      - Folder that keeps the tensor table read from a C(.gguf) O(model_path), one JSON file per GGUF file, named
        after the file's real path, size and modification time (a changed file is read again). The gguf library
        builds one field per vocabulary entry, so reading a Qwen GGUF (151k tokens) takes 11-20 s on 2 vCPUs,
        a cached table milliseconds. Created when missing (mode 0755); a folder that cannot be written (read-only
        /var) only means the table is read each time. Unset, nothing is cached.
    type: path
seealso:
  - name: STREAM benchmark
    link: https://www.cs.virginia.edu/stream/
  - name: Roofline model (Williams, Waterman, Patterson, CACM 2009)
    link: https://doi.org/10.1145/1498765.1498785
"""

EXAMPLES = r"""
- name: Decode roofline of the served model with the service's CPUs and threads
  memory_bandwidth:
    python: /opt/llmtune/venv/bin/python
    cpus: "0 1 2 3"
    threads: 4
    model_path: /opt/llmtune/models/qwen3-0.6b
    dtype: bfloat16
    context_tokens: 160
  register: llmtune_roofline

- name: Show it
  ansible.builtin.debug:
    msg: >-
      {{ llmtune_roofline.bandwidth_gb_s }} GB/s, at most
      {{ llmtune_roofline.decode_upper_bound_tokens_per_s }} tokens/s
"""

RETURN = r"""
bandwidth_gb_s:
  description: Read bandwidth, 10^9 bytes/s (median of the last O(repeats) passes, or O(bandwidth_gb_s)).
  returned: unless O(probe=false)
  type: float
  sample: 18.4
probe:
  description: How the bandwidth was measured.
  returned: unless O(bandwidth_gb_s) is given or O(probe=false)
  type: dict
  contains:
    engine:
      description: C(torch <version>) or C(numpy <version>).
      type: str
    cpus:
      description: CPUs the probe was pinned to.
      type: list
      elements: int
    threads:
      description: Probe threads.
      type: int
    slice:
      description: Slice whose transient scope the probe ran in; null when it ran in the module's own cgroup.
      type: str
    bytes:
      description: Bytes read per pass.
      type: int
    best_s:
      description: Seconds of the fastest pass.
      type: float
    median_s:
      description: Median seconds of the last O(repeats) passes.
      type: float
    passes:
      description: Timed passes run.
      type: int
    spread_percent:
      description: Spread of the last O(repeats) passes, percent of their median.
      type: float
    stable:
      description: Whether that spread is within O(spread_percent).
      type: bool
model:
  description: Bytes the model reads per decoded token; returned with O(model_path).
  returned: when O(model_path) is set
  type: dict
  contains:
    parameters:
      description: Elements of all stored tensors.
      type: int
    stored_bytes:
      description: Bytes of all stored tensors (safetensors data offsets, or GGUF tensor sizes).
      type: int
    tied_embeddings:
      description: Whether the output projection is the input embedding (C(tie_word_embeddings), or no
        separate C(lm_head.weight) stored).
      type: bool
    weight_bytes_per_token:
      description: Weight bytes read per decoded token at O(dtype).
      type: int
    kv_bytes_per_token:
      description: KV cache bytes read per decoded token at O(context_tokens).
      type: int
    bytes_per_token:
      description: Sum of the two.
      type: int
    table_cached:
      description: For a C(.gguf) file, whether its tensor table came from O(table_cache_dir).
      type: bool
      returned: when O(model_path) is a C(.gguf) file
decode_upper_bound_tokens_per_s:
  description: Bandwidth / bytes read per decoded token, tokens/s at batch 1.
  returned: when O(model_path) is set, unless O(probe=false)
  type: float
  sample: 14.9
"""

import contextlib
import glob
import hashlib
import json
import os
import statistics
import struct
import subprocess

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.llmtune_sysfs import parse_cpu_list
from ansible.module_utils.llmtune_systemd import find_systemd_run, scope_argv

# Bytes per element of the safetensors dtype names (safetensors format specification).
SAFETENSORS_DTYPE_BYTES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
    "U16": 2, "U32": 4, "U64": 8, "F8_E4M3": 1, "F8_E5M2": 1,
}
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")
TORCH_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}

# Runs in the service's interpreter: argv = threads, bytes, window, max passes, spread percent; prints one JSON line.
PROBE = r"""
import json, statistics, sys, time
threads, size, window, max_passes = (int(arg) for arg in sys.argv[1:5])
spread_limit = float(sys.argv[5])
try:
    import torch
    torch.set_num_threads(threads)
    array = torch.ones(size // 4, dtype=torch.float32)
    read = lambda: array.sum().item()
    engine = "torch " + torch.__version__
except ImportError:
    from concurrent.futures import ThreadPoolExecutor
    import numpy
    array = numpy.ones(size // 4, dtype=numpy.float32)
    chunks = numpy.array_split(array, threads)
    pool = ThreadPoolExecutor(threads)
    read = lambda: sum(pool.map(lambda chunk: float(chunk.sum()), chunks))
    engine = "numpy " + numpy.__version__
read()  # page in and warm up the thread pool
start = time.perf_counter()
read()
# One pass reads the array often enough to last about 0.2 s, so scheduler ticks and page-cache noise average out.
reads = max(1, int(0.2 / max(time.perf_counter() - start, 1e-6)))
times = []
while len(times) < max_passes:
    start = time.perf_counter()
    for _ in range(reads):
        read()
    times.append((time.perf_counter() - start) / reads)
    last = times[-window:]
    if len(last) == window and (max(last) - min(last)) / statistics.median(last) * 100 <= spread_limit:
        break
print(json.dumps({"engine": engine, "bytes": size // 4 * 4, "times": times}))
"""


# Runs in the service's interpreter (llama.cpp venv): argv = GGUF path; prints one JSON line.
GGUF_TABLE = r"""
import json, sys
from gguf import GGUFReader
reader = GGUFReader(sys.argv[1])
arch = reader.fields["general.architecture"].contents()
def field(key):
    found = reader.fields.get(arch + "." + key)
    return found.contents() if found else None
print(json.dumps({
    "tensors": {t.name: [int(t.n_elements), int(t.n_bytes)] for t in reader.tensors},
    "layers": field("block_count"), "embedding": field("embedding_length"), "heads": field("attention.head_count"),
    "kv_heads": field("attention.head_count_kv"), "key_length": field("attention.key_length"),
    "value_length": field("attention.value_length")}))
"""
GGUF_KV_BYTES = 2  # llama.cpp's default KV cache type is f16


class RooflineError(Exception):
    """One-line message for the task output."""


def safetensors_tensors(path):
    """{name: (dtype, elements, bytes)} from the header of one .safetensors file; RooflineError if malformed."""
    try:
        with open(path, "rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(length))
    except (OSError, struct.error, ValueError) as error:
        raise RooflineError(f"cannot read the safetensors header of {path}: {error}") from error
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        elements = 1
        for dim in info["shape"]:
            elements *= dim
        start, end = info["data_offsets"]
        tensors[name] = (info["dtype"], elements, end - start)
    return tensors


def model_bytes_per_token(model_path, dtype="auto", context_tokens=256):
    """Bytes read per decoded token of the model in MODEL_PATH (dict as RETURN model); RooflineError on failure."""
    files = sorted(glob.glob(os.path.join(model_path, "*.safetensors")))
    if not files:
        raise RooflineError(f"no *.safetensors in {model_path}")
    try:
        with open(os.path.join(model_path, "config.json"), encoding="utf-8") as handle:
            config = json.load(handle)
    except (OSError, ValueError) as error:
        raise RooflineError(f"cannot read {model_path}/config.json: {error}") from error
    config = config.get("text_config", config)  # multimodal checkpoints nest the language model's config
    tensors = {}
    for path in files:
        tensors.update(safetensors_tensors(path))

    def size(dtype_name, elements, stored):
        if dtype == "auto" or dtype_name not in FLOAT_DTYPES:
            return stored
        return elements * TORCH_DTYPE_BYTES[dtype]

    weight = sum(size(*t) for t in tensors.values())
    embedding = next((t for name, t in tensors.items() if name.endswith("embed_tokens.weight")), None)
    tied = bool(config.get("tie_word_embeddings")) or not any(name.endswith("lm_head.weight") for name in tensors)
    if embedding and not tied:
        # Untied: the input embedding is only a row lookup per token.
        rows = embedding[1] // config["hidden_size"]
        weight -= size(*embedding) - size(*embedding) // rows
    kv_dtype = dtype if dtype != "auto" else config.get("dtype") or config.get("torch_dtype") or "float32"
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or config["num_attention_heads"]
    kv = config["num_hidden_layers"] * 2 * kv_heads * head_dim * context_tokens * TORCH_DTYPE_BYTES.get(kv_dtype, 4)
    return {
        "parameters": sum(t[1] for t in tensors.values()),
        "stored_bytes": sum(t[2] for t in tensors.values()),
        "tied_embeddings": tied,
        "weight_bytes_per_token": weight,
        "kv_bytes_per_token": kv,
        "bytes_per_token": weight + kv,
    }


def run_in(python, what, args, timeout, prefix=(), **kwargs):
    """Last stdout line of PYTHON ARGS (after the launcher PREFIX) as JSON; RooflineError naming WHAT on failure."""
    try:
        done = subprocess.run([*prefix, python, *args], capture_output=True, text=True, timeout=timeout, check=False,
                              **kwargs)
    except (OSError, subprocess.SubprocessError) as error:
        raise RooflineError(f"cannot run {what} with {python}: {error}") from error
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RooflineError(f"{what} with {python} failed (exit {done.returncode}): {last}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def gguf_table(python, path, timeout, cache_dir=None):
    """(GGUF_TABLE's output for PATH, whether it came from CACHE_DIR); RooflineError when the reader fails.
    Kept in CACHE_DIR under the file's real path, size and mtime; a cache that cannot be written is skipped."""
    cached = None
    if cache_dir:
        stat = os.stat(path)
        key = hashlib.sha256(f"{os.path.realpath(path)}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).hexdigest()
        cached = os.path.join(cache_dir, f"gguf-table-{key[:32]}.json")
        try:
            with open(cached, encoding="utf-8") as handle:
                return json.load(handle), True
        except (OSError, ValueError):
            pass
    table = run_in(python, "the GGUF reader", ["-c", GGUF_TABLE, path], timeout)
    if cached:
        part = f"{cached}.{os.getpid()}.part"
        try:
            os.makedirs(cache_dir, mode=0o755, exist_ok=True)
            with open(part, "w", encoding="utf-8") as handle:
                json.dump(table, handle)
            os.replace(part, cached)
        except OSError:
            # No half-written file left behind: rollback removes the folder only when it holds tables alone.
            with contextlib.suppress(OSError):
                os.unlink(part)
    return table, False


def gguf_bytes_per_token(python, path, context_tokens, timeout, cache_dir=None):
    """As model_bytes_per_token, for a GGUF file read with the gguf library in PYTHON (its table kept in CACHE_DIR,
    see gguf_table); RooflineError on failure."""
    table, cached = gguf_table(python, path, timeout, cache_dir)
    tensors = table["tensors"]
    if not tensors or not table["layers"] or not table["embedding"]:
        raise RooflineError(f"{path}: no tensors or no block_count/embedding_length in the GGUF metadata")
    weight = sum(size for _, size in tensors.values())
    tied = "output.weight" not in tensors
    embedding = tensors.get("token_embd.weight")
    if embedding and not tied:
        rows = embedding[0] // table["embedding"]
        weight -= embedding[1] - embedding[1] // rows
    heads = table["heads"] or 1
    key = table["key_length"] or table["embedding"] // heads
    value = table["value_length"] or key
    kv = table["layers"] * (key + value) * (table["kv_heads"] or heads) * context_tokens * GGUF_KV_BYTES
    return {
        "parameters": sum(elements for elements, _ in tensors.values()),
        "stored_bytes": sum(size for _, size in tensors.values()),
        "tied_embeddings": tied,
        "weight_bytes_per_token": weight,
        "kv_bytes_per_token": kv,
        "bytes_per_token": weight + kv,
        "table_cached": cached,
    }


def probe_bandwidth(python, cpus, threads, size_mb, repeats, timeout, spread_percent=5.0, max_passes=40,
                    service_slice=None, systemd_run=None):
    """Run PROBE with PYTHON pinned to CPUS, in a scope of SERVICE_SLICE when SYSTEMD_RUN (its path) is given;
    returns (GB/s, probe dict). RooflineError on failure."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    args = [str(threads), str(size_mb * 2**20), str(repeats), str(max(max_passes, repeats)), str(spread_percent)]
    prefix = scope_argv([], service_slice, systemd_run=systemd_run)
    out = run_in(python, "the probe", ["-c", PROBE] + args, timeout, prefix=prefix, env=env,
                 preexec_fn=lambda: os.sched_setaffinity(0, cpus))
    last = out["times"][-repeats:]
    median = statistics.median(last)
    spread = (max(last) - min(last)) / median * 100
    probe = {"engine": out["engine"], "cpus": sorted(cpus), "threads": threads, "bytes": out["bytes"],
             "slice": service_slice if prefix else None,
             "best_s": round(min(out["times"]), 9), "median_s": round(median, 9), "passes": len(out["times"]),
             "spread_percent": round(spread, 2), "stable": len(last) == repeats and spread <= spread_percent}
    return round(out["bytes"] / median / 1e9, 3), probe


def run(params, systemd_run=None):
    """Measure; returns (result, failure message or None). SYSTEMD_RUN: see probe_bandwidth."""
    result = {"changed": False}
    try:
        cpus = parse_cpu_list(",".join(params["cpus"].split())) or sorted(os.sched_getaffinity(0))
    except ValueError:
        return result, f"cpus must be CPU numbers or ranges (CPUAffinity= syntax), got {params['cpus']!r}"
    threads = params["threads"] or len(cpus)
    if threads < 1 or params["size_mb"] < 1 or params["repeats"] < 1 or params["context_tokens"] < 0:
        return result, "threads, size_mb and repeats must be >= 1 and context_tokens >= 0"
    if params["spread_percent"] <= 0 or params["max_passes"] < 1:
        return result, "spread_percent must be > 0 and max_passes >= 1"
    if params["bandwidth_gb_s"] is not None and params["bandwidth_gb_s"] <= 0:
        return result, "bandwidth_gb_s must be > 0"
    if not params["probe"] and not params["model_path"]:
        return result, "probe=false needs model_path (the model is all it reads)"
    needs_python = params["probe"] or (params["model_path"] or "").endswith(".gguf")
    if needs_python and not os.access(params["python"], os.X_OK):
        return result, f"python {params['python']} is not an executable file (is the service installed?)"
    try:
        model = None
        if params["model_path"] and params["model_path"].endswith(".gguf"):
            if params["dtype"] != "auto":
                return result, f"dtype must be auto for a GGUF file (it stores its own types), got {params['dtype']}"
            model = gguf_bytes_per_token(params["python"], params["model_path"], params["context_tokens"],
                                         params["timeout"], params["table_cache_dir"])
        elif params["model_path"]:
            model = model_bytes_per_token(params["model_path"], params["dtype"], params["context_tokens"])
        if not params["probe"]:
            result["model"] = model
            return result, None
        if params["bandwidth_gb_s"]:
            bandwidth = params["bandwidth_gb_s"]
        else:
            bandwidth, probe = probe_bandwidth(params["python"], cpus, threads, params["size_mb"], params["repeats"],
                                               params["timeout"], params["spread_percent"], params["max_passes"],
                                               params["slice"], systemd_run)
            result["probe"] = probe
    except (RooflineError, OSError) as error:
        return result, str(error)
    result["bandwidth_gb_s"] = bandwidth
    if model:
        result.update(model=model, decode_upper_bound_tokens_per_s=round(bandwidth * 1e9 / model["bytes_per_token"], 3))
    return result, None


ARGUMENT_SPEC = {
    "python": {"type": "path", "default": "/opt/llmtune/venv/bin/python"},
    "cpus": {"type": "str", "default": ""},
    "threads": {"type": "int"},
    "slice": {"type": "str", "default": "system.slice"},
    "size_mb": {"type": "int", "default": 256},
    "repeats": {"type": "int", "default": 5},
    "spread_percent": {"type": "float", "default": 5},
    "max_passes": {"type": "int", "default": 40},
    "bandwidth_gb_s": {"type": "float"},
    "probe": {"type": "bool", "default": True},
    "timeout": {"type": "int", "default": 120},
    "model_path": {"type": "path"},
    "dtype": {"type": "str", "default": "auto", "choices": ["auto", "bfloat16", "float16", "float32"]},
    "context_tokens": {"type": "int", "default": 256},
    "table_cache_dir": {"type": "path"},
}


def main():
    """Run the module; it only reads, so it also measures in check mode."""
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    result, failure = run(module.params, find_systemd_run())
    if result.get("probe") and not result["probe"]["stable"]:
        module.warn(f"the bandwidth probe did not settle: the last {module.params['repeats']} passes spread "
                    f"{result['probe']['spread_percent']} % (limit {module.params['spread_percent']} %); "
                    "another process is probably using memory bandwidth")
    if failure:
        module.fail_json(msg=failure, **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
