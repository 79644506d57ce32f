"""The engine's own batched figure (issue 37, item 2): llama-batched-bench run as the unit runs llama-server
(library/engine_batched_bench.py), its real output read, and the service compared with it
(module_utils/llmtune_capacity.py), on recorded outputs and, where a build and a GGUF are in the cache, for real."""

import contextlib
import json
import os
import pwd
import subprocess

import pytest

import engine_batched_bench as ebb  # noqa: E402  (library/ is on sys.path via conftest)
import inference_benchmark as bench  # noqa: E402
from ansible.module_utils import llmtune_capacity as cap  # noqa: E402
from ansible.module_utils.llmtune_systemd import parse_show, unit_command  # noqa: E402
from conftest import (FIXTURES, end_process, engine_proc_tree, free_port, llama_cpp_build,  # noqa: E402
                      needs_llama_cpp, read, wait_healthy)

CAPACITY = os.path.join(FIXTURES, "capacity")
BUILD = "/opt/llmtune/llama.cpp-0.3.36-x86_64-2e669cd01475"


def fixture_json(name):
    with open(os.path.join(CAPACITY, name), encoding="utf-8") as handle:
        return json.load(handle)


def test_the_jsonl_output_of_llama_batched_bench_is_read():
    rows = cap.parse_batched_bench(read(CAPACITY, "batched-bench-qwen3-0.6b-proxy-1t.jsonl"))
    assert [(row["pp"], row["tg"], row["pl"], row["n_kv"]) for row in rows] == [(40, 7, 1, 47), (40, 7, 2, 94),
                                                                              (40, 7, 4, 188)]
    assert rows[2]["t"] == pytest.approx(rows[2]["t_pp"] + rows[2]["t_tg"], abs=1e-5)
    # Four streams of 7 + 1 output tokens (the prefill gives the first) in 2.392125 s.
    assert cap.engine_output_rate(rows[2]) == round(4 * 8 / 2.392125, 3) == 13.377
    # The program's log may share the output; Markdown (the default format) has no result line to read.
    assert cap.parse_batched_bench("main: loading\n" + read(CAPACITY, "batched-bench-qwen3-0.6b-proxy-1t.jsonl")) == rows
    with pytest.raises(ValueError, match="no result line"):
        cap.parse_batched_bench(read(CAPACITY, "batched-bench-qwen3-0.6b-proxy-1t.md"))


def test_the_command_is_the_units_llama_server_without_its_server_options():
    show = parse_show(read(FIXTURES, "systemd", "show-instance"))
    argv, _env, user, _group, cpus = unit_command(show)
    bench_argv, slots, context = cap.batched_bench_argv(argv, [1, 2, 4, 8], 138, 32)
    # The instance's threads substituted, its memory binding kept, the same build folder's program.
    assert bench_argv == ["numactl", "--membind=1",
                          "/opt/llmtune/llama.cpp-0.3.36-x86_64-2b018d8dc08a/llama-batched-bench",
                          "--model", "/opt/llmtune/models/m.gguf", "--threads", "2", "--threads-batch", "2",
                          "--ctx-size", "4096", "-npp", "138", "-ntg", "31", "-npl", "1,2,4,8",
                          "--output-format", "jsonl"]
    assert (slots, context, user, cpus) == (4, 4096, "llm", [2, 3])


@pytest.mark.parametrize("extra, kept", [
    # Options that shape the computation follow; server-only ones, in either spelling, do not.
    (["--flash-attn", "on", "-b", "512", "--ubatch-size=256", "--load-mode", "mmap+mlock"],
     ["--flash-attn", "on", "-b", "512", "--ubatch-size=256", "--load-mode", "mmap+mlock"]),
    (["--api-key-file", "/etc/llm-inference-engine.key", "--alias=m", "-np", "8", "--cache-reuse", "256",
      "--cache-ram", "0", "-cram=512"], []),
])
def test_options_the_service_adds_follow_when_they_shape_the_computation(extra, kept):
    server = [f"{BUILD}/llama-server", "--model", "/m.gguf", "--port", "8000", "--ctx-size", "16384",
              "--threads", "2"] + extra
    bench_argv, _slots, _context = cap.batched_bench_argv(server, [1, 2], 128, 2)
    assert bench_argv == ([f"{BUILD}/llama-batched-bench", "--model", "/m.gguf", "--threads", "2"] + kept
                          + ["--ctx-size", "16384", "-npp", "128", "-ntg", "1", "-npl", "1,2", "--output-format",
                             "jsonl"])


