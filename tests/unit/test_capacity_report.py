"""The capacity in the reports (issue 37): the host's table and chart (roles/benchmark/files/capacity_report.py,
module_utils/llmtune_capacity.py's report_markdown), the lines of report.txt.j2, the fleet report's sum and the role's
tasks that carry the sweep there, rendered as ansible-core renders them, on the recorded sweep of llama-server."""

import json
import os
import subprocess
import sys

import pytest

from ansible.module_utils import llmtune_capacity as cap  # noqa: E402
from ansible.module_utils.llmtune_engines import adapter  # noqa: E402
from conftest import FIXTURES, ROOT, read  # noqa: E402
from test_site_tags import tasks_of  # noqa: E402
from test_jinja_expressions import (condition, load, plugins, render, render_template_file, render_tree,  # noqa: E402,F401
                                    task, task_vars)

CAPACITY = os.path.join(FIXTURES, "capacity")
SCRIPT = os.path.join(ROOT, "roles", "benchmark", "files", "capacity_report.py")


def fixture_json(name):
    with open(os.path.join(CAPACITY, name), encoding="utf-8") as handle:
        return json.load(handle)


@pytest.fixture(name="recorded")
def recorded_capacity():
    """The benchmark role's __benchmark_capacity of the recorded llama-server sweep, judged and compared as the modules
    do now."""
    sweep, engine = fixture_json("llama-server-2l-sweep.json"), fixture_json("llama-server-2l-engine.json")
    targets = sweep["capacity"]["targets"]
    for level in sweep["levels"]:
        level.update(cap.judge_level(level, targets))
    sweep["capacity"] = cap.capacity_of(sweep["levels"], targets, sweep["capacity"]["stopped"],
                                        sweep["capacity"]["elapsed_s"])
    engine["comparison"] = cap.compare_with_engine(sweep["levels"], engine["rows"], engine["slots"], 10, engine["noisy"])
    return {"engine": "llama_cpp", "result": sweep, "engine_batched": engine}


def test_the_host_table_gives_every_level_the_capacity_and_the_engines_own_figure(recorded):
    lines = cap.report_markdown("node1", recorded["result"], recorded["engine_batched"], "llama_cpp")
    text = "\n".join(lines)
    assert lines[0] == "## Capacity of node1 at the targets"
    assert ("Targets: TTFT p95 at most 2000 ms, ITL p95 at most 100 ms. Workload: 128-token synthetic prompts (about "
            "136.0 tokens with the chat template), 32 output tokens (EOS ignored)") in text
    assert ("**node1 serves 8 concurrent stream(s) within the targets**, goodput 73.529 output tokens/s (of 73.529 in "
            "all).") in lines
    assert "The sweep stopped: every level up to 8 streams (capacity_max_concurrency) met the targets (21.5 s)." in lines
    rows = [line for line in lines if line.startswith("| ") and line[2].isdigit() or line.startswith("| **")]
    assert [row.split(" | ")[0] for row in rows] == ["| 1", "| 2", "| 4", "| **8**"]
    assert rows[3].startswith("| **8** | 16 | 0 | 73.529 | 73.529 | 16 of 16 | 1950.943 | 1979.295 | 46.93 | 54.636 | "
                              "120.938 | 39.2 | noisy; the service decodes at most 4 streams together (--parallel 4)")
    assert rows[1].endswith("| 46.672 | 0.0 | noisy |")
    sentence = lines[-1]
    assert sentence.startswith("Engine's own batched figure: llama-batched-bench of the same build, GGUF, threads, CPUs "
                               "and batch sizes (`llama-batched-bench --model /work/cache/models/qwen3-0.6b-2l-proxy-"
                               "bf16.gguf --threads 1 --threads-batch 1 --ctx-size 4096 -npp 136 -ntg 31 -npl 1,2,4,8 "
                               "--output-format jsonl`, 6.3 s right after the sweep)")
    assert "The service is within 10 % of it at 2 of 4 levels; beyond it at 1 stream (13.2 %: other processes" in sentence


def test_a_host_that_meets_no_target_and_an_engine_without_a_tool_of_its_own(recorded):
    result = dict(recorded["result"], capacity=dict(recorded["result"]["capacity"], concurrency=0,
                                                    stopped="TTFT p95 2400.0 ms > 2000 ms at 1 stream"))
    lines = cap.report_markdown("node2", result, {}, "transformers")
    assert "**node2 meets the targets at no concurrency**: one stream alone misses them." in lines
    assert lines[-1].startswith("Engine's own batched figure: none compared. transformers has no batched benchmark of "
                                "its own that runs the served stack")
    lines = cap.report_markdown("node3", recorded["result"], {"skipped": True, "msg": "one engine per NUMA node"},
                                "llama_cpp")
    assert lines[-1] == "Engine's own batched figure: not measured (one engine per NUMA node)."


