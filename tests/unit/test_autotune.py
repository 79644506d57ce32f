"""The auto-tune's decisions (module_utils/llmtune_autotune.py, library/autotune_sweep.py): which rows it measures in
which order within its budget, the row made from a real benchmark result, the choice and its reason, the report, and
the one mapping from any stored setting to the inference_service variables, checked against that role's own
argument spec."""

import copy
import json
import os

import pytest
import yaml
from conftest import FIXTURES, ROOT, stored_choices

from ansible.module_utils import llmtune_autotune as at

AUTOTUNE = os.path.join(FIXTURES, "autotune")
SERVICE_SPEC = yaml.safe_load(open(os.path.join(ROOT, "roles/inference_service/meta/argument_specs.yml"),
                                   encoding="utf-8"))["argument_specs"]["main"]["options"]
# The 2-vCPU Zen 4 node of the demo: one CPU per physical core, native bf16.
ZEN4_ISA = {"avx2": True, "avx512f": True, "avx512_bf16": True, "avx512_vnni": True, "amx_tile": False,
            "amx_bf16": False, "amx_int8": False}
TOPOLOGY = {"model_name": "AMD EPYC 9R14", "isa": ZEN4_ISA, "usable_cpus": [0, 1],
            "recommended": {"cpus": [0, 1], "threads": 2, "per_node": [{"numa_node": 0, "cpus": [0, 1], "threads": 2}]}}
# The autotune role's quality bounds.
QUALITY_BOUNDS = {"max_kld_mean": 0.05, "max_kld_p99": 0.5, "min_same_top_percent": 85.0, "max_ppl_ratio": 1.05}
# One GGUF type: the order of the sweep's stages; the candidate tests give the role's default types.
OPTIONS = {"engines": ["transformers", "llama_cpp"], "dtypes": ["bfloat16", "float32"], "gguf_types": ["bf16"],
           "allow_quantized": False, "quality_bounds": QUALITY_BOUNDS, "validation_floor": {}, "memory_budget_mb": 0,
           "threads": [], "allocators": ["jemalloc", "tcmalloc"],
           "layouts": ["single", "per_node"], "parallel": [], "min_gain_percent": 5.0, "prompt_tokens": 128,
           "output_tokens": 32, "concurrency": 1, "requests": 2, "max_ttft_p95_ms": 0, "max_tpot_p95_ms": 0,
           "budget_s": 300, "api_key_set": False, "twin": True, "twin_max_gap_percent": 5.0, "twin_max_rounds": 12,
           "settle_timeout": 60.0, "busy_limit": 0.25,
           "capacity": {"enabled": False, "ttft_p95_ms": 2000.0, "itl_p95_ms": 100.0, "prompt_tokens": 128,
                        "output_tokens": 32, "max_concurrency": 64, "min_requests": 20, "time_limit_s": 600.0,
                        "engine_max_gap_percent": 10.0}}


def config(topology=None, **changes):
    return at.sweep_config(dict(OPTIONS, **changes), topology or TOPOLOGY)


def load(name):
    with open(os.path.join(AUTOTUNE, name), encoding="utf-8") as handle:
        return json.load(handle)


# A capacity sweep of the benchmark module against llama-server (a 2-layer Qwen3 on 2 vCPUs): 1 to 8 streams met
# the targets.
CAPACITY_SWEEP = json.load(open(os.path.join(FIXTURES, "capacity", "llama-server-2l-sweep.json"), encoding="utf-8"))
# A whole result of the benchmark module from the demo's node (the untuned baseline, its twin beside it).
RECORDED = load("benchmark-result.json")


def bench(decode, ttft=300.0, noisy=False, other_before=0.0, waited=0.0, twin=True, output_tokens_per_s=None):
    """RECORDED with other figures: DECODE tokens/s and TTFT p50 ms, as the module would report them."""
    result = copy.deepcopy(RECORDED)
    tpot = 1000.0 / decode
    result["summary"].update(decode_tokens_per_s=decode, ttft_ms_p50=ttft, ttft_ms_p95=ttft * 1.2, tpot_ms_p50=tpot,
                             output_tokens_per_s=output_tokens_per_s or round(decode * 0.9, 3),
                             e2e_ms_p50=ttft + 31 * tpot)
    result["levels"][0]["tpot_ms"]["p95"] = tpot * 1.1
    result["noisy"] = noisy
    result["host_load"].update(other_cpus_before=other_before, settle_wait_s=waited)
    if not twin:
        result.pop("twin", None)
    return result


RUNNING = {"engine": "llama_cpp", "parallel": 4, "continuous_batching": None, "layout": "single",
           "instances": [{"unit": "llm-inference.service", "cpus": "0 1"}]}


def measurement(result, setting, deploy="main"):
    running = dict(RUNNING, engine=setting["engine"], layout=setting["layout"],
                   parallel=(setting["parallel"] or 4) if setting["engine"] == "llama_cpp" else None,
                   continuous_batching=setting["continuous_batching"] if setting["engine"] == "transformers" else None)
    return {"result": result, "running": running, "twin": {}, "deploy": deploy, "deploy_s": 12.5, "deployed": True,
            "roofline": {"bandwidth_gb_s": 30.0, "decode_upper_bound_tokens_per_s": 25.0}, "rss_kb": [1200 * 1024]}


def sweep(cfg, speed, seconds_per_row=30.0, busy=lambda setting: False, capacity=lambda setting: CAPACITY_SWEEP):
    """Run a whole sweep with a clock that moves SECONDS_PER_ROW per measured row; SPEED(setting) is its decode
    tokens/s (None: its deploy fails), CAPACITY(setting) the capacity stage's sweep (None: it failed). Returns the
    state and the rows in the order they were planned."""
    clock = [1000.0]
    state = at.new_state(cfg, clock[0])
    planned = []
    while True:
        row = at.next_row(state, clock[0])
        if row is None:
            return state, planned
        planned.append(row)
        clock[0] += seconds_per_row
        if row["stage"] == "capacity":
            taken = capacity(row["setting"])
            at.record(state, {"failure": "The engine failed to start", "deployed": False} if taken is None else
                      {"capacity": {"engine": row["setting"]["engine"], "result": taken, "engine_batched": {}},
                       "deployed": True, "deploy_s": 3.0})
            continue
        decode = speed(row["setting"])
        if decode is None:
            at.record(state, {"failure": "The engine failed to start", "deployed": False})
        else:
            loaded = busy(row["setting"])
            at.record(state, measurement(bench(decode, noisy=loaded, other_before=1.0 if loaded else 0.0,
                                               waited=row["settle_timeout"] if loaded else 0.0), row["setting"],
                                         row["deploy"]))


def label(setting):
    return f"{setting['engine']} {setting['format']}" + ("" if setting["tuned"] else " defaults")


SPEEDS = {("transformers", "bfloat16"): 8.0, ("transformers", "float32"): 5.0, ("transformers", "auto"): 4.0,
          ("llama_cpp", "bf16"): 20.0, ("llama_cpp", "q8_0"): 30.0, ("llama_cpp", "q4_k_m"): 40.0}


def by_stack(setting):
    return SPEEDS[(setting["engine"], setting["format"])] * (1.0 if setting["threads"] in (2, None) else 0.6)


# --- the candidates -------------------------------------------------------------------------------------------

TF32 = ["transformers", "float32"]


# Zen 3 (EPYC 7003, the machine of 2026-12-06): AVX2, no AVX-512, no bf16 arithmetic.
ZEN3_ISA = {"avx2": True, "avx512f": False, "avx512_bf16": False, "avx512_vnni": False, "amx_tile": False,
            "amx_bf16": False, "amx_int8": False}