def test_the_context_holds_the_largest_level():
    server = [f"{BUILD}/llama-server", "--model", "/m.gguf", "--parallel", "2", "--ctx-size", "1024"]
    bench_argv, slots, context = cap.batched_bench_argv(server, [1, 2, 4, 8, 16], 128, 32)
    # 16 streams of 128 + 31 cells: more than the server's 1024.
    assert bench_argv[bench_argv.index("--ctx-size") + 1] == str(16 * 159)
    assert (slots, context) == (2, 1024)


def test_what_cannot_be_compared_says_why(tmp_path):
    params = {"concurrency": [1, 2], "prompt_tokens": 128, "output_tokens": 32}
    transformers = parse_show(read(FIXTURES, "systemd", "show-tuned"))
    assert ebb.plan(params, transformers) == ("the service runs transformers, neither llama-server nor vLLM's OpenAI "
                                              "server: no batched benchmark of its own")
    (tmp_path / "llama-server").write_text("")
    show = {"ExecStart": f"{{ path={tmp_path}/llama-server ; argv[]={tmp_path}/llama-server --model /m.gguf "
                         "--port 8000 ; ignore_errors=no }", "User": "root"}
    assert ebb.plan(params, show) == (f"no {tmp_path}/llama-batched-bench: the build was made before "
                                      "llama-batched-bench was kept")


def vllm_show(main_pid=0):
    return {"ExecStart": read(FIXTURES, "jinja", "execstart-vllm"), "User": "llm", "MainPID": str(main_pid),
            "Environment": "VLLM_CPU_OMP_THREADS_BIND=0-1", "CPUAffinity": "0 1"}


def test_vllms_own_run_is_the_units_python_with_the_servers_engine_arguments():
    params = {"concurrency": [1, 2, 4], "prompt_tokens": 138, "output_tokens": 32, "memory_margin_mb": 512}
    tool, argv, env, user, _group, cpus, slots, context = ebb.plan(params, vllm_show())
    assert (tool, argv[:3], env, user, cpus, slots, context) == (
        "vLLM LLM.generate", ["/opt/llmtune/venv/bin/python", "-c", cap.VLLM_BATCHED],
        {"VLLM_CPU_OMP_THREADS_BIND": "0-1"}, "llm", [0, 1], 4, 1024)
    # Every server argument goes to vLLM's own parser, which keeps the engine's; a stream of 32 output tokens is one
    # prefill and 31 decode steps.
    assert json.loads(argv[3]) == {
        "server_args": ["--model", "/opt/llmtune/models/qwen3-0.6b-2l-proxy", "--served-model-name",
                        "qwen3-0.6b-2l-proxy", "--host", "127.0.0.1", "--port", "8000", "--dtype", "bfloat16",
                        "--max-num-seqs", "4", "--max-model-len", "1024", "--kv-cache-memory-bytes", "33554432",
                        "--enable-prefix-caching", "--disable-uvicorn-access-log"],
        "pp": 138, "tg": 31, "pl": [1, 2, 4], "repeats": 3, "seed": 0}
    compile(cap.VLLM_BATCHED, "VLLM_BATCHED", "exec")


def test_vllms_own_run_needs_room_for_a_second_engine(tmp_path):
    """The service's process tree (three processes of VmRSS 8712 kB here) again and the margin must fit MemAvailable
    (24191764 kB), else nothing starts and the report says why."""
    engine_proc_tree(tmp_path)
    params = {"concurrency": [1, 2], "prompt_tokens": 128, "output_tokens": 32, "memory_margin_mb": 23599}
    assert ebb.plan(params, vllm_show(4242), proc=str(tmp_path))[0] == "vLLM LLM.generate"
    assert ebb.plan(dict(params, memory_margin_mb=23600), vllm_show(4242), proc=str(tmp_path)) == (
        "not enough memory for vLLM's own batched run (a second engine) beside the service: VmRSS 25 MiB + margin "
        "23600 MiB > MemAvailable 23624 MiB")