def test_vllms_own_figure_is_read_and_named(recorded):
    """vLLM's own run prints llama-batched-bench's fields; the report names what ran and with which arguments."""
    rows = cap.parse_batched_bench("INFO 12-05 loading\n" + read(CAPACITY, "vllm-batched-qwen3-0.6b-2l-proxy.jsonl"))
    assert [(row["pl"], row["pp"], row["tg"], cap.engine_output_rate(row)) for row in rows] == [
        (1, 100, 15, round(16 / 3.1943, 3)), (2, 100, 15, round(32 / 2.8792, 3)), (4, 100, 15, round(64 / 3.7222, 3))]
    argv, slots, _context = cap.vllm_batched_argv(
        ["/opt/llmtune/venv/bin/python", "-m", cap.VLLM_SERVER_MODULE, "--model", "/m", "--port", "8000",
         "--max-num-seqs", "4"], [1, 2, 4], 100, 16)
    # The service at 80 % of the engine's own figure at each of the same streams, on a quiet host: the gap by design.
    levels = [dict(level, noisy=False, errors=0, output_tokens_per_s=round(0.8 * cap.engine_output_rate(row), 3))
              for level, row in zip(recorded["result"]["levels"], rows)]
    engine = {"tool": "vLLM LLM.generate", "argv": [arg for arg in argv if arg != cap.VLLM_BATCHED], "seconds": 84.2,
              "prompt_tokens": 100, "output_tokens": 16, "max_gap_percent": 10,
              "comparison": cap.compare_with_engine(levels, rows, slots, 10, tool="vLLM LLM.generate")}
    sentence = cap.report_markdown("node1", recorded["result"], engine, "vllm")[-1]
    assert sentence.startswith("Engine's own batched figure: vLLM's offline engine (vLLM LLM.generate) in the same "
                               "Python with the server's engine arguments (`--model /m --port 8000 --max-num-seqs 4`), "
                               "CPUs and environment, the median of 3 runs of new prompts given at once, 84.2 s right "
                               "after the sweep), B streams of 100-token prompts and 16 output tokens each")
    assert [level["concurrency"] for level in levels] == [1, 2, 4]
    assert "The service is within 10 % of it at 0 of 3 levels" in sentence
    assert "(vLLM LLM.generate prefills all B prompts, then decodes the B streams in lockstep)" in sentence