@pytest.mark.parametrize("isa, allowed, gguf_types, dtypes, stacks, later", [
    # q8_0 is a candidate by default, first: fewer bytes a weight, int8 dot products of the vector unit.
    (ZEN4_ISA, False, ["bf16", "q8_0"], ["bfloat16", "float32"],
     [["transformers", "bfloat16"], ["llama_cpp", "q8_0"], ["llama_cpp", "bf16"]], [TF32]),
    # The types of fewer than 8 bits only when allowed, and then first.
    (ZEN4_ISA, False, ["bf16", "q4_k_m", "q6_k"], ["bfloat16", "float32"],
     [["transformers", "bfloat16"], ["llama_cpp", "bf16"]], [TF32]),
    (ZEN4_ISA, True, ["bf16", "q8_0", "q4_k_m"], ["bfloat16", "float32"],
     [["transformers", "bfloat16"], ["llama_cpp", "q4_k_m"], ["llama_cpp", "q8_0"], ["llama_cpp", "bf16"]], [TF32]),
    (ZEN4_ISA, True, ["q4_k_m"], ["bfloat16", "float32"], [["transformers", "bfloat16"], ["llama_cpp", "q4_k_m"]],
     [TF32]),
    # No bf16 arithmetic (Zen 3): torch's float32 first, nothing left for later.
    (ZEN3_ISA, False, ["bf16"], ["bfloat16", "float32"],
     [TF32, ["transformers", "bfloat16"], ["llama_cpp", "bf16"]], []),
    (ZEN4_ISA, False, ["bf16"], ["float32"], [["llama_cpp", "bf16"]], [TF32]),
    # Only float32 allowed: it is not left for later.
    (ZEN4_ISA, False, [], ["float32"], [TF32], []),
])
def test_candidates_in_the_cpus_order_with_low_bit_types_only_when_allowed(isa, allowed, gguf_types, dtypes, stacks,
                                                                            later):
    topology = dict(TOPOLOGY, isa=isa)
    assert at.candidate_stacks(config(topology, allow_quantized=allowed, dtypes=dtypes, gguf_types=gguf_types)) == \
        (stacks, later)


@pytest.mark.parametrize("concurrency, parallel, slots", [
    (1, [], [1]), (4, [], [1, 2, 4]), (6, [], [1, 2, 4]), (4, [3, 3, 8], [3, 8]),
])
def test_slot_candidates(concurrency, parallel, slots):
    assert at.slot_candidates(config(concurrency=concurrency, parallel=parallel)) == slots


def test_thread_candidates_leave_out_the_recommendation_and_more_than_the_cpus():
    # 8 cores x 2 SMT siblings: 4 (half) and 16 (every CPU); 8 was measured with the stacks.
    big = dict(TOPOLOGY, usable_cpus=list(range(16)), recommended={"cpus": list(range(8)), "threads": 8, "per_node": []})
    assert at.thread_candidates(config(big), 8) == [4, 16]
    assert at.thread_candidates(config(big, threads=[8, 2, 32]), 8) == [2]
    # After first rows that ran 4 threads on a busy host: the recommendation too.
    assert at.thread_candidates(config(big), 4) == [16, 8]
    # The SMT siblings come after the physical cores.
    assert at.cpu_order(config(dict(big, recommended={"cpus": [0, 2, 4, 6, 8, 10, 12, 14], "threads": 8})))[:10] == \
        [0, 2, 4, 6, 8, 10, 12, 14, 1, 3]


def test_no_candidate_is_refused_before_any_row():
    with pytest.raises(at.SweepError, match="no candidate stack"):
        at.new_state(config(engines=["llama_cpp"], gguf_types=["q4_k_m"]), 0.0)


# --- the order within the budget (issue 40) --------------------------------------------------------------------

def test_every_engine_is_measured_before_any_variation():
    state, planned = sweep(config(budget_s=10_000), by_stack)
    order = [(row["stage"], label(row["setting"])) for row in planned]
    assert order[:3] == [("first", "transformers bfloat16"), ("first", "llama_cpp bf16"),
                         ("reference", "transformers auto defaults")]
    stages = [stage for stage, _ in order]
    # No stack measured twice; variations only after every stack; float32 last where bf16 is native.
    assert stages == ["first", "first", "reference", "threads", "allocator", "allocator", "float32"]
    assert state["chosen"]["engine"] == "llama_cpp" and state["chosen"]["format"] == "bf16"
    assert [step["stage"] for step in state["steps"]] == ["stack", "threads", "allocator", "batching", "float32"]


def test_a_budget_that_ends_after_the_first_rows_still_measured_every_engine():
    # The demo's failure (issue 40): two rows fit in 300 s and llama.cpp was never measured. Each row now takes 140 s:
    # the first rows of both engines and the reference start within the budget, the rest is skipped, and the faster
    # engine serves.
    state, planned = sweep(config(budget_s=300), by_stack, seconds_per_row=140.0)
    assert [label(row["setting"]) for row in planned] == ["transformers bfloat16", "llama_cpp bf16",
                                                          "transformers auto defaults"]
    result = at.result_of(state, 2000.0, "now", {})
    assert result["chosen"]["engine"] == "llama_cpp"
    assert [row["status"] for row in result["rows"]][:3] == ["measured"] * 3
    assert {row["status"] for row in result["rows"][3:]} == {at.SKIPPED}
    assert result["unmeasured_engines"] == []


def test_each_engines_first_row_is_measured_past_the_budget():
    # The busy demo: another process kept a CPU busy and transformers' first row alone took 539 s of a 300 s budget.
    # llama.cpp's first row is still measured (with no twin round added past the budget); what follows is skipped.
    state, planned = sweep(config(budget_s=300), by_stack, seconds_per_row=540.0)
    assert [(row["stage"], label(row["setting"])) for row in planned] == [("first", "transformers bfloat16"),
                                                                          ("first", "llama_cpp bf16")]
    assert planned[1]["twin_deadline"] == 1540.0
    result = at.result_of(state, 2080.0, "now", {})
    assert (result["chosen"]["engine"], result["unmeasured_engines"]) == ("llama_cpp", [])
    assert [row["status"] for row in result["rows"] if row["stage"] == "reference"] == [at.SKIPPED]


def test_the_report_names_an_engine_never_measured_and_why():
    # An engine whose only row failed.
    state, _ = sweep(config(budget_s=10_000), lambda s: None if s["engine"] == "llama_cpp" else by_stack(s))
    result = at.result_of(state, 2000.0, "now", {})
    assert result["unmeasured_engines"] == [{"engine": "llama_cpp", "why": "failed: The engine failed to start"}]
    assert "Never measured: llama_cpp (failed: The engine failed to start)." in \
        at.report_markdown(result, "node", "EPYC", {})


def test_the_first_rows_share_what_is_left_of_the_budget():
    cfg = config(budget_s=300)
    state = at.new_state(cfg, 0.0)
    first = at.next_row(state, 0.0)
    # Two first rows and the reference share 300 s.
    assert (first["stage"], first["twin_deadline"]) == ("first", 100.0)
    at.record(state, measurement(bench(8.0), first["setting"]))
    second = at.next_row(state, 90.0)
    assert (second["stage"], second["twin_deadline"]) == ("first", 195.0)
    at.record(state, measurement(bench(20.0), second["setting"]))
    reference = at.next_row(state, 200.0)
    assert (reference["stage"], reference["twin_deadline"]) == ("reference", 300.0)
    at.record(state, measurement(bench(4.0), reference["setting"]))
    # Later rows may use all that is left.
    later = at.next_row(state, 250.0)
    assert later["twin_deadline"] == 300.0


def test_rows_of_the_deployed_engine_and_file_change_the_unit_alone():
    state, planned = sweep(config(budget_s=10_000), by_stack)
    deploys = [(label(row["setting"]), row["setting"]["threads"], row["deploy"]) for row in planned]
    assert deploys[:3] == [("transformers bfloat16", 2, "main"), ("llama_cpp bf16", 2, "main"),
                           ("transformers auto defaults", None, "main")]
    # The threads stage on llama.cpp bf16 after transformers: main; the allocators after it: the unit.
    assert deploys[3:6] == [("llama_cpp bf16", 1, "main"), ("llama_cpp bf16", 2, "unit"), ("llama_cpp bf16", 2, "unit")]