def test_the_service_compared_with_the_engine_level_by_level():
    """The recorded sweep of llama-server (4 slots) and llama-batched-bench right after it, both beside other work."""
    levels = fixture_json("llama-server-2l-sweep.json")["levels"]
    rows = fixture_json("llama-server-2l-engine.json")["rows"]
    comparison = cap.compare_with_engine(levels, rows, slots=4, limit_percent=10, engine_noisy=True)
    assert [(e["concurrency"], e["service_tokens_per_s"], e["engine_tokens_per_s"], e["gap_percent"], e["verdict"])
            for e in comparison] == [(1, 47.25, 54.421, 13.2, "beyond"), (2, 46.685, 46.672, 0.0, "within"),
                                     (4, 70.871, 77.432, 8.5, "within"), (8, 73.529, 120.938, 39.2, "beyond")]
    noise = "other processes took CPU time during the service's level and llama-batched-bench"
    assert comparison[0]["reason"] == noise
    # 8 streams on 4 slots: half of them wait, whatever else happened.
    assert comparison[3]["reason"] == ("the service decodes at most 4 streams together (--parallel 4): the other 4 "
                                       "wait for a slot; " + noise)
    assert comparison[1]["reason"] is None
    # The engine's figure is its rows': B x (TG + 1) output tokens over the prefill and the decode.
    row = rows[3]
    assert comparison[3]["engine_tokens_per_s"] == round(8 * 32 / (row["t_pp"] + row["t_tg"]), 3)
    # One stream, the phases apart: 136 prompt tokens over TTFT p50 72.955 ms against the engine's 136 in 65.7 ms;
    # the requests' median decode 55.001 against 59.357. This sweep predates the engine's own prefill timing.
    assert comparison[0]["phases"] == {
        "prefill": {"service_tokens_per_s": None, "client_tokens_per_s": 1864.163, "engine_tokens_per_s": 2068.504,
                    "ratio": None, "client_ratio": 0.901},
        "decode": {"service_tokens_per_s": 55.001, "engine_tokens_per_s": 59.357, "ratio": 0.927}}
    # Eight streams: the engine's decode per stream is its lockstep S_TG over 8.
    assert comparison[3]["phases"]["decode"]["engine_tokens_per_s"] == round(row["speed_tg"] / 8, 3)


@pytest.mark.parametrize("gap, slots, errors, reason", [
    (25.0, 8, 0, "serving: HTTP and streaming, and each new prompt prefilled between the other streams' decode steps "
                 "(llama-batched-bench prefills all B prompts, then decodes the B streams in lockstep)"),
    (-15.0, 8, 0, "the service was faster than the engine's own run right after it: the host's speed drifts between "
                  "runs (docs/results.md)"),
    (25.0, 8, 2, "2 of the service's requests failed"),
])
def test_a_gap_on_a_quiet_host_names_its_cause(gap, slots, errors, reason):
    level = {"concurrency": 4, "errors": errors, "noisy": False}
    assert cap.gap_reason(level, gap, slots) == reason


def test_a_level_the_engine_did_not_run_is_not_measured():
    level = {"concurrency": 16, "output_tokens_per_s": 80.0, "errors": 0, "noisy": False}
    (entry,) = cap.compare_with_engine([level], [], slots=None, limit_percent=10)
    assert (entry["verdict"], entry["engine_tokens_per_s"], entry["reason"]) == \
        ("not measured", None, "llama-batched-bench gave no row for 16 streams")


# --- a real run: llama-server and llama-batched-bench of one build from the cache ---

@contextlib.contextmanager
def llama_server(argv, cpu, log_path):
    """The real llama-server of ARGV pinned to CPU; yields its base URL."""
    port = argv[argv.index("--port") + 1]
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url, log_path, "llama-server")
        yield url, proc.pid
    finally:
        end_process(proc)