def test_the_controller_writes_the_table_and_the_chart(recorded, tmp_path):
    """The role's command: the real script with matplotlib, on the host report as validate.yml writes it."""
    report = tmp_path / "node1.json"
    report.write_text(json.dumps({"host": "node1", "result": {}, "capacity": recorded}))
    table, chart = tmp_path / "node1-capacity.md", tmp_path / "node1-capacity.png"
    done = subprocess.run([sys.executable, SCRIPT, str(report), str(table), str(chart)], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    text = table.read_text()
    assert text.startswith("## Capacity of node1 at the targets\n")
    assert text.endswith("\n![latency against throughput](node1-capacity.png)\n")
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and chart.stat().st_size > 20000


def test_the_auto_tunes_chart_draws_every_engine_it_swept(recorded, tmp_path):
    """The auto-tune's report task: the same script on its stored result, a sweep per engine (the recorded one, and
    the same again as another engine); a failed sweep is left out, and a result without any draws nothing."""
    sweep = {"engine": "llama_cpp", "of": {"format": "bf16"}, "status": "measured", "sweep": recorded["result"],
             "engine_batched": recorded["engine_batched"]}
    other = dict(sweep, engine="vllm", of={"format": "bfloat16"}, engine_batched={})
    failed = {"engine": "transformers", "status": "failed: The engine failed to start"}
    source, chart = tmp_path / "node1-autotune.json", tmp_path / "node1-autotune-capacity.png"
    source.write_text(json.dumps({"host": "node1", "capacities": [sweep, other, failed]}))
    done = subprocess.run([sys.executable, SCRIPT, "--autotune", str(source), str(chart)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and chart.stat().st_size > 20000
    chart.unlink()
    source.write_text(json.dumps({"host": "node1", "capacities": [failed]}))
    assert subprocess.run([sys.executable, SCRIPT, "--autotune", str(source), str(chart)], timeout=120,
                          check=False).returncode == 0
    assert not chart.exists()
    tsk = task("roles/autotune/tasks/report.yml", "Draw the capacity stage's sweeps (PNG)")
    assert condition(tsk["when"], __autotune_result={"capacities": [failed]}) is False
    assert condition(tsk["when"], __autotune_result={"capacities": [failed, sweep]}) is True
    assert condition(tsk["when"], __autotune_result={"capacity": None}) is False


def test_the_host_report_names_its_capacity(recorded):
    from test_jinja_expressions import VALIDATION

    text = render_template_file("roles/benchmark/templates/report.txt.j2", __benchmark_result=VALIDATION,
                                __benchmark_twin_row={"skipped": "no room"}, benchmark_direct_max_gap_percent=5,
                                __benchmark_capacity=recorded, benchmark_controller_report_dir="/r",
                                inventory_hostname="node1")
    assert ("capacity: 8 concurrent stream(s) within TTFT p95 2000.0 ms and ITL p95 100.0 ms, goodput 73.529 output "
            "tokens/s; the sweep stopped: every level up to 8 streams (capacity_max_concurrency) met the targets. "
            "Table and chart: /r/node1-capacity.md") in text.splitlines()
    # Without a sweep (benchmark_capacity false) the report says nothing of it.
    text = render_template_file("roles/benchmark/templates/report.txt.j2", __benchmark_result=VALIDATION,
                                __benchmark_twin_row={"skipped": "no room"}, benchmark_direct_max_gap_percent=5)
    assert "capacity" not in text


CAPACITY_TASKS = "roles/benchmark/tasks/capacity.yml"


ENGINE_RUN = "Run the engine's own batched benchmark as the service runs it, at the same streams"


@pytest.mark.parametrize("engine, more_urls, engine_run, kept", [
    ("llama_cpp", [], {"rows": [], "comparison": [], "changed": False, "invocation": {}}, {"rows": [], "comparison": []}),
    ("vllm", [], {"rows": [], "comparison": [], "changed": False, "invocation": {}}, {"rows": [], "comparison": []}),
    ("llama_cpp", ["http://127.0.0.1:8001"], {"skipped": True, "changed": False},
     {"skipped": True, "msg": "one engine per NUMA node: the service is the sum of several engines"}),
    ("transformers", [], {"skipped": True, "changed": False, "false_condition": "..."}, {}),
])
def test_the_role_keeps_the_sweep_and_the_engines_own_figure(engine, more_urls, engine_run, kept):
    tsk = task(CAPACITY_TASKS, "Keep the capacity and the engine's own figure for the reports")
    sweep = {"capacity": {"concurrency": 2}, "levels": [], "changed": False, "invocation": {"module_args": {}}}
    # What the service role publishes of the engine it runs, from the engine's adapter.
    running = {"engine": engine, "batched_bench": adapter(engine).batched_bench}
    batched = render(load("roles/benchmark/vars/main.yml")["__benchmark_batched"], inference_service_running=running)
    variables = task_vars(tsk, __benchmark_engine=engine, benchmark_more_urls=more_urls,
                          __benchmark_capacity_run=sweep, __benchmark_engine_run=engine_run, __benchmark_batched=batched)
    got = render_tree(tsk["ansible.builtin.set_fact"]["__benchmark_capacity"], **variables)
    assert got == {"engine": engine, "result": {"capacity": {"concurrency": 2}, "levels": []}, "engine_batched": kept}
    run = task(CAPACITY_TASKS, ENGINE_RUN)
    assert condition(run["when"], benchmark_more_urls=more_urls, __benchmark_batched=batched) is (
                         kept == {"rows": [], "comparison": []})


def test_the_engine_benchmark_gets_the_sweeps_streams_and_prompt_length(recorded):
    run = task(CAPACITY_TASKS, ENGINE_RUN)
    variables = task_vars(run, __benchmark_capacity_run=recorded["result"], benchmark_capacity_prompt_tokens=128)
    args = run["engine_batched_bench"]
    assert render(args["concurrency"], **variables) == [1, 2, 4, 8]
    assert render(args["prompt_tokens"], **variables) == 136
    # A server that sends no usage: the synthetic prompt's length.
    levels = [dict(level, prompt_tokens_mean=None) for level in recorded["result"]["levels"]]
    variables = task_vars(run, __benchmark_capacity_run={"levels": levels}, benchmark_capacity_prompt_tokens=128)
    assert render(args["prompt_tokens"], **variables) == 128


FLEET_ROW = "roles/fleet_report/tasks/main.yml"


def test_the_fleet_row_takes_the_capacity_of_this_runs_report(plugins, tmp_path, recorded):
    (tmp_path / "fleet.json").write_text(json.dumps({"started": "2026-12-04T21:40:00Z", "hosts": {}}))
    report = {"reported": "2026-12-04T21:47:00Z", "result": {"started": "2026-12-04T21:46:00Z", "summary": {}},
              "capacity": recorded}
    (tmp_path / "node.json").write_text(json.dumps(report))
    tsk = task(FLEET_ROW, "Put the row together")
    variables = task_vars(tsk, fleet_report_dir=str(tmp_path), inventory_hostname="node", fleet_report_failure={},
                          fleet_report_action="", ansible_facts={}, __fleet_report_baseline={})
    row = tsk["ansible.builtin.set_fact"]["__fleet_report_row"]
    assert render(row["capacity"], **variables) == {"concurrency": 8, "goodput_tokens_per_s": 73.529,
                                                    "targets": {"ttft_p95_ms": 2000.0, "itl_p95_ms": 100.0}}
    # A failed host's report is stale: no capacity.
    variables["fleet_report_failure"] = {"step": "Validate the gain", "msg": "below baseline"}
    assert render(row["capacity"], **variables) == {}


def test_the_fleet_report_sums_the_capacity_over_its_hosts():
    targets = {"ttft_p95_ms": 2000.0, "itl_p95_ms": 100.0}
    hosts = {"a": {"status": "ok", "capacity": {"concurrency": 8, "goodput_tokens_per_s": 73.5, "targets": targets}},
             "b": {"status": "ok", "capacity": {"concurrency": 4, "goodput_tokens_per_s": 40.25, "targets": targets}},
             "c": {"status": "ok", "capacity": {}},
             "d": {"status": "not reached"}}
    text = render_template_file("roles/fleet_report/templates/fleet.md.j2",
                                __fleet_report={"started": "2026-12-04T21:40:00Z", "hosts": hosts})
    assert ("**This fleet serves 12 concurrent streams within the targets** (TTFT p95 ≤ 2000.0 ms and ITL p95 ≤ 100.0 "
            "ms): the sum of the capacities of the 2 host(s) that measured one (`benchmark_capacity`), goodput 113.8 "
            "output tokens/s; per host: `<host>-capacity.md`.") in text.splitlines()
    assert [line.split(" | ")[10] for line in text.splitlines() if line.startswith("| a ") or line.startswith("| c ")] \
        == ["8", "-"]
    # Hosts at targets of their own: each counts at its own, and the report says so.
    hosts["b"]["capacity"]["targets"] = {"ttft_p95_ms": 1000.0, "itl_p95_ms": 100.0}
    text = render_template_file("roles/fleet_report/templates/fleet.md.j2",
                                __fleet_report={"started": "2026-12-04T21:40:00Z", "hosts": hosts})
    assert ("(TTFT p95 ≤ 2000.0 ms and ITL p95 ≤ 100.0 ms; TTFT p95 ≤ 1000.0 ms and ITL p95 ≤ 100.0 ms, each host at "
            "its own)") in text
    # No host measured one: no sum.
    hosts = {"a": {"status": "ok"}}
    text = render_template_file("roles/fleet_report/templates/fleet.md.j2",
                                __fleet_report={"started": "2026-12-04T21:40:00Z", "hosts": hosts})
    assert "This fleet serves" not in text


def test_the_controller_summary_gives_each_hosts_capacity(recorded):
    hostvars = {"node1": {"__benchmark_capacity": recorded, "__benchmark_result": {"summary": {}}},
                "node2": {"__benchmark_result": {"summary": {}}}}
    text = render_template_file("roles/benchmark/templates/summary.md.j2", ansible_play_hosts=["node1", "node2"],
                                hostvars=hostvars)
    rows = {line.split(" | ")[0]: line.split(" | ") for line in text.splitlines() if line.startswith("| node")}
    assert rows["| node1"][-2:] == ["8", "73.529 |"] and rows["| node2"][-2:] == ["-", "- |"]


VALIDATE = "roles/benchmark/tasks/validate.yml"


def test_the_validation_reports_the_capacity_the_auto_tune_measured():
    """The demo's auto-tune measured its choice at 2 streams and sized the service with it; the validation ran no sweep
    of its own (benchmark_capacity off) and its summary gave the capacity as '-'. site.yml now passes the auto-tune's
    sweep of the served setting, and the summary gives it."""
    from ansible.module_utils.llmtune_autotune import served_capacity

    with open(os.path.join(FIXTURES, "autotune", "autotune-demo-capacity.json"), encoding="utf-8") as handle:
        stored = json.load(handle)
    measured = served_capacity(stored)
    assert (measured["engine"], measured["result"]["capacity"]["concurrency"]) == ("llama_cpp", 2)
    assert measured["engine_batched"]["rows"][0]["pl"] == 1
    start = task(VALIDATE, "Start with the capacity measured before")
    capacity = render_tree(start["ansible.builtin.set_fact"]["__benchmark_capacity"],
                           **task_vars(start, benchmark_capacity_measured=measured))
    text = render_template_file("roles/benchmark/templates/summary.md.j2", ansible_play_hosts=["node1"],
                                hostvars={"node1": {"__benchmark_capacity": capacity,
                                                    "__benchmark_result": {"summary": {}}}})
    row = next(line for line in text.splitlines() if line.startswith("| node1"))
    assert row.split(" | ")[-2:] == ["2", "19.065 |"]
    # The site.yml wiring: the validation gets the auto-tune's fact.
    site = load("site.yml")
    rollout = next(play for play in site if play.get("name") == "Roll out in batches")
    validate = next(t for t in tasks_of(rollout["tasks"]) if t.get("name") == "Validate the gain")
    assert render(validate["vars"]["benchmark_capacity_measured"], autotune_served_capacity=measured) == measured
    assert render(validate["vars"]["benchmark_capacity_measured"]) == {}  # llmtune_autotune=false
    # A stage that did not measure (failed, off, or a result stored before it existed) gives nothing.
    assert served_capacity(dict(stored, capacity=dict(stored["capacity"], status="failed"))) == {}
    assert served_capacity({"chosen": stored["chosen"]}) == {}


def test_the_sweeps_settings_are_part_of_the_validations_fingerprint_only_when_it_runs():
    """Off (the default), the fingerprint is what it was before the sweep existed: stored validations stand."""
    tsk = task(VALIDATE, "Decide whether the stored validation stands")
    settings = dict(benchmark_url="http://127.0.0.1:8000", benchmark_more_urls=[], benchmark_model="m",
                    benchmark_requests=4, benchmark_concurrency=[1], benchmark_max_tokens=32, benchmark_warmup=1,
                    benchmark_prompt_tokens=0, benchmark_ignore_eos=False, benchmark_fail_below={},
                    benchmark_direct_twin=True, benchmark_roofline=True, benchmark_direct_max_gap_percent=5,
                    benchmark_direct_max_rounds=12, __benchmark_inputs={"stdout": "inputs"},
                    __benchmark_validation_file={}, benchmark_revalidate=False)
    sweep = dict(benchmark_target_ttft_p95_ms=2000, benchmark_target_itl_p95_ms=100,
                 benchmark_capacity_prompt_tokens="128", benchmark_capacity_output_tokens="32",
                 benchmark_capacity_max_concurrency=64, benchmark_capacity_min_requests=20,
                 benchmark_capacity_time_limit_s=600, benchmark_engine_max_gap_percent=10)
    # The method as the role's vars name it, rendered from the variables above.
    method = render_tree(load("roles/benchmark/vars/main.yml")["__benchmark_capacity_method"], **sweep)
    settings["__benchmark_capacity_method"] = method
    off = task_vars(tsk, benchmark_capacity=False, **settings, **sweep)
    assert "capacity" not in off["__settings"]
    on = task_vars(tsk, benchmark_capacity=True, **settings, **sweep)
    assert on["__settings"]["capacity"] == {"ttft_p95_ms": 2000.0, "itl_p95_ms": 100.0, "prompt_tokens": 128,
                                            "output_tokens": 32, "max_concurrency": 64, "min_requests": 20,
                                            "time_limit_s": 600.0, "engine_max_gap_percent": 10.0}
    assert on["__fingerprint"] != off["__fingerprint"]
    lower = dict(sweep, benchmark_target_itl_p95_ms=80)
    settings["__benchmark_capacity_method"] = render_tree(
        load("roles/benchmark/vars/main.yml")["__benchmark_capacity_method"], **lower)
    assert task_vars(tsk, benchmark_capacity=True, **settings, **lower)["__fingerprint"] != on["__fingerprint"]
    write = task(VALIDATE, "Write the capacity table and chart on the controller")
    assert not condition(write["when"]) and condition(write["when"], __benchmark_capacity={"result": {}})