def test_a_failed_deploy_makes_the_next_row_deploy_in_full():
    cfg = config(budget_s=10_000)
    state = at.new_state(cfg, 0.0)
    row = at.next_row(state, 0.0)
    at.record(state, {"failure": "copy failed", "deployed": False})
    assert state["rows"][-1]["status"] == "failed: copy failed"
    assert at.next_row(state, 1.0)["deploy"] == "main"


# --- load from other processes -----------------------------------------------------------------------------------

def test_a_disturbed_row_is_measured_once_more_and_the_quiet_one_kept():
    state = at.new_state(config(budget_s=10_000), 0.0)
    row = at.next_row(state, 0.0)
    assert at.record(state, measurement(bench(8.0, noisy=True, other_before=0.1), row["setting"])) is None
    again = at.next_row(state, 30.0)
    assert (again["setting"], again["retry"], again["deploy"]) == (row["setting"], True, "unit")
    kept = at.record(state, measurement(bench(9.0), again["setting"], "unit"))
    assert (kept["decode_tokens_per_s"], kept["noisy"], kept["attempts"]) == (9.0, False, 2)


def test_a_host_that_stays_busy_is_measured_under_load_and_served_anyway():
    # stress-ng --cpu 1 for the whole run: every wait times out, every row is noisy.
    state, planned = sweep(config(budget_s=10_000), by_stack, busy=lambda setting: True)
    # The first row waited the whole settle time; the rows after it wait 10 s and are not measured twice.
    assert [row["settle_timeout"] for row in planned[:3]] == [60.0, 10.0, 10.0]
    assert not any(row["retry"] for row in planned)
    result = at.result_of(state, 5000.0, "now", {})
    assert result["chosen"]["engine"] == "llama_cpp"
    assert result["reason"].endswith("all measured under load (other processes kept CPUs busy during every row)")
    assert result["measured_under_load"] == len([r for r in result["rows"] if r["status"] == "measured"])
    report = at.report_markdown(result, "node", "EPYC", {})
    assert "; chosen among them, as every row was." in report
    assert "(under load)" in report


def test_first_rows_run_on_the_cpus_a_busy_host_leaves_free():
    # The busy demo (stress-ng --cpu 1 on 2 CPUs): transformers bf16 at 2 threads decoded at 0.495 tokens/s and
    # llama.cpp bf16 at 2 threads at 0.53, a sixtieth of their speed on the quiet host.
    state, planned = sweep(config(budget_s=300), by_stack, seconds_per_row=480.0, busy=lambda setting: True)
    assert [(row["stage"], label(row["setting"]), row["setting"]["threads"], row["setting"]["cpus"])
            for row in planned] == [("first", "transformers bfloat16", 2, "0 1"),
                                    ("first", "transformers bfloat16", 1, "0"),
                                    ("first", "llama_cpp bf16", 1, "0")]
    result = at.result_of(state, 3000.0, "now", {})
    assert (result["chosen"]["engine"], result["chosen"]["threads"]) == ("llama_cpp", 1)
    # The recommended threads of the chosen stack come in the threads stage (skipped here: the budget is spent).
    assert [(row["stage"], row["threads"], row["status"]) for row in result["rows"] if row["stage"] == "threads"] == \
        [("threads", 2, at.SKIPPED)]
    assert result["notes"] == ["other processes kept 1.0 CPUs busy: the first rows from transformers bfloat16 on run "
                               "at 1 thread(s) on CPUs 0"]
    assert "other processes kept 1.0 CPUs busy" in at.report_markdown(result, "node", "EPYC", {})


FOUR_CPUS = dict(TOPOLOGY, usable_cpus=[0, 1, 2, 3], recommended=dict(TOPOLOGY["recommended"], cpus=[0, 1, 2, 3],
                                                                     threads=4))


@pytest.mark.parametrize("busy, threads", [(0.3, 4), (0.6, 3), (1.0, 3), (1.6, 2), (3.8, 1)])
def test_the_threads_that_fit_the_free_cpus(busy, threads):
    state = at.new_state(config(FOUR_CPUS, budget_s=10_000), 0.0)
    first = at.next_row(state, 0.0)
    at.record(state, measurement(bench(0.5, noisy=True, other_before=busy, waited=first["settle_timeout"]),
                                 first["setting"]))
    following = at.next_row(state, 10.0)
    assert following["setting"]["threads"] == threads
    assert following["setting"]["cpus"] == " ".join(str(cpu) for cpu in range(threads))
    # The fitted row of the same stack, or else the next engine's first row at the CPUs it was planned on.
    assert label(following["setting"]) == ("transformers bfloat16" if threads < 4 else "llama_cpp bf16")


def test_a_first_row_under_load_that_leaves_its_cpus_free_is_not_measured_again():
    # Busy once, then quiet: the host did not stay busy through the wait.
    cfg = config(budget_s=10_000)
    state = at.new_state(cfg, 0.0)
    first = at.next_row(state, 0.0)
    at.record(state, measurement(bench(8.0, noisy=True, other_before=1.0, waited=5.0), first["setting"]))
    at.record(state, measurement(bench(8.0, noisy=True, other_before=1.0, waited=5.0), first["setting"]))
    second = at.next_row(state, 10.0)
    assert (label(second["setting"]), second["setting"]["threads"]) == ("llama_cpp bf16", 2)
    assert state["notes"] == []


def test_rows_under_load_are_not_chosen_over_quiet_ones():
    state, _ = sweep(config(budget_s=10_000), by_stack, busy=lambda s: s["engine"] == "llama_cpp")
    assert state["chosen"]["engine"] == "transformers"
    assert "under load" not in state["reason"]


# --- the choice ---------------------------------------------------------------------------------------------------

CHOICE = config()


def test_the_lowest_score_of_quiet_measured_candidates():
    rows = [{"tuned": False, "status": "measured", "score_ms": 100.0, "noisy": False, "rss_mb": 900},
            {"tuned": True, "status": "measured", "score_ms": 200.0, "noisy": True, "rss_mb": 900},
            {"tuned": True, "status": "measured", "score_ms": 300.0, "noisy": False, "rss_mb": 900},
            {"tuned": True, "status": "measured", "score_ms": 250.0, "noisy": False, "rss_mb": 2000},
            {"tuned": True, "status": "failed: the engine failed to start"}]
    # The reference (engine defaults) and the noisy row never win; without a budget the 2000 MiB row does.
    assert at.choose(rows, None, CHOICE)[0]["score_ms"] == 250.0
    chosen, reason = at.choose(rows, None, dict(CHOICE, memory_budget_mb=1000))
    assert (chosen["score_ms"], reason) == (300.0, "lowest workload score of 1 measured candidates, 1 over the memory budget")


def test_candidates_above_the_latency_bounds_are_left_out():
    row = {"tuned": True, "status": "measured", "noisy": False, "rss_mb": 900}
    rows = [dict(row, score_ms=20.0, ttft_ms_p95=900.0, tpot_ms_p95=40.0),  # most tokens/s, TTFT p95 too long
            dict(row, score_ms=25.0, ttft_ms_p95=300.0, tpot_ms_p95=90.0),  # TPOT p95 too long
            dict(row, score_ms=30.0, ttft_ms_p95=300.0, tpot_ms_p95=None),  # no TPOT figure: cannot show it is within
            dict(row, score_ms=40.0, ttft_ms_p95=300.0, tpot_ms_p95=40.0)]

    def choose(ttft, tpot):
        chosen, reason = at.choose(rows, None, dict(CHOICE, max_ttft_p95_ms=ttft, max_tpot_p95_ms=tpot))
        return chosen["score_ms"], reason

    assert choose(0, 0) == (20.0, "lowest workload score of 4 measured candidates")
    assert choose(500, 0) == (25.0, "lowest workload score of 3 measured candidates, 1 over the latency bounds")
    assert choose(500, 50) == (40.0, "lowest workload score of 1 measured candidates, 3 over the latency bounds")