@needs_llama_cpp
def test_a_real_sweep_beside_the_engines_own_batched_run(tiny_gguf, tmp_path):
    """llama-server of a cached build on one CPU, a short capacity sweep, then llama-batched-bench as its unit would
    run it: the same program folder, GGUF, threads and CPU, a row per level of the sweep, each compared."""
    folder, gguf = llama_cpp_build()[0], tiny_gguf
    cpu = max(os.sched_getaffinity(0))
    server = [f"{folder}/llama-server", "--model", gguf, "--alias", "m", "--host", "127.0.0.1", "--port",
              str(free_port()), "--parallel", "2", "--ctx-size", "2048", "--no-webui", "--cache-ram", "0",
              "--threads", "1", "--threads-batch", "1"]
    with llama_server(server, cpu, tmp_path / "server.log") as (url, pid):
        values = {name: spec.get("default") for name, spec in bench.ARGUMENT_SPEC.items()}
        values.update(url=url, model="m", server="llama_cpp", prompt_tokens=32, max_tokens=8, ignore_eos=True,
                      capacity=True, target_ttft_p95_ms=60000.0, target_itl_p95_ms=60000.0, capacity_min_requests=4,
                      capacity_max_concurrency=4, warmup=1, settle_timeout=0, lock_path="", engine_pid=pid)
        sweep, failure, _ = bench.run(values)
        assert failure is None
        show = {"ExecStart": f"{{ path={server[0]} ; argv[]={' '.join(server)} ; ignore_errors=no }}",
                "User": pwd.getpwuid(os.getuid()).pw_name, "CPUAffinity": str(cpu)}
        params = {name: spec.get("default") for name, spec in ebb.ARGUMENT_SPEC.items()}
        params.update(concurrency=[level["concurrency"] for level in sweep["levels"]],
                      prompt_tokens=round(sweep["levels"][0]["prompt_tokens_mean"]), output_tokens=8,
                      service_levels=sweep["levels"], lock_path=str(tmp_path / "benchmark.lock"))
        children = ebb.child_cpu_s()
        result = ebb.run_bench(params, show)
        used = ebb.child_cpu_s() - children
    assert sweep["capacity"]["levels"] == [1, 2, 4]
    assert result["argv"][0] == f"{folder}/llama-batched-bench"
    assert result["argv"][-8:] == ["-npp", str(params["prompt_tokens"]), "-ntg", "7", "-npl", "1,2,4",
                                   "--output-format", "jsonl"]
    assert (result["cpus"], result["slots"], result["server_context"]) == ([cpu], 2, 2048)
    assert [(row["pl"], row["pp"], row["tg"], row["n_threads"]) for row in result["rows"]] == \
        [(1, params["prompt_tokens"], 7, 1), (2, params["prompt_tokens"], 7, 1), (4, params["prompt_tokens"], 7, 1)]
    # The engine's CPU is its own process's, however busy the host was (a share of one CPU depends on that).
    assert used > 0.2
    assert result["cpu"]["engine"] * result["seconds"] == pytest.approx(used, rel=0.1, abs=0.1)
    assert [entry["concurrency"] for entry in result["comparison"]] == [1, 2, 4]
    # llama-server timed each prompt's prefill itself: the phases compare it with the engine's own prefill.
    first = result["comparison"][0]["phases"]["prefill"]
    assert sweep["levels"][0]["engine_prefill_tokens_per_s"] == first["service_tokens_per_s"] > 0
    assert first["ratio"] == round(first["service_tokens_per_s"] / round(result["rows"][0]["speed_pp"], 3), 3)
    for entry, level, row in zip(result["comparison"], sweep["levels"], result["rows"]):
        assert entry["service_tokens_per_s"] == level["output_tokens_per_s"]
        assert entry["engine_tokens_per_s"] == round(row["pl"] * 8 / row["t"], 3)
        assert entry["gap_percent"] == round(100 * (1 - level["output_tokens_per_s"] / entry["engine_tokens_per_s"]), 1)
        assert entry["verdict"] in ("within", "beyond") and (entry["reason"] is None) == (entry["verdict"] == "within")
    # 4 streams on 2 slots: the cause is named.
    if result["comparison"][2]["verdict"] == "beyond" and result["comparison"][2]["gap_percent"] > 0:
        assert "the service decodes at most 2 streams together (--parallel 2)" in result["comparison"][2]["reason"]