# The quality gate's figures of the Qwen3-0.6B proxy (tests/fixtures/quality).
Q8_0_FIGURES = {"kld_mean": 0.000202, "kld_p99": 0.00026, "same_top_percent": 92.913, "ppl_ratio": 1.001579}
Q2_K_FIGURES = {"kld_mean": 0.112679, "kld_p99": 0.150168, "same_top_percent": 13.386, "ppl_ratio": 1.014297}


def test_a_quantized_type_beyond_the_quality_bounds_is_measured_and_not_chosen():
    row = {"tuned": True, "status": "measured", "noisy": False, "rss_mb": 900, "engine": "llama_cpp"}
    rows = [dict(row, format="q2_k", gguf_type="q2_k", score_ms=10.0, quality=Q2_K_FIGURES),
            dict(row, format="q4_0", gguf_type="q4_0", score_ms=15.0, quality=None),  # the gate did not run
            dict(row, format="q8_0", gguf_type="q8_0", score_ms=20.0, quality=Q8_0_FIGURES),
            dict(row, format="bf16", gguf_type="bf16", score_ms=30.0)]
    chosen, reason = at.choose(rows, None, CHOICE)
    assert (chosen["format"], reason) == ("q8_0", "lowest workload score of 2 measured candidates, 2 refused by the "
                                                  "quality gate")
    assert at.quality_refusal(rows[0], CHOICE) == "mean KLD 0.112679 > 0.05; same top token 13.386 % < 85 %"
    assert at.quality_refusal(rows[1], CHOICE) == "no quality figures"
    assert at.quality_refusal(rows[3], CHOICE) == ""
    result = {"rows": [dict(r, tuned=True) for r in rows], "inputs": {"allowed": {"quality_bounds": QUALITY_BOUNDS}}}
    assert at._quality_lines(result) == [
        "Quality gate, q2_k: mean KLD 0.112679, 99 % KLD 0.150168, same top token 13.386 %, PPL ratio 1.014297 against "
        "bf16 (llama-perplexity, ? tokens scored): refused, mean KLD 0.112679 > 0.05; same top token 13.386 % < 85 % "
        "(measured, not chosen).",
        "Quality gate, q4_0: not measured: refused, no quality figures (measured, not chosen).",
        "Quality gate, q8_0: mean KLD 0.000202, 99 % KLD 0.00026, same top token 92.913 %, PPL ratio 1.001579 against "
        "bf16 (llama-perplexity, ? tokens scored): within the bounds."]


FLOOR = {"decode_tokens_per_s": 0.85, "ttft_ms_p50": 0.85, "ttft_ms_p95": 0.8, "e2e_ms_p50": 0.85}


def test_a_row_the_validation_would_fail_is_left_out_while_another_passes():
    """The validation's floor (benchmark_fail_below) against the engine defaults' row: a stack that decodes faster
    but takes longer to its first token, and whose workload score is not beyond the end-to-end floor's margin better
    (6000 ms against 6900 x 0.85 = 5865)."""
    base = {"tuned": True, "status": "measured", "noisy": False, "rss_mb": 900}
    reference = dict(base, tuned=False, ttft_ms_p50=607.0, ttft_ms_p95=650.0, decode_tokens_per_s=4.9, score_ms=6900.0)
    slow_start = dict(base, score_ms=6000.0, ttft_ms_p50=1479.0, ttft_ms_p95=1520.0, decode_tokens_per_s=11.0)
    passes = dict(base, score_ms=6100.0, ttft_ms_p50=560.0, ttft_ms_p95=600.0, decode_tokens_per_s=7.0)
    cfg = dict(CHOICE, validation_floor=FLOOR)
    assert at.below_floor(slow_start, reference, cfg) == ["ttft_ms_p50 0.41 < 0.85", "ttft_ms_p95 0.428 < 0.8"]
    chosen, reason = at.choose([reference, slow_start, passes], None, cfg)
    assert (chosen, reason) == (passes, "lowest workload score of 1 measured candidates, 1 below the validation's "
                                        "floor against the engine defaults")
    # Every row below it: the choice stands among them (the validation then says which figure fails).
    assert at.choose([reference, slow_start], None, cfg)[0] == slow_start
    # No engine defaults measured: nothing to judge by.
    assert at.choose([slow_start, passes], None, cfg)[0] == slow_start


def test_a_later_first_token_is_chosen_where_the_whole_workload_is_faster_and_said():
    """The demo's sweep on a 2-vCPU Zen 4 (AMD EPYC family 25 model 17), 128-token prompts and 32 output tokens: the
    floor left out both llama.cpp rows for their first token (737 and 650 ms against transformers' 488) and served
    transformers bf16 at a quarter of their decode speed, with no stream within the capacity targets."""
    base = {"tuned": True, "status": "measured", "noisy": False, "rss_mb": 1800}
    reference = dict(base, tuned=False, engine="transformers", ttft_ms_p50=488.356, ttft_ms_p95=500.79,
                     decode_tokens_per_s=8.491, score_ms=4151.0)
    q8_0 = dict(base, engine="llama_cpp", format="q8_0", gguf_type="q8_0", quality=Q8_0_FIGURES, score_ms=1655.1,
                ttft_ms_p50=737.31, ttft_ms_p95=767.719, decode_tokens_per_s=33.79)
    bf16 = dict(base, engine="llama_cpp", format="bf16", gguf_type="bf16", score_ms=1754.4, ttft_ms_p50=649.976,
                ttft_ms_p95=655.201, decode_tokens_per_s=28.103)
    transformers = dict(base, engine="transformers", score_ms=4133.8, ttft_ms_p50=520.595, ttft_ms_p95=558.918,
                        decode_tokens_per_s=8.64)
    cfg = dict(CHOICE, validation_floor=FLOOR)
    assert at.later_start_only(q8_0, reference, cfg) and at.later_start_only(bf16, reference, cfg)
    chosen, reason = at.choose([reference, q8_0, bf16, transformers], None, cfg)
    assert chosen == q8_0
    assert reason == ("lowest workload score of 3 measured candidates; its first token later than the engine "
                      "defaults' (ttft_ms_p50 0.662 < 0.85, ttft_ms_p95 0.652 < 0.8), its workload score 1655.1 ms "
                      "against their 4151.0")
    # A slower decode is a regression whatever the score: still left out.
    slow_decode = dict(q8_0, decode_tokens_per_s=7.0)
    assert not at.later_start_only(slow_decode, reference, cfg)
    assert at.choose([reference, slow_decode, transformers], None, cfg)[0] == transformers
    # Every row below the floor: the choice stands among them, and a slower decode is not called a later first token.
    assert "first token" not in at.choose([reference, slow_decode], None, cfg)[1]


@pytest.mark.parametrize("margin, new_score, kept", [
    (5, 97.0, 100.0),   # 3 % better: within the margin, the setting of the stage before stays
    (5, 94.0, 94.0),    # 6 % better: replaces it
    (0, 99.9, 99.9),    # no margin: the lowest score
    (5, 100.0, 100.0),  # the kept setting is still the best: chosen, and the reason does not say kept
])
def test_the_earlier_setting_is_kept_within_the_margin(margin, new_score, kept):
    row = {"tuned": True, "status": "measured", "noisy": False, "rss_mb": 900}
    earlier = dict(row, score_ms=100.0, allocator="none")
    rows = [earlier] + ([dict(row, score_ms=new_score, allocator="jemalloc")] if new_score != 100.0 else [])
    # The kept row comes back from Ansible as a copy (JSON): compared by value.
    chosen, reason = at.choose(rows, json.loads(json.dumps(earlier)), dict(CHOICE, min_gain_percent=margin))
    assert chosen["score_ms"] == kept
    assert ("kept over" in reason) == (kept == 100.0 and new_score != 100.0)


@pytest.mark.parametrize("concurrency, score", [(1, round(300.0 + 31 * 50.0, 1)), (4, round(1000 / 18.0, 2))])
def test_the_workload_score(concurrency, score):
    summary = {"ttft_ms_p50": 300.0, "tpot_ms_p50": 50.0, "output_tokens_per_s": 18.0}
    assert at.score(summary, dict(CHOICE, concurrency=concurrency)) == score


# --- a row from a real measurement ----------------------------------------------------------------------------

def test_a_row_from_the_recorded_benchmark_result():
    setting = at._setting("llama_cpp", "bf16", CHOICE)
    row = at.measured_row(at.row_of(setting, "first"), measurement(RECORDED, setting), CHOICE)
    summary, level = RECORDED["summary"], RECORDED["levels"][0]
    assert (row["decode_tokens_per_s"], row["ttft_ms_p50"], row["tpot_ms_p95"]) == (
        summary["decode_tokens_per_s"], summary["ttft_ms_p50"], level["tpot_ms"]["p95"])
    assert row["score_ms"] == round(summary["ttft_ms_p50"] + 31 * summary["tpot_ms_p50"], 1)
    gap = RECORDED["twin"]["gap_percent"]
    assert row["twin"]["gap_percent"] == {"decode_tokens_per_s": gap["decode_tokens_per_s"]["median"],
                                          "e2e_ms": gap["e2e_ms"]["median"]}
    assert row["twin"]["score_ms"] == at.score(RECORDED["twin"]["summary"], CHOICE)
    assert (row["rss_mb"], row["gguf_type"], row["dtype"], row["parallel"]) == (1200, "bf16", "auto", 4)
    assert (row["roofline_tokens_per_s"], row["engine_cpus"]) == (25.0, None)


def test_a_row_without_twin_says_why():
    setting = at._setting("transformers", "bfloat16", CHOICE)
    taken = dict(measurement(bench(8.0, twin=False), setting),
                 twin={"skipped": "not enough memory for the twin beside the service"})
    row = at.measured_row(at.row_of(setting, "first"), taken, CHOICE)
    assert row["twin"] == {"skipped": "not enough memory for the twin beside the service"}
    assert (row["gguf_type"], row["dtype"], row["continuous_batching"]) == (None, "bfloat16", False)


def test_the_per_node_row_keeps_each_engines_cpus_and_the_peak_memory_of_all():
    setting = dict(at._setting("llama_cpp", "bf16", CHOICE), layout="per_node")
    taken = measurement(RECORDED, setting)
    taken["running"] = dict(taken["running"], instances=[{"unit": "llm-inference@0.service", "cpus": "0"},
                                                         {"unit": "llm-inference@1.service", "cpus": "1"}])
    taken["rss_kb"] = [600 * 1024, 700 * 1024]
    row = at.measured_row(at.row_of(setting, "layout"), taken, CHOICE)
    assert (row["layout"], row["engine_cpus"], row["rss_mb"]) == ("per_node", ["0", "1"], 1300)


# --- every stored result deploys (issue 40) ---------------------------------------------------------------------

STORED = dict(stored_choices())


@pytest.mark.parametrize("name, setting", stored_choices(), ids=[name for name, _ in stored_choices()])
def test_every_stored_choice_maps_to_variables_the_role_accepts(name, setting):
    variables = at.service_variables(setting, 4)
    assert at.check_service_variables(variables, SERVICE_SPEC) == [], name
    assert at.deploy_errors(setting, SERVICE_SPEC) == []
    # Nothing of the setting is lost on the way.
    assert variables["inference_service_engine"] == setting.get("engine", "transformers")
    assert variables["inference_service_threads"] == setting["threads"]
    if variables["inference_service_engine"] == "llama_cpp":
        assert (variables["inference_service_gguf_type"], variables["inference_service_dtype"]) == (setting["gguf_type"], "auto")
        assert variables["inference_service_parallel"] == (setting.get("parallel") or 4)
    else:
        assert variables["inference_service_dtype"] == setting["dtype"]


def test_the_issue_input_a_transformers_winner_deploys():
    # The demo's stored choice; "value of inference_service_gguf_type must be one of: ..., got: " came from its
    # gguf_type null, which default('bf16') kept.
    variables = at.service_variables(load("autotune-demo.json")["chosen"], 4, 4096)
    assert variables == {"inference_service_tuned": True, "inference_service_engine": "transformers",
                         "inference_service_dtype": "bfloat16", "inference_service_gguf_type": "bf16",
                         "inference_service_threads": 2, "inference_service_cpu_affinity": "0 1",
                         "inference_service_allocator": "none", "inference_service_parallel": 4,
                         "inference_service_max_concurrent": 4, "inference_service_context_tokens": 4096,
                         "inference_service_continuous_batching": False, "inference_service_layout": "single"}


def test_a_choice_that_would_not_deploy_is_named():
    errors = at.deploy_errors(dict(STORED["llama.cpp with slots"], gguf_type="q3_k"), SERVICE_SPEC)
    assert errors == ["value of inference_service_gguf_type must be one of: f32, f16, bf16, q8_0, q6_k, q5_k_m, q4_k_m, "
                      "q4_0, got: q3_k"]
    assert at.deploy_errors(None, SERVICE_SPEC) == ["no chosen setting"]


def test_every_row_the_sweep_can_plan_maps_to_variables_the_role_accepts():
    cfg = config(budget_s=10_000, allow_quantized=True, concurrency=4, api_key_set=True,
                 gguf_types=["bf16", "q8_0", "q4_k_m"], dtypes=["bfloat16", "float32"])
    # Two NUMA nodes and a key: the layout stage too. Either engine winning: its own batching stage.
    for engine_speed in (by_stack, lambda s: 50.0 if s["engine"] == "transformers" else 10.0):
        _, planned = sweep(dict(cfg, nodes=2), engine_speed)
        for row in planned:
            assert at.check_service_variables(at.service_variables(row["setting"], 4), SERVICE_SPEC) == [], row
        stages = {row["stage"] for row in planned}
        assert {"batching", "layout"} <= stages


# --- a stored result holds while its inputs do --------------------------------------------------------------------

def test_inputs_that_changed_are_named():
    cfg = config()
    inputs = at.inputs_of(cfg, TOPOLOGY, {"model": {"model": "m"}, "engines": {"llama_cpp": ["0.3.36"]}})
    assert at.changed_inputs(inputs, {"inputs": json.loads(json.dumps(inputs))}) == []
    # Written by another Python: other key order.
    reordered = {"inputs": {key: inputs[key] for key in reversed(list(inputs))}}
    assert at.changed_inputs(inputs, reordered) == []
    other = at.inputs_of(config(concurrency=4), TOPOLOGY, {"model": {"model": "m"}, "engines": {}})
    assert at.changed_inputs(other, {"inputs": inputs}) == ["engines", "allowed", "workload"][1:] + [] or True
    assert at.changed_inputs(other, {"inputs": inputs}) == ["engines", "workload"]
    # Stored before the inputs were recorded, or by an earlier sweep method.
    assert at.changed_inputs(inputs, {"chosen": {}}) == list(inputs)
    assert "method" in at.changed_inputs(inputs, {"inputs": dict(inputs, method=1)})


# --- the report ---------------------------------------------------------------------------------------------------

def test_the_report_shows_the_share_of_each_stage():
    ref = {"tuned": False, "engine": "transformers", "format": "auto", "threads": None, "cpus": "", "allocator": "none",
           "parallel": None, "continuous_batching": False, "status": "measured", "score_ms": 6000.0,
           "decode_tokens_per_s": 5.0, "ttft_ms_p50": 1000.0, "tpot_ms_p50": 160.0, "prompt_tokens_mean": 138.0}
    step = {"engine": "llama_cpp", "format": "bf16", "threads": 2, "cpus": "0 1", "allocator": "none",
            "parallel": 1, "continuous_batching": None}
    steps = [dict(step, stage="stack", score_ms=4000.0, decode_tokens_per_s=11.0),
             dict(step, stage="threads", score_ms=4000.0, decode_tokens_per_s=11.0),
             dict(step, stage="allocator", allocator="jemalloc", score_ms=3000.0, decode_tokens_per_s=13.0)]
    chosen = dict(steps[-1], tuned=True, status="measured", ttft_ms_p50=900.0, roofline_percent=70.0,
                  roofline_tokens_per_s=18.0, bandwidth_gb_s=20.0, rss_mb=1500, output_tokens_per_s=13.0)
    result = {"chosen": chosen, "reference": ref, "rows": [ref, chosen], "steps": steps, "reason": "lowest",
              "workload": {"prompt_tokens": 128, "output_tokens": 32, "concurrency": 1},
              "limits": {"engines": ["transformers", "llama_cpp"]}, "score": "ms", "time_budget_s": 1800,
              "elapsed_s": 400, "finished": "now"}
    text = at.report_markdown(result, "node", "AMD EPYC", {"decode_tokens_per_s": 4.0, "prompt_tokens_mean": 19.0})
    table = [line for line in text.splitlines() if line.startswith("| ") and line.split("|")[4].strip()[:2] in
             ("x0", "x1", "x2")]
    assert [line.split("|")[4].strip() for line in table] == ["x1.25 (decode)", "x1.5", "x1.0", "x1.33"]
    assert table[0].split("|")[5].strip() == "4.0 → 5.0"
    # Decode slows with the context: the OS row names both prompt lengths.
    assert "prompts of 19.0 tokens on the untuned OS, these rows 138.0" in table[0]
    assert "allocator jemalloc" in table[-1]
    assert "Gain over the engine defaults (same workload, same OS): score 6000.0 → 3000.0 ms (x2.0)" in text


def test_the_report_names_the_gap_to_each_rows_twin():
    row = {"tuned": True, "engine": "llama_cpp", "format": "bf16", "threads": 2, "cpus": "0 1", "allocator": "none",
           "parallel": 1, "continuous_batching": None, "status": "measured", "score_ms": 2000.0,
           "decode_tokens_per_s": 20.0, "ttft_ms_p50": 600.0, "roofline_percent": 70.0, "roofline_tokens_per_s": 28.0,
           "bandwidth_gb_s": 30.0, "rss_mb": 3000, "output_tokens_per_s": 15.0}

    def twin(decode, gap, e2e, low, high, verdict, rounds=2):
        return {"decode_tokens_per_s": decode, "gap_percent": {"decode_tokens_per_s": gap, "e2e_ms": e2e},
                "rounds": {"rounds": rounds, "planned_rounds": 2,
                           "decode_tokens_per_s": {"median": gap, "min": low, "max": high}},
                "verdict": verdict}

    within = dict(row, twin=twin(20.3, 1.5, -0.4, -2.0, 5.0, "within"))
    over = dict(row, allocator="tcmalloc", twin=twin(22.0, 9.1, 8.2, 6.1, 12.1, "over", rounds=8))
    unresolved = dict(row, threads=1, twin=twin(24.1, 8.2, 9.6, -1.0, 17.4, "unresolved"))
    alone = dict(row, allocator="jemalloc", twin={"skipped": "not enough memory for the twin beside the service"})
    result = {"chosen": within, "rows": [within, over, unresolved, alone], "steps": [], "reason": "lowest",
              "direct_max_gap_percent": 5.0, "workload": {"prompt_tokens": 128, "output_tokens": 32, "concurrency": 1},
              "limits": {"engines": ["llama_cpp"]}, "score": "ms", "time_budget_s": 1800, "elapsed_s": 400,
              "finished": "now", "inputs": {"twin": {"max_rounds": 8}}}
    text = at.report_markdown(result, "node", "AMD EPYC", {})
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| ") and " bf16 " in line]
    # The last cell names the kernels: these rows were stored without, and llama.cpp bf16 has no fast one on this CPU.
    assert [(cells[-3], cells[-2], cells[-1]) for cells in rows] == [
        ("20.3", "1.5 / -0.4", "- |"),
        ("22.0", "**9.1 / 8.2 (over 5.0 % in every round: the unit costs speed)** (8 rounds)", "- |"),
        ("24.1", "8.2 / 9.6 (not resolved: rounds -1.0 to 17.4)", "- |"), ("-", "no twin", "- |")]
    assert "over 5.0 % in every round on 1 row(s), marked in bold; beyond 5.0 % on 1 row(s)" in text
    assert ("No twin for llama_cpp bf16 (2 threads, allocator jemalloc): not enough memory for the twin beside the "
            "service.") in text


def test_the_report_checks_the_layout_with_the_twins():
    base = {"tuned": True, "engine": "llama_cpp", "format": "bf16", "threads": 1, "cpus": "0", "allocator": "none",
            "parallel": 4, "continuous_batching": None, "status": "measured", "decode_tokens_per_s": 90.0,
            "ttft_ms_p50": 50.0, "rss_mb": 300}
    one = dict(base, layout="single", score_ms=10.6, twin={"score_ms": 10.13})
    per_node = dict(base, layout="per_node", engine_cpus=["0", "1"], score_ms=13.35, twin={"score_ms": 13.59})
    result = {"chosen": one, "rows": [one, per_node], "steps": [], "reason": "lowest", "direct_max_gap_percent": 5.0,
              "workload": {"prompt_tokens": 16, "output_tokens": 8, "concurrency": 2}, "limits": {}, "score": "ms",
              "time_budget_s": 1800, "elapsed_s": 90, "finished": "now"}
    assert ("Layout checked by the direct-run twins: one engine scored 10.6 ms (its twin 10.13 ms), one engine per "
            "NUMA node 13.35 ms (their twins 13.59 ms): the twins rank the layouts as the services did.") in \
        at.report_markdown(result, "node", "", {})


def test_the_chosen_per_node_row_alone_is_marked():
    row = {"tuned": True, "engine": "llama_cpp", "format": "bf16", "threads": 1, "cpus": "0", "allocator": "none",
           "parallel": 4, "continuous_batching": None, "status": "measured", "decode_tokens_per_s": 20.0,
           "ttft_ms_p50": 600.0, "roofline_percent": 70.0, "roofline_tokens_per_s": 28.0, "bandwidth_gb_s": 30.0}
    single = dict(row, layout="single", score_ms=40.0, rss_mb=300, output_tokens_per_s=25.0,
                  twin={"skipped": "benchmark_direct_twin is false"})
    per_node = dict(row, layout="per_node", engine_cpus=["0", "1"], score_ms=22.0, rss_mb=600, output_tokens_per_s=45.0,
                    twin={"skipped": "not enough memory for the twin beside the service"})
    result = {"chosen": per_node, "reference": dict(single, tuned=False), "rows": [single, per_node],
              "steps": [dict(single, stage="stack"), dict(per_node, stage="layout")], "reason": "lowest",
              "workload": {"prompt_tokens": 16, "output_tokens": 8, "concurrency": 2},
              "limits": {"engines": ["llama_cpp"]}, "score": "ms", "time_budget_s": 900, "elapsed_s": 60,
              "finished": "now"}
    lines = at.report_markdown(result, "node", "QEMU", {}).splitlines()
    rows = [line.split("|") for line in lines if line.startswith("| ") and " bf16 " in line and "slots" in line]
    assert [(cells[1].strip(), cells[9].strip()) for cells in rows] == [
        ("candidate", "one engine"), ("**chosen**", "one engine per NUMA node, CPUs 0 / 1")]
    assert any(line.startswith("Chosen (lowest): llama_cpp bf16, one engine per NUMA node, CPUs 0 / 1,") for line in lines)
    assert any(line.startswith("| layout: one engine per NUMA node | llama_cpp bf16, one engine per NUMA node, CPUs 0 / 1")
               for line in lines)
    assert not any(line.startswith("Layout checked") for line in lines)


# --- the module: a stored result, written only when it deploys, set aside when its deploy failed ----------------

import autotune_sweep  # noqa: E402  (library/, on the path from conftest)

SERVICE_INPUTS = {"model": {"model": "/cache/models/qwen3-0.6b-proxy", "model_files_sha1": "ab"},
                  "engines": {"llama_cpp": ["0.3.36"]}}


def module_params(tmp_path, **changes):
    params = {"state_path": str(tmp_path / "autotune.json"), "baseline_path": str(tmp_path / "baseline.json"),
              "remeasure": False, "config": dict(OPTIONS), "topology": TOPOLOGY, "service_inputs": SERVICE_INPUTS,
              "service_argument_spec": SERVICE_SPEC, "host": "node", "cpu_model": "AMD EPYC 9R14", "reason": ""}
    params.update(changes)
    return params


def finished_sweep(params, speed=by_stack):
    started = autotune_sweep.start(params)
    state = started["state"]
    while (row := at.next_row(state, 0.0)) is not None:
        decode = speed(row["setting"])
        at.record(state, {"failure": "The engine failed to start", "deployed": False} if decode is None
                  else measurement(bench(decode), row["setting"], row["deploy"]))
    return started, autotune_sweep.finish(dict(params, state=state))


def test_a_result_is_stored_and_kept_while_its_inputs_hold(tmp_path):
    (tmp_path / "baseline.json").write_text(json.dumps(RECORDED))
    params = module_params(tmp_path)
    started, (out, failure) = finished_sweep(params)
    assert (started["holds"], started["message"], failure) == (False, "autotune: measuring, no stored result", None)
    stored = json.loads((tmp_path / "autotune.json").read_text())
    assert stored["chosen"]["engine"] == "llama_cpp" and stored["version"] == at.RESULT_VERSION
    # The report quotes the untuned baseline stored beside it.
    assert f"decode {RECORDED['summary']['decode_tokens_per_s']} → 20.0 tokens/s" in out["report"]
    again = autotune_sweep.start(params)
    assert again["holds"] and again["result"] == stored and "the stored result holds" in again["message"]
    moved = autotune_sweep.start(module_params(tmp_path, config=dict(OPTIONS, concurrency=2)))
    assert (moved["holds"], moved["message"]) == (False, "autotune: measuring, changed since the stored result: workload")
    assert not autotune_sweep.start(dict(params, remeasure=True))["holds"]


def test_a_stored_choice_that_would_not_deploy_is_measured_again(tmp_path):
    params = module_params(tmp_path)
    finished_sweep(params)
    stored = json.loads((tmp_path / "autotune.json").read_text())
    stored["chosen"]["gguf_type"] = "q3_k"
    (tmp_path / "autotune.json").write_text(json.dumps(stored))
    started = autotune_sweep.start(params)
    assert not started["holds"]
    assert started["message"].startswith("autotune: measuring, the stored choice would not deploy: value of "
                                         "inference_service_gguf_type must be one of")


def test_nothing_is_stored_when_nothing_could_be_chosen(tmp_path):
    params = module_params(tmp_path)
    _, (out, failure) = finished_sweep(params, speed=lambda setting: None)
    assert failure.startswith("autotune: no candidate was measured within the limits (failed: The engine failed")
    assert failure.endswith(f"nothing stored at {tmp_path / 'autotune.json'}")
    assert not (tmp_path / "autotune.json").exists()
    assert "No candidate was measured within the limits." in out["report"]


def test_a_result_whose_deploy_failed_is_set_aside(tmp_path):
    params = module_params(tmp_path)
    finished_sweep(params)
    before = json.loads((tmp_path / "autotune.json").read_text())
    assert autotune_sweep.discard(dict(params, reason="Deploy it: the engine failed to start")) == {"changed": True}
    assert not (tmp_path / "autotune.json").exists()
    aside = json.loads((tmp_path / "autotune.json.failed").read_text())
    assert aside.pop("discarded")["reason"] == "Deploy it: the engine failed to start" and aside == before
    assert autotune_sweep.start(params)["message"] == "autotune: measuring, no stored result"
    assert autotune_sweep.discard(params) == {"changed": False}


def test_peak_resident_memory_of_a_real_process():
    own = autotune_sweep.peak_rss_kb([os.getpid(), 2 ** 22 + 1])
    assert own[0] > 10_000 and own[1] == 0


# --- the capacity stage: slots and nginx's limit from the capacity at the targets (issue 37, item 3) --------------

def capacity_config(**changes):
    return config(capacity=dict(OPTIONS["capacity"], enabled=True), **changes)


def sweep_with(streams, goodput=73.532):
    """CAPACITY_SWEEP as if STREAMS streams had been its capacity, with GOODPUT tokens/s there."""
    taken = copy.deepcopy(CAPACITY_SWEEP)
    taken["capacity"].update(concurrency=streams, goodput_tokens_per_s=goodput)
    return taken


def transformers_first(setting):
    """Decode tokens/s where transformers scores better for one request in flight."""
    return 50.0 if setting["engine"] == "transformers" else 10.0


@pytest.mark.parametrize("budget", [0, 10_000])
def test_the_capacity_stage_sweeps_the_chosen_setting_last_even_past_the_budget(budget):
    state, planned = sweep(capacity_config(budget_s=budget), by_stack)
    last = planned[-1]
    assert [row["stage"] for row in planned].count("capacity") == 1 and last["stage"] == "capacity"
    chosen = at.setting_of(state["chosen"])
    # llama.cpp: a slot for each stream of the sweep's top level, each with the sweep's context, not the operator's.
    assert last["setting"] == dict(chosen, parallel=64, context_tokens=256)
    # The unit alone where the row before ran the same engine and model file.
    before = planned[-2]["setting"]
    same = (before["engine"], before["format"]) == (chosen["engine"], chosen["format"])
    assert last["deploy"] == ("unit" if same else "main")


def test_a_transformers_choice_is_swept_as_it_is():
    state, planned = sweep(capacity_config(engines=["transformers"]), by_stack)
    assert planned[-1]["stage"] == "capacity" and planned[-1]["setting"] == at.setting_of(state["chosen"])
    result = at.result_of(state, 2000.0, "now", {})
    assert result["capacity"]["serve"] == {"admitted": 8}
    variables = at.service_variables(at.served_setting(result), 4, 4096)
    assert (variables["inference_service_max_concurrent"], variables["inference_service_parallel"]) == (8, 8)


@pytest.mark.parametrize("prompt, output, context", [(128, 32, 256), (16, 8, 256), (1024, 256, 1792), (200, 5, 512)])
def test_each_slot_of_the_sweep_holds_its_prompt_and_output_with_a_quarter_more(prompt, output, context):
    cfg = capacity_config()
    cfg["capacity"].update(prompt_tokens=prompt, output_tokens=output)
    assert at.sweep_context_tokens(cfg) == context


@pytest.mark.parametrize("streams, served", [(8, 8), (2, 2), (0, 1)])
def test_the_host_is_served_with_a_slot_for_each_stream_that_met_the_targets(streams, served):
    state, _ = sweep(capacity_config(), by_stack, capacity=lambda setting: sweep_with(streams))
    result = at.result_of(state, 2000.0, "now", {})
    assert result["capacity"]["streams"] == streams
    assert result["capacity"]["serve"] == {"admitted": served, "parallel": served}
    # The chosen row stays as measured; the served setting has the capacity's slots and the operator's context.
    assert result["chosen"]["parallel"] != 64
    variables = at.service_variables(at.served_setting(result), 4, 4096)
    assert (variables["inference_service_parallel"], variables["inference_service_max_concurrent"],
            variables["inference_service_context_tokens"]) == (served, served, 4096)
    assert at.check_service_variables(variables, SERVICE_SPEC) == []
    # Stored without each request's samples.
    assert all("samples" not in level for level in result["capacity"]["sweep"]["levels"])
    text = at.report_markdown(result, "node", "EPYC", {})
    assert f"Served: nginx admits {served} request(s) at once, one more gets 429 with Retry-After" in text
    assert f"llama.cpp decodes them in {served} slot(s)" in text
    assert ("## Capacity of node at the targets: llama_cpp bf16\n\nThe capacity stage swept llama_cpp bf16, 2 threads "
            "on CPUs 0 1 with 64 slots of 256 tokens") in text
    assert ("one stream alone misses the targets, so the host serves one at a time" in text) == (streams == 0)
    # The recorded sweep ran beside other processes.
    assert "measured under load (other processes took CPU time during the sweep), which lowers the capacity" in text


def test_the_workload_beyond_the_capacity_is_named():
    state, _ = sweep(capacity_config(concurrency=4), by_stack, capacity=lambda setting: sweep_with(2))
    text = at.report_markdown(at.result_of(state, 2000.0, "now", {}), "node", "EPYC", {})
    assert "the workload's 4 requests in flight exceed the capacity at the targets" in text


def test_a_failed_or_disabled_capacity_stage_leaves_the_operators_slots_and_limit():
    state, planned = sweep(capacity_config(), by_stack, capacity=lambda setting: None)
    result = at.result_of(state, 2000.0, "now", {})
    assert result["capacity"]["status"].startswith("failed: ") and result["capacity"]["serve"] == {}
    assert at.served_setting(result) == result["chosen"]
    variables = at.service_variables(at.served_setting(result), 4, 4096)
    assert (variables["inference_service_max_concurrent"], variables["inference_service_context_tokens"]) == (4, 4096)
    assert "Capacity: failed: The engine failed to start; the slots and nginx's limit stay the operator's" in \
        at.report_markdown(result, "node", "EPYC", {})
    state, planned = sweep(config(), by_stack)
    result = at.result_of(state, 2000.0, "now", {})
    assert "capacity" not in {row["stage"] for row in planned} and result["capacity"] is None
    assert "not measured (autotune_capacity off)" in at.report_markdown(
        dict(result, inputs={"workload": {"capacity": {"enabled": False}}}), "node", "EPYC", {})


def test_the_capacity_targets_are_inputs_of_the_stored_result():
    before = at.inputs_of(capacity_config(), TOPOLOGY, {"model": {}, "engines": {}})
    cfg = capacity_config()
    cfg["capacity"]["itl_p95_ms"] = 50.0
    assert at.changed_inputs(at.inputs_of(cfg, TOPOLOGY, {"model": {}, "engines": {}}), {"inputs": before}) == \
        ["workload"]


@pytest.mark.parametrize("capacities, winner", [
    # llama.cpp batches 4 streams within the targets, transformers 2: a concurrent workload is served by llama.cpp.
    ({"transformers": (2, 40.0), "llama_cpp": (4, 60.0)}, "llama_cpp"),
    ({"transformers": (4, 40.0), "llama_cpp": (2, 60.0)}, "transformers"),
    # As many streams: more goodput by more than autotune_min_gain_percent, or the score's choice stays.
    ({"transformers": (2, 40.0), "llama_cpp": (2, 60.0)}, "llama_cpp"),
    ({"transformers": (2, 40.0), "llama_cpp": (2, 41.0)}, "transformers"),
    # The chosen engine's sweep failed: the other one's capacity serves.
    ({"transformers": None, "llama_cpp": (1, 20.0)}, "llama_cpp"),
])
def test_a_concurrent_workload_chooses_its_engine_by_capacity(capacities, winner):
    def taken(setting):
        got = capacities[setting["engine"]]
        return None if got is None else sweep_with(*got)

    state, planned = sweep(capacity_config(concurrency=2), transformers_first, capacity=taken)
    swept = [row for row in planned if row["stage"] == "capacity"]
    # The score's choice first, then the other engine's best row.
    assert [row["setting"]["engine"] for row in swept] == ["transformers", "llama_cpp"]
    result = at.result_of(state, 2000.0, "now", {})
    assert result["chosen"]["engine"] == winner and result["capacity"]["engine"] == winner
    assert result["capacity"]["of"] == at.setting_of(result["chosen"])
    assert ("chosen by capacity at the targets" in result["reason"]) == (winner == "llama_cpp")
    assert (result["steps"][-1]["stage"] == "capacity") == (winner == "llama_cpp")
    text = at.report_markdown(result, "node", "EPYC", {})
    for engine, fmt in (("transformers", "bfloat16"), ("llama_cpp", "bf16")):
        assert (f"## Capacity of node at the targets: {engine} {fmt}" if capacities[engine]
                else f"Capacity of {engine} {fmt}: failed: The engine failed to start.") in text
    variables = at.service_variables(at.served_setting(result), 4, 4096)
    assert variables["inference_service_engine"] == winner
    assert variables["inference_service_max_concurrent"] == max(result["capacity"]["streams"], 1)


def test_one_request_in_flight_sweeps_the_chosen_engine_alone():
    state, planned = sweep(capacity_config(concurrency=1), transformers_first,
                           capacity=lambda setting: sweep_with(4 if setting["engine"] == "llama_cpp" else 1))
    assert [row["setting"]["engine"] for row in planned if row["stage"] == "capacity"] == ["transformers"]
    assert state["chosen"]["engine"] == "transformers" and state["capacity"]["streams"] == 1


# --- vLLM's CPU engine ---------------------------------------------------------------------------------------------

def test_vllm_is_measured_at_each_allowed_dtype_with_float32_last():
    cfg = config(engines=["transformers", "llama_cpp", "vllm"])
    assert at.candidate_stacks(cfg) == ([["transformers", "bfloat16"], ["llama_cpp", "bf16"], ["vllm", "bfloat16"]],
                                        [TF32, ["vllm", "float32"]])
    firsts = at.phase_settings("first", {"config": cfg, "chosen": None})
    assert [(s["engine"], s["format"]) for s in firsts] == [("transformers", "bfloat16"), ("llama_cpp", "bf16"),
                                                          ("vllm", "bfloat16")]
    # vLLM first: its reference row is the engine's defaults on the checkpoint's dtype.
    reference = at.phase_settings("reference", {"config": config(engines=["vllm"]), "chosen": None})
    assert [(s["engine"], s["format"], s["tuned"]) for s in reference] == [("vllm", "auto", False)]


def test_a_vllm_setting_serves_its_dtype_and_sequences():
    setting = at.setting_of({"engine": "vllm", "format": "bfloat16", "threads": 2, "cpus": "0 1", "tuned": True,
                             "allocator": "none", "parallel": 8, "continuous_batching": False, "layout": "single"})
    variables = at.service_variables(setting, 4, 4096)
    assert (variables["inference_service_engine"], variables["inference_service_dtype"],
            variables["inference_service_parallel"], variables["inference_service_max_concurrent"]) == \
        ("vllm", "bfloat16", 8, 4)
    assert at.check_service_variables(variables, SERVICE_SPEC) == []
    assert at.row_of(setting, "stack")["gguf_type"] is None


def test_a_concurrent_workload_sweeps_vllms_sequences_and_its_capacity():
    cfg = capacity_config(engines=["vllm"], concurrency=4)
    state, planned = sweep(cfg, lambda setting: 20.0, capacity=lambda setting: sweep_with(8))
    batching = [row["setting"]["parallel"] for row in planned if row["stage"] == "batching"]
    assert batching == [1, 2, 4]
    # The capacity stage runs a sequence for each stream of its top level, each of the sweep's context.
    assert planned[-1]["setting"]["parallel"] == 64 and planned[-1]["setting"]["context_tokens"] == 256
    result = at.result_of(state, 2000.0, "now", {})
    assert result["capacity"]["serve"] == {"admitted": 8, "parallel": 8}
    assert "vLLM decodes them in 8 slot(s), each of the operator's context" in \
        at.report_markdown(result, "node", "EPYC", {})
