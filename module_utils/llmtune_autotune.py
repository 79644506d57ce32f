# -*- coding: utf-8 -*-
"""The auto-tune's decisions, in one place: the candidate stacks, the order the sweep measures them in within its
time budget, a row made from a measurement, the choice after each stage and why, the Markdown report, and the one
mapping from a measured setting to the inference_service role's variables (library/autotune_sweep.py and
library/service_setting.py call these; tests/unit/test_autotune.py tests them on recorded rows).

A setting is a dict of SETTING_KEYS: engine (transformers, llama_cpp or vllm), format (the transformers or vLLM dtype
or the GGUF weight type), threads, cpus, tuned (false: engine defaults, the reference), allocator, parallel (llama.cpp
slots, vLLM's sequences at once),
continuous_batching (transformers) and layout (single, or per_node: one engine per NUMA node). A row is a setting
with its status and figures. The sweep's state is a plain dict that each call takes and returns.

Last, the capacity stage sweeps concurrent streams on the chosen setting (the benchmark's capacity sweep at the
operator's latency targets), and with more than one request in flight on each other engine's best setting too, and
chooses between the engines by it; the host is served with as many llama.cpp or vLLM slots as streams met the
targets, and nginx admits as many requests (served_setting()).
"""

from __future__ import annotations

import json
import math

from ansible.module_utils import llmtune_kernels as kernels
from ansible.module_utils import llmtune_quality as quality
from ansible.module_utils.llmtune_capacity import report_markdown as capacity_markdown
from ansible.module_utils.llmtune_engines import ENGINES

# Stored results carry this; a sweep of another version is measured again (inputs.method).
RESULT_VERSION = 4
SETTING_KEYS = ("engine", "format", "threads", "cpus", "tuned", "allocator", "parallel", "continuous_batching",
                "layout")
# GGUF types of fewer than 8 bits a weight: candidates only with allow_quantized. q8_0 is one by default: the quality
# gate (module_utils/llmtune_quality.py) keeps any quantized type whose figures break the bounds from being chosen.
LOW_BIT = ("q6_k", "q5_k_m", "q4_k_m", "q4_0")
# Engines that serve a fixed number of sequences at once, each with its KV cache (llama.cpp's slots, vLLM's
# max_num_seqs); transformers serve batches only with continuous batching and has no such limit.
SLOT_ENGINES = tuple(name for name, engine in ENGINES.items() if engine.slots)
# Engines that serve a GGUF file, which holds its own weight types.
GGUF_ENGINES = tuple(name for name, engine in ENGINES.items() if engine.weights == "gguf")
FP32 = ("float32", "f32")
# Phases in the order the sweep measures them. Every allowed engine's most promising stack comes first, then the
# reference (engine defaults), then the other stacks, then variations of the best one; float32 stacks come last
# where the CPU computes bf16 natively (twice the bytes per token for the same arithmetic).
PHASES = ("first", "reference", "stack", "threads", "allocator", "batching", "layout", "float32", "capacity")
# The phases after which the setting kept so far is chosen again (the report's share of the gain of each).
CHOICES = ("stack", "threads", "allocator", "batching", "layout", "float32")
# Rows of these phases share what is left of the budget evenly, so that none of them spends it all on added twin
# rounds before the others start.
PRIORITY = ("first", "reference")
# Every allowed engine's first row is measured even once the budget is spent: the budget bounds what comes after the
# comparison of the engines (on a host another process keeps busy, one slow row outlasted a 300 s budget alone).
MANDATORY = ("first",)
# The capacity stage is measured even past the budget too: it sizes the slots and nginx's limit, bounded by its own
# time limit.
CAPACITY = "capacity"
SKIPPED = "skipped (time budget)"
STEP_KEYS = ("engine", "format", "threads", "cpus", "allocator", "parallel", "continuous_batching", "layout",
             "engine_cpus", "score_ms", "ttft_ms_p50", "decode_tokens_per_s", "output_tokens_per_s")
LABELS = {"stack": "stack: engine and format, recommended threads and CPUs", "threads": "threads and CPUs",
          "allocator": "allocator", "batching": "batching", "layout": "layout: one engine per NUMA node",
          "float32": "float32 stacks (measured last where bf16 is native)",
          "capacity": "capacity at the targets (the engine with more streams within them)"}


class SweepError(Exception):
    """A sweep that cannot go on, with the message the task fails with."""


# --- the one mapping from a setting to the service's variables ------------------------------------------------

def service_variables(setting, max_concurrent, context_tokens=0):
    """The inference_service variables that serve SETTING (a row, a stored winner of any version of this project:
    missing keys and nulls take the role's defaults). MAX_CONCURRENT is the operator's
    inference_service_max_concurrent, the requests nginx admits and the slots of a llama.cpp or vLLM setting that names
    neither ("admitted", "parallel"); CONTEXT_TOKENS the operator's inference_service_context_tokens, the context of
    each slot unless the setting names one (the capacity stage's sweep)."""
    engine = setting.get("engine") or "transformers"
    fmt = setting.get("format")
    gguf = engine in GGUF_ENGINES
    return {
        "inference_service_tuned": setting.get("tuned") is not False,
        "inference_service_engine": engine,
        # A GGUF file holds its own types: its dtype is auto, and the other engines ignore the GGUF type.
        "inference_service_dtype": "auto" if gguf else (setting.get("dtype") or fmt or "auto"),
        "inference_service_gguf_type": (setting.get("gguf_type") or fmt or "bf16") if gguf else "bf16",
        "inference_service_threads": int(setting.get("threads") or 0),
        "inference_service_cpu_affinity": setting.get("cpus") or "",
        "inference_service_allocator": setting.get("allocator") or "none",
        "inference_service_parallel": int(setting.get("parallel") or setting.get("admitted") or max_concurrent),
        "inference_service_max_concurrent": int(setting.get("admitted") or max_concurrent),
        "inference_service_context_tokens": int(setting.get("context_tokens") or context_tokens),
        "inference_service_continuous_batching": bool(setting.get("continuous_batching")),
        "inference_service_layout": setting.get("layout") or "single",
    }


def check_service_variables(variables, argument_spec):
    """Error messages of VARIABLES against the inference_service role's ARGUMENT_SPEC (its main entry point's
    options, as the role checks them when it starts); [] when they deploy."""
    from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

    spec = {name: option for name, option in argument_spec.items() if name in variables}
    return list(ArgumentSpecValidator(spec).validate(dict(variables), validate_role_argument_spec=True).error_messages)


def deploy_errors(setting, argument_spec):
    """Why SETTING (a stored or new choice) would not deploy, or []: its variables against ARGUMENT_SPEC (the slots
    of a setting without any are the role's, valid whatever they are)."""
    if not setting:
        return ["no chosen setting"]
    return check_service_variables(service_variables(setting, 1, 1), argument_spec)


def served_setting(result):
    """The setting a stored RESULT serves: its chosen row with the slots and admitted requests its capacity stage
    measured (none when the stage did not run or failed: the operator's variables stand)."""
    chosen = (result or {}).get("chosen")
    if not chosen:
        return None
    return dict(chosen, **((result.get("capacity") or {}).get("serve") or {}))


def served_capacity(result):
    """The capacity stage's sweep of a stored RESULT's served setting in the benchmark role's shape (engine, result,
    engine_batched: what its validation keeps of a sweep of its own), or {} when the stage measured none."""
    record = (result or {}).get("capacity") or {}
    if record.get("status") != "measured":
        return {}
    return {"engine": record["engine"], "result": record["sweep"], "engine_batched": record.get("engine_batched") or {}}


# --- what a sweep depends on ---------------------------------------------------------------------------------------

# The operator's choices a sweep reads (the autotune_* variables and the benchmark's twin and settle settings).
CONFIG_KEYS = ("engines", "dtypes", "gguf_types", "allow_quantized", "quality_bounds", "validation_floor",
               "memory_budget_mb", "threads",
               "allocators", "layouts", "parallel", "min_gain_percent", "prompt_tokens", "output_tokens", "concurrency",
               "requests", "max_ttft_p95_ms", "max_tpot_p95_ms", "budget_s", "api_key_set", "twin",
               "twin_max_gap_percent", "twin_max_rounds", "settle_timeout", "busy_limit", "capacity")
# Seconds to wait for a host that stayed busy through a whole wait before the row before (at most settle_timeout).
BUSY_SETTLE_TIMEOUT = 10


def sweep_config(options, topology):
    """The sweep's config: the operator's OPTIONS (CONFIG_KEYS) and what the host's cpu_topology facts decide."""
    missing = [key for key in CONFIG_KEYS if key not in options]
    if missing:
        raise SweepError("autotune_sweep: config lacks " + ", ".join(missing))
    isa = topology.get("isa") or {}
    rec = topology["recommended"]
    config = {key: options[key] for key in CONFIG_KEYS}
    config.update(native_bf16=bool(isa.get("avx512_bf16") or isa.get("amx_bf16") or isa.get("bf16")), isa=isa,
                  recommended={"threads": int(rec["threads"]), "cpus": list(rec["cpus"])},
                  usable_cpus=list(topology["usable_cpus"]), nodes=len(rec.get("per_node") or []),
                  busy_settle_timeout=min(BUSY_SETTLE_TIMEOUT, options["settle_timeout"]))
    return config


def inputs_of(config, topology, service_inputs):
    """What a stored result depends on, by group: a group that changes makes the next run measure again."""
    rec = topology["recommended"]
    return {
        "method": RESULT_VERSION,
        "cpu": {"model_name": topology.get("model_name") or "", "isa": topology.get("isa") or {},
                "usable_cpus": topology["usable_cpus"],
                "recommended": {"cpus": rec["cpus"], "threads": int(rec["threads"])},
                "per_node": rec.get("per_node") or []},
        "model": service_inputs["model"],
        "engines": service_inputs["engines"],
        "allowed": {key: config[key] for key in ("engines", "dtypes", "gguf_types", "allow_quantized",
                                                 "quality_bounds", "validation_floor", "memory_budget_mb", "threads",
                                                 "allocators", "layouts", "parallel", "min_gain_percent")},
        "workload": {key: config[key] for key in ("prompt_tokens", "output_tokens", "concurrency", "requests",
                                                  "max_ttft_p95_ms", "max_tpot_p95_ms", "capacity")},
        # The rows' verdicts against their direct-run twins depend on these.
        "twin": {"enabled": config["twin"], "max_gap_percent": config["twin_max_gap_percent"],
                 "max_rounds": config["twin_max_rounds"]},
    }


# --- candidates ---------------------------------------------------------------------------------------------------

def candidate_stacks(config):
    """(stacks, later): [engine, format] pairs the operator allows, in the order they are measured: each engine's
    formats in the order of the CPU's rule table (module_utils/llmtune_kernels.py), the formats it favours first. Where
    the CPU computes bf16 natively, float32 stacks go to LATER (measured after every other stage: twice the bytes per
    token for the same arithmetic). GGUF types of fewer than 8 bits only when allowed."""
    stacks = []
    for engine in config["engines"]:
        if engine in GGUF_ENGINES:
            formats = [gguf for gguf in config["gguf_types"] if config["allow_quantized"] or gguf not in LOW_BIT]
        elif engine in ENGINES:
            formats = config["dtypes"]
        else:
            continue
        stacks += [[engine, fmt] for fmt in kernels.order(engine, formats, config.get("isa"))]
    lean = [stack for stack in stacks if stack[1] not in FP32]
    if not (config["native_bf16"] and lean):
        return stacks, []
    return lean, [stack for stack in stacks if stack[1] in FP32]


def thread_candidates(config, measured):
    """Stage 2's thread counts beside MEASURED, the count of the setting kept so far: the operator's, or half the
    recommended threads, every usable CPU and the recommendation (where the first rows ran fewer threads on a busy
    host); never MEASURED itself, never more than the CPUs there are."""
    rec, usable = config["recommended"], config["usable_cpus"]
    wanted = config["threads"] or [max(1, rec["threads"] // 2), len(usable), rec["threads"]]
    limit = len(set(rec["cpus"]) | set(usable))
    return [t for t in _unique(wanted) if t != measured and t <= limit]


def slot_candidates(config):
    """Stage 4's llama.cpp slot counts: the operator's, or 1 and every power of two up to the concurrency."""
    return _unique(config["parallel"] or [n for n in (1, 2, 4, 8, 16, 32, 64, 128, 256) if n <= config["concurrency"]])


def cpu_order(config):
    """The recommended CPUs (one per physical core) first, then the other usable CPUs (SMT siblings)."""
    rec = config["recommended"]["cpus"]
    return rec + sorted(set(config["usable_cpus"]) - set(rec))


def first_cpus(config, count):
    """The first COUNT CPUs of cpu_order(), as a setting's cpus."""
    return " ".join(str(cpu) for cpu in cpu_order(config)[:count])


def _unique(values):
    out = []
    for value in values:
        if value not in out:
            out.append(value)
    return out


def _setting(engine, fmt, config, **changes):
    """A tuned setting at the recommended threads and CPUs, one engine, no allocator, the engine's batching."""
    setting = {"engine": engine, "format": fmt, "threads": config["recommended"]["threads"],
               "cpus": " ".join(str(cpu) for cpu in config["recommended"]["cpus"]), "tuned": True, "allocator": "none",
               "parallel": None, "continuous_batching": False, "layout": "single"}
    setting.update(changes)
    return setting


def setting_of(row):
    """The setting's own keys of ROW (not its figures)."""
    return {key: row.get(key) for key in SETTING_KEYS}


def per_node_possible(config):
    """True where stage 5 can measure one engine per NUMA node: allowed, two or more nodes with usable cores, and a
    key for nginx, their one endpoint."""
    return "per_node" in config["layouts"] and config["nodes"] > 1 and config["api_key_set"]


def phase_settings(phase, state):
    """The settings PHASE measures, given what the phases before chose (state["chosen"])."""
    config, chosen = state["config"], state["chosen"]
    stacks, later = candidate_stacks(config)
    if phase == "first":
        # Each engine's most promising stack: its first in the measuring order (float32 only if it has nothing else).
        firsts = []
        for engine in config["engines"]:
            own = [stack for stack in stacks + later if stack[0] == engine]
            if own:
                firsts.append(_setting(engine, own[0][1], config))
        return firsts
    if phase == "reference":
        engine = config["engines"][0]
        own = [stack[1] for stack in stacks + later if stack[0] == engine]
        fmt = (own[0] if own else "bf16") if engine in GGUF_ENGINES else "auto"
        return [_setting(engine, fmt, config, threads=None, cpus="", tuned=False)]
    if phase == "stack":
        return [_setting(engine, fmt, config) for engine, fmt in stacks]
    if phase == "float32":
        return [_setting(engine, fmt, config) for engine, fmt in later]
    if not chosen:
        return []
    base = setting_of(chosen)
    if phase == "threads":
        return [dict(base, threads=t, cpus=first_cpus(config, t)) for t in thread_candidates(config, base["threads"])]
    if phase == "allocator":
        return [dict(base, allocator=name) for name in config["allocators"] if name != "none"]
    if phase == "batching" and config["concurrency"] > 1:
        if base["engine"] in SLOT_ENGINES:
            return [dict(base, parallel=slots) for slots in slot_candidates(config) if slots != base["parallel"]]
        return [dict(base, continuous_batching=True)]
    if phase == "layout" and per_node_possible(config):
        return [dict(base, layout="per_node")]
    return []


def capacity_candidates(state):
    """The rows the capacity stage sweeps: the chosen one first and, with more than one request in flight, each other
    engine's best row within the limits (a concurrent workload chooses its engine by capacity at the targets; one
    request's score cannot tell how an engine batches)."""
    chosen, config = state["chosen"], state["config"]
    rows = [chosen]
    if config["concurrency"] > 1:
        for engine in config["engines"]:
            if engine != chosen["engine"]:
                best, _ = choose([row for row in state["rows"] if row["engine"] == engine], None, config)
                rows += [best] if best else []
    return rows


def capacity_queue(state):
    """The capacity stage's rows, each noting the measured row it sweeps again (transformers: the same unit)."""
    if not (state["chosen"] and state["config"]["capacity"].get("enabled")):
        return []
    return [{"setting": capacity_setting(setting_of(row), state["config"]), "stage": CAPACITY, "of": setting_of(row)}
            for row in capacity_candidates(state)]


def sweep_context_tokens(config):
    """Each slot's context during the capacity sweep: its prompt and output tokens with a quarter more (the chat
    template adds tokens), in whole blocks of 256. The operator's context (4096 by default) in each of the sweep's
    max_concurrency slots would be a KV cache of gigabytes that no request of the sweep fills."""
    need = (config["capacity"]["prompt_tokens"] + config["capacity"]["output_tokens"]) * 1.25
    return 256 * max(1, math.ceil(need / 256))


def capacity_setting(base, config):
    """The capacity stage's row: the chosen BASE with, for an engine with slots, a slot for each stream of the
    sweep's top level (fewer slots would queue the streams past them in the engine, and the sweep would find the slots,
    not the capacity), each of the workload's context."""
    if base["engine"] not in SLOT_ENGINES:
        return dict(base)
    return dict(base, parallel=config["capacity"]["max_concurrency"], context_tokens=sweep_context_tokens(config))


# --- the sweep: plan, record, choose ------------------------------------------------------------------------------

def new_state(config, now):
    """A sweep about to start at NOW (seconds since the epoch, the host's clock)."""
    stacks, later = candidate_stacks(config)
    if not stacks + later:
        raise SweepError(
            f"autotune: no candidate stack from autotune_engines={config['engines']}, autotune_dtypes={config['dtypes']}, "
            f"autotune_gguf_types={config['gguf_types']} with autotune_allow_quantized={config['allow_quantized']}.")
    # done: every setting planned so far (a row's own keys change with what the service ran, e.g. its slots).
    return {"config": config, "started": now, "phase": -1, "queue": [], "done": [], "rows": [], "steps": [],
            "chosen": None, "reason": "no candidate measured within the limits", "deployed": "", "busy": False,
            "retry": False, "notes": [], "capacity": None, "capacities": []}


def row_of(setting, stage):
    """A row of SETTING measured in STAGE, before its figures: with the dtype and GGUF type it is served with."""
    row = dict(setting, stage=stage)
    variables = service_variables(setting, 0)
    row["dtype"] = variables["inference_service_dtype"]
    row["gguf_type"] = variables["inference_service_gguf_type"] if setting["engine"] in GGUF_ENGINES else None
    return row




def _close_phase(state):
    """Choose after the phase that just ended, where it is a stage of the report."""
    phase = PHASES[state["phase"]] if state["phase"] >= 0 else None
    if phase == CAPACITY:
        _choose_by_capacity(state)
        return
    if phase not in CHOICES:
        return
    if phase == "layout" and not any(row["stage"] == "layout" for row in state["rows"]):
        return
    if phase == "float32" and not any(row["stage"] == "float32" and row["status"] == "measured" for row in state["rows"]):
        return
    state["chosen"], state["reason"] = choose(state["rows"], state["chosen"], state["config"])
    if state["chosen"]:
        state["steps"].append(dict({"stage": phase}, **{key: state["chosen"].get(key) for key in STEP_KEYS}))


def _capacity_key(record):
    return (record["streams"], record["sweep"]["capacity"]["goodput_tokens_per_s"])


def _choose_by_capacity(state):
    """After the capacity stage: the capacity the host is served with (the chosen row's), or, with more than one
    request in flight, another engine's row whose sweep met the targets at more streams, or at as many with more than
    min_gain_percent more goodput there."""
    records = state["capacities"]
    if not records:
        return
    own = records[0]
    state["capacity"] = own
    measured = [record for record in records if record["status"] == "measured"]
    if state["config"]["concurrency"] < 2 or not measured:
        return
    top = max(measured, key=_capacity_key)
    if top is own:
        return
    gain = 1 + state["config"]["min_gain_percent"] / 100
    if own["status"] == "measured" and not (top["streams"] > own["streams"] or (
            top["streams"] == own["streams"] and _capacity_key(top)[1] > _capacity_key(own)[1] * gain)):
        return
    kept = state["chosen"]
    state["chosen"] = next(row for row in state["rows"] if row.get("tuned") and row["status"] == "measured"
                           and setting_of(row) == top["of"])
    state["capacity"] = top
    before = (f"{own['streams']} stream(s), {_capacity_key(own)[1]} tokens/s" if own["status"] == "measured"
              else own["status"])
    state["reason"] += (f"; then chosen by capacity at the targets: {top['streams']} stream(s), goodput "
                        f"{_capacity_key(top)[1]} tokens/s, over {kept['engine']} {kept['format']} ({before})")
    state["steps"].append(dict({"stage": CAPACITY}, **{key: state["chosen"].get(key) for key in STEP_KEYS}))


def next_row(state, now):
    """The next row to measure as {"setting", "stage", "deploy", "twin_deadline", "settle_timeout", "retry"}, or None
    when the sweep is done. Rows planned once the time budget is spent are recorded as skipped instead, but for each
    engine's first row (MANDATORY)."""
    config = state["config"]
    while True:
        if state["queue"]:
            setting, stage = state["queue"][0]["setting"], state["queue"][0]["stage"]
            if now - state["started"] > config["budget_s"] and stage not in MANDATORY + (CAPACITY,):
                state["queue"].pop(0)
                state["rows"].append(dict(row_of(setting, stage), status=SKIPPED))
                continue
            return _plan(state, setting, stage, now)
        _close_phase(state)
        if state["phase"] + 1 >= len(PHASES):
            return None
        state["phase"] += 1
        phase = PHASES[state["phase"]]
        if phase == "layout" and state["chosen"] and config["nodes"] > 1 and "per_node" in config["layouts"] \
                and not config["api_key_set"]:
            state["notes"].append("one engine per NUMA node not measured: the engines sit behind nginx, which checks a "
                                  "key; set inference_service_api_key (or autotune_layouts=[single] to say so)")
        if phase == CAPACITY:
            state["queue"] = capacity_queue(state)
        else:
            state["queue"] = [{"setting": setting, "stage": phase} for setting in phase_settings(phase, state)
                              if setting not in state["done"]]
        state["done"] += [planned["setting"] for planned in state["queue"]]


def _plan(state, setting, stage, now):
    config = state["config"]
    end = state["started"] + config["budget_s"]
    if stage in PRIORITY:
        # This row and the priority rows after it share what is left; the reference follows the first rows.
        left = len(state["queue"]) + (1 if stage == "first" else 0)
        deadline = now + max(0.0, end - now) / max(left, 1)
    else:
        deadline = end
    key = f"{setting['engine']} {row_of(setting, stage)['gguf_type'] or ''}"
    # A host that stayed busy through the last wait is not waited for again: the rows say they ran under load.
    state["queue"][0]["settle_timeout"] = config["busy_settle_timeout"] if state["busy"] else config["settle_timeout"]
    return {"setting": setting, "stage": stage,
            # Rows of the engine and model file deployed last change the unit alone.
            "deploy": "unit" if state["deployed"] == key else "main",
            # No paired round is added after this (the planned ones run anyway).
            "twin_deadline": round(deadline, 1),
            "settle_timeout": state["queue"][0]["settle_timeout"],
            "retry": state["retry"]}


def score(summary, config):
    """The workload score, lower is better: with one request in flight its end-to-end latency (TTFT p50 + (output
    tokens - 1) x TPOT p50, ms); with more, ms per output token served to all clients (1000 / output tokens/s)."""
    if config["concurrency"] < 2:
        return round(summary["ttft_ms_p50"] + (config["output_tokens"] - 1) * summary["tpot_ms_p50"], 1)
    return round(1000 / summary["output_tokens_per_s"], 2)


def measured_row(row, measurement, config):
    """ROW with the figures of MEASUREMENT: the benchmark's result, the twin row the benchmark role kept, the running
    service (inference_service_running), the roofline and bandwidth, each engine's peak resident memory (kB)."""
    result, running = measurement["result"], measurement["running"]
    summary, level = result["summary"], result["levels"][0]
    roofline = measurement.get("roofline") or {}
    twin_row = measurement.get("twin") or {}
    row = dict(row, status="measured", deploy=measurement.get("deploy"), deploy_s=measurement.get("deploy_s"),
               parallel=running.get("parallel"), continuous_batching=running.get("continuous_batching"),
               layout=running.get("layout") or "single",
               ttft_ms_p50=summary["ttft_ms_p50"], ttft_ms_p95=summary["ttft_ms_p95"],
               tpot_ms_p50=summary["tpot_ms_p50"], tpot_ms_p95=level["tpot_ms"]["p95"],
               decode_tokens_per_s=summary["decode_tokens_per_s"], e2e_ms_p50=summary["e2e_ms_p50"],
               output_tokens_per_s=summary["output_tokens_per_s"],
               prompt_tokens_mean=level["prompt_tokens_mean"],
               output_tokens_mean=round(level["output_tokens"] / max(level["requests"], 1), 1),
               score_ms=score(summary, config),
               rss_mb=round(sum(measurement.get("rss_kb") or [0]) / 1024),
               engine_cpus=[engine["cpus"] for engine in running["instances"]] if len(running["instances"]) > 1 else None,
               engine_shares=level.get("engines"),
               bandwidth_gb_s=roofline.get("bandwidth_gb_s"),
               roofline_tokens_per_s=roofline.get("decode_upper_bound_tokens_per_s"),
               roofline_percent=(result.get("roofline") or {}).get("percent"),
               noisy=bool(result["noisy"]), other_cpus=level["cpu"]["other"],
               prompt_tokens_cached_mean=level.get("prompt_tokens_cached_mean"),
               loadavg_before=result["host_load"]["loadavg_before"][0],
               other_cpus_before=result["host_load"].get("other_cpus_before"),
               settle_wait_s=result["host_load"].get("settle_wait_s"),
               # The GGUF's quality gate figures (quantized types) and the kernels the engine ran.
               quality=running.get("quality") or None,
               kernel=running.get("kernel") or None,
               expected_kernel=kernels.kernel(row["engine"], row["format"], config.get("isa")))
    if "twin" in result:
        twin, gap = result["twin"], result["twin"]["gap_percent"]
        row["twin"] = {"decode_tokens_per_s": twin["summary"]["decode_tokens_per_s"],
                       "output_tokens_per_s": twin["summary"]["output_tokens_per_s"],
                       "score_ms": score(twin["summary"], config), "e2e_ms_p50": twin["summary"]["e2e_ms_p50"],
                       "engines": twin["levels"][0].get("engines"),
                       "gap_percent": {"decode_tokens_per_s": gap["decode_tokens_per_s"]["median"],
                                       "e2e_ms": gap["e2e_ms"]["median"]},
                       "rounds": gap, "verdict": gap["verdict"]}
    else:
        row["twin"] = {"skipped": twin_row.get("skipped") or "no twin"}
    return row


def _host_stayed_busy(result, settle_timeout, busy_limit):
    """True when the benchmark waited its whole SETTLE_TIMEOUT and other processes still kept BUSY_LIMIT CPUs busy."""
    load = result.get("host_load") or {}
    return (load.get("settle_wait_s") or 0) >= 0.9 * settle_timeout and (load.get("other_cpus_before") or 0) >= busy_limit


def record(state, measurement):
    """Record the measurement of the row next_row() returned last. MEASUREMENT holds "failure" (the message of a row
    whose deploy or measurement failed) or the figures of measured_row(), and "deployed": whether the deploy
    finished (rows that follow may then change the unit alone). A row another process disturbed is measured once
    more, unless the host stayed busy (then its rows say so instead)."""
    if not state["queue"]:
        raise SweepError("autotune: a row was recorded that was not planned")
    planned = state["queue"][0]
    setting, stage, config = planned["setting"], planned["stage"], state["config"]
    row = row_of(setting, stage)
    key = f"{setting['engine']} {row['gguf_type'] or ''}"
    state["deployed"] = key if measurement.get("deployed") else ""
    if stage == CAPACITY:
        state["queue"].pop(0)
        state["capacities"].append(dict(capacity_record(setting, measurement), of=planned["of"]))
        return state["capacities"][-1]
    if measurement.get("failure"):
        state["queue"].pop(0)
        state["retry"] = False
        state["rows"].append(dict(row, status="failed: " + str(measurement["failure"])[:200]))
        return state["rows"][-1]
    result = measurement["result"]
    state["busy"] = _host_stayed_busy(result, planned.get("settle_timeout", config["settle_timeout"]),
                                      config["busy_limit"])
    if result.get("noisy") and not state["retry"] and not state["busy"]:
        state["retry"] = True
        return None
    state["queue"].pop(0)
    state["rows"].append(dict(measured_row(row, measurement, config), attempts=2 if state["retry"] else 1))
    state["retry"] = False
    if stage in MANDATORY:
        _fit_first_rows_to_free_cpus(state, setting, state["rows"][-1])
    return state["rows"][-1]


def capacity_record(setting, measurement):
    """The capacity stage's record of the sweep on SETTING (MEASUREMENT: "capacity", the benchmark role's sweep and
    engine figure, or "failure"), with what the host is served with: a slot for each stream that met the targets
    and nginx admitting as many requests, at least one (a host where one stream alone misses the targets still
    serves one at a time)."""
    base = {"engine": setting["engine"], "sweep_slots": setting.get("parallel"),
            "context_tokens": setting.get("context_tokens"), "deploy_s": measurement.get("deploy_s")}
    if measurement.get("failure"):
        return dict(base, status="failed: " + str(measurement["failure"])[:200], serve={})
    taken = measurement["capacity"]
    sweep = dict(taken["result"], levels=[{key: value for key, value in level.items() if key != "samples"}
                                          for level in taken["result"]["levels"]])
    streams = sweep["capacity"]["concurrency"]
    serve = {"admitted": max(streams, 1)}
    if setting["engine"] in SLOT_ENGINES:
        serve["parallel"] = serve["admitted"]
    return dict(base, status="measured", streams=streams, serve=serve, sweep=sweep,
                engine_batched=taken.get("engine_batched") or {})


def _fit_first_rows_to_free_cpus(state, setting, row):
    """Where the host stayed busy and ROW (a first row of SETTING) ran more threads than the CPUs other processes left
    free, the first rows run at that many threads: SETTING's next, and the engines' still planned in its place. Both
    engines wait at a barrier for every thread of a step, so a thread that shares its CPU slows every step (the busy
    demo's rows at 2 threads on 2 CPUs with one taken decoded at a sixtieth of their speed on the quiet host)."""
    config, threads = state["config"], setting.get("threads")
    if not (state["busy"] and row.get("noisy") and threads):
        return
    busy = row.get("other_cpus_before") or 0
    # A CPU counts as taken when other processes keep it more than half busy.
    fits = max(1, len(setting["cpus"].split()) - math.floor(busy + 0.5))
    if fits >= threads:
        return
    cpus = first_cpus(config, fits)
    fitted = dict(setting, threads=fits, cpus=cpus)
    queue = [planned if planned["stage"] not in MANDATORY or planned["setting"]["threads"] <= fits
             else dict(planned, setting=dict(planned["setting"], threads=fits, cpus=cpus))
             for planned in state["queue"]]
    if fitted not in state["done"]:
        queue.insert(0, {"stage": row["stage"], "setting": fitted})
    state["queue"] = queue
    state["done"] += [planned["setting"] for planned in queue if planned["setting"] not in state["done"]]
    state["notes"].append(f"other processes kept {busy} CPUs busy: the first rows from "
                          f"{setting['engine']} {setting['format']} on run at {fits} thread(s) on CPUs {cpus}")


def quality_refusal(row, config):
    """Why the quality gate refuses ROW (a quantized GGUF whose figures break the bounds, or that has none), or ''."""
    fmt = row.get("gguf_type") or row.get("format")
    if row.get("engine") not in GGUF_ENGINES or fmt in quality.UNQUANTIZED or not row.get("tuned"):
        return ""
    if not row.get("quality"):
        return "no quality figures"
    return "; ".join(quality.verdict(row["quality"], config.get("quality_bounds")))


def below_floor(row, reference, config):
    """The figures of ROW that would fail the validation's floor (benchmark_fail_below: figure to the lowest ratio to
    the baseline) against REFERENCE, the engine defaults' row, as 'figure ratio < floor'; [] without a reference."""
    if not reference:
        return []
    out = []
    for figure, floor in sorted((config.get("validation_floor") or {}).items()):
        new, old = row.get(figure), reference.get(figure)
        if not (isinstance(new, (int, float)) and isinstance(old, (int, float)) and new > 0 and old > 0):
            continue
        ratio = old / new if figure.endswith("_ms") or "_ms_" in figure else new / old
        if ratio < float(floor):
            out.append(f"{figure} {round(ratio, 3)} < {floor}")
    return out


def later_start_only(row, reference, config):
    """True where ROW falls below the validation's floor against REFERENCE only in its TTFT figures while its workload
    score beats the reference's beyond the end-to-end floor (benchmark_fail_below's e2e_ms_p50, else 1.0)."""
    figures = below_floor(row, reference, config)
    floor = float((config.get("validation_floor") or {}).get("e2e_ms_p50", 1.0))
    return (bool(figures) and all(figure.startswith("ttft_") for figure in figures)
            and row.get("score_ms", 0) > 0 and reference.get("score_ms", 0) > 0
            and row["score_ms"] < reference["score_ms"] * floor)


def choose(rows, kept, config):
    """(chosen row, reason): the lowest score among the measured candidates within the memory budget, the latency
    bounds, the quality gate and the validation's floor against the engine defaults (but for a later first token
    alone, see later_start_only). Rows disturbed by other processes (noisy) are shown and left out, unless every row
    was: then the choice is among them, and the reason says so. A row of a later stage replaces KEPT (the setting kept
    so far) only when it scores lower by more than min_gain_percent: rows are measured minutes apart and the host
    drifts."""
    measured = [row for row in rows if row.get("tuned") and row["status"] == "measured"]
    quiet = [row for row in measured if not row.get("noisy")]
    pool = quiet or measured
    budget = config["memory_budget_mb"]
    over = [row for row in pool if budget > 0 and row["rss_mb"] > budget]
    slow = []
    for figure, bound in (("ttft_ms_p95", config["max_ttft_p95_ms"]), ("tpot_ms_p95", config["max_tpot_p95_ms"])):
        # A row without the figure cannot show it is within.
        slow += [row for row in pool if bound > 0 and (row.get(figure) is None or row[figure] > bound)
                 and row not in slow]
    refused = [row for row in pool if quality_refusal(row, config)]
    eligible = [row for row in pool if row not in over + slow + refused]
    # What the validation would fail against the untuned baseline, judged against the engine defaults' row (the same
    # engine defaults, the same workload): left out while another row passes. A later first token alone is the
    # workload's trade, not a regression, where its score (the workload's whole latency) beats the engine defaults' by
    # more than the end-to-end floor's margin: the reason then names it.
    reference = next((row for row in rows if not row.get("tuned") and row["status"] == "measured"), None)
    worse = [row for row in eligible
             if below_floor(row, reference, config) and not later_start_only(row, reference, config)]
    if worse and len(worse) < len(eligible):
        eligible = [row for row in eligible if row not in worse]
    else:
        worse = []
    if not eligible:
        return None, "no candidate measured within the limits"
    best = min(eligible, key=lambda row: row["score_ms"])
    # Compared by value: the state (and the row kept) passes through Ansible as JSON between calls.
    keep = (kept is not None and kept in eligible and best != kept
            and best["score_ms"] > kept["score_ms"] * (1 - config["min_gain_percent"] / 100))
    reason = f"lowest workload score of {len(eligible)} measured candidates"
    if over:
        reason += f", {len(over)} over the memory budget"
    if slow:
        reason += f", {len(slow)} over the latency bounds"
    if refused:
        reason += f", {len(refused)} refused by the quality gate"
    if worse:
        reason += f", {len(worse)} below the validation's floor against the engine defaults"
    if keep:
        reason += f", kept over {best['score_ms']} ms, within autotune_min_gain_percent ({config['min_gain_percent']} %) of it"
    if not quiet:
        reason += ", all measured under load (other processes kept CPUs busy during every row)"
    chosen = kept if keep else best
    if later_start_only(chosen, reference, config):
        reason += (f"; its first token later than the engine defaults' "
                   f"({', '.join(below_floor(chosen, reference, config))}), its workload score "
                   f"{chosen['score_ms']} ms against their {reference['score_ms']}")
    return chosen, reason


def unmeasured_engines(rows, engines):
    """[{engine, why}] for each allowed engine with no measured tuned row, and why (its rows' statuses)."""
    out = []
    for engine in engines:
        own = [row for row in rows if row["engine"] == engine and row.get("tuned")]
        if not any(row["status"] == "measured" for row in own):
            why = sorted({row["status"] for row in own}) or ["no row planned"]
            out.append({"engine": engine, "why": "; ".join(why)})
    return out


def result_of(state, now, finished, inputs):
    """The stored result of a finished sweep (autotune.json)."""
    config = state["config"]
    reference = next((row for row in state["rows"] if not row.get("tuned")), None)
    return {
        "version": RESULT_VERSION,
        "chosen": state["chosen"], "reason": state["reason"], "reference": reference,
        "rows": state["rows"], "steps": state["steps"], "notes": state["notes"], "capacity": state.get("capacity"),
        "capacities": state.get("capacities") or [],
        "unmeasured_engines": unmeasured_engines(state["rows"], config["engines"]),
        "measured_under_load": sum(1 for row in state["rows"] if row.get("noisy")),
        "inputs": inputs,
        "workload": {key: config[key] for key in ("prompt_tokens", "output_tokens", "concurrency", "max_ttft_p95_ms",
                                                  "max_tpot_p95_ms")},
        "limits": {"engines": config["engines"], "quantized_allowed": config["allow_quantized"],
                   "memory_budget_mb": config["memory_budget_mb"]},
        "score": ("TTFT p50 + (output_tokens - 1) x TPOT p50, ms" if config["concurrency"] < 2
                  else "1000 / aggregate output tokens/s at the concurrency, ms per output token") + "; lower is better",
        "time_budget_s": config["budget_s"], "direct_max_gap_percent": config["twin_max_gap_percent"],
        "elapsed_s": round(now - state["started"], 1), "finished": finished,
    }


def changed_inputs(current, stored):
    """The groups of CURRENT (inputs of this run) that differ from STORED (a stored result's); all of them for a
    result stored before the inputs were recorded."""
    old = (stored or {}).get("inputs") or {}
    return [key for key in current
            if json.dumps(current[key], sort_keys=True) != json.dumps(old.get(key), sort_keys=True)]


# --- the report ---------------------------------------------------------------------------------------------------

def _cell(value):
    return "-" if value is None or value == "" else str(value)


def _batching(row):
    if row.get("parallel"):
        return f"{row['parallel']} slots"
    return "continuous" if row.get("continuous_batching") else "-"


def _layout(row):
    if row.get("engine_cpus"):
        return "one engine per NUMA node, CPUs " + " / ".join(row["engine_cpus"])
    return "one engine per NUMA node" if row.get("layout") == "per_node" else "one engine"


def _where(row):
    if row.get("layout") == "per_node":
        return _layout(row)
    return f"{row.get('threads')} threads on CPUs {row.get('cpus')}"


def _twin_gap(row, limit):
    twin = row.get("twin") or {}
    if "gap_percent" in twin:
        gap, rounds = twin["gap_percent"], twin["rounds"]
        text = f"{gap['decode_tokens_per_s']} / {gap['e2e_ms']}"
        if twin["verdict"] == "over":
            text = f"**{text} (over {limit} % in every round: the unit costs speed)**"
        elif twin["verdict"] == "unresolved":
            spread = rounds["decode_tokens_per_s"]
            text += f" (not resolved: rounds {spread['min']} to {spread['max']})"
        if rounds["rounds"] > rounds.get("planned_rounds", rounds["rounds"]):
            text += f" ({rounds['rounds']} rounds)"
        return text
    return "no twin" if "skipped" in twin else "-"


def _kernels(row):
    """The kernels a row ran (the engine's own account) and, where the rule table expects another, that one."""
    ran, expected = row.get("kernel") or "", row.get("expected_kernel") or ""
    if ran and expected:
        return f"{ran} (table: {expected})"
    return ran or expected or "-"


def _quality_lines(result):
    """The quality gate's figures of each quantized row, once per format, and its verdict."""
    config = {"quality_bounds": ((result.get("inputs") or {}).get("allowed") or {}).get("quality_bounds")}
    lines, seen = [], set()
    for row in result["rows"]:
        fmt = row.get("gguf_type") or row.get("format")
        if row.get("engine") not in GGUF_ENGINES or fmt in quality.UNQUANTIZED or fmt in seen or row["status"] != "measured":
            continue
        seen.add(fmt)
        figures, refusal = row.get("quality") or {}, quality_refusal(row, config)
        text = (f"Quality gate, {fmt}: " + (
            f"mean KLD {figures['kld_mean']}, 99 % KLD {figures['kld_p99']}, same top token "
            f"{figures['same_top_percent']} %, PPL ratio {figures['ppl_ratio']} against bf16 (llama-perplexity, "
            f"{figures.get('scored_tokens', '?')} tokens scored)" if figures else "not measured"))
        lines.append(text + (f": refused, {refusal} (measured, not chosen)." if refusal else ": within the bounds."))
    return lines


def _same_setting(row, other, keys):
    blank = {"parallel": None, "continuous_batching": None, "layout": "single"}
    return all(dict(blank, **row).get(key) == dict(blank, **other).get(key) for key in keys)


def _capacity_section(host, record):
    """One capacity sweep of the capacity stage: its table, and the setting and slots it ran with."""
    of = record.get("of") or {}
    name = f"{record['engine']} {of.get('format') or ''}".strip()
    if record["status"] != "measured":
        return [f"Capacity of {name}: {record['status']}.", ""]
    slots = (f" with {record['sweep_slots']} slots of {record['context_tokens']} tokens (a slot for each stream of "
             "the top level)" if record.get("sweep_slots") else "")
    lines = capacity_markdown(host, record["sweep"], record["engine_batched"], record["engine"])
    lines[0] += f": {name}"
    lines[1:1] = ["", f"The capacity stage swept {name}, {_where(of) if of else 'the chosen setting'}{slots} "
                      f"(deploy {record.get('deploy_s')} s)."]
    return [*lines, ""]


def _served_lines(result, host):
    """The capacity stage's sections of the report: each sweep and what the host is served with."""
    cap, work = result.get("capacity"), result["workload"]
    records = result.get("capacities") or ([cap] if cap else [])
    operators = ("the slots and nginx's limit stay the operator's (inference_service_parallel, "
                 "inference_service_max_concurrent)")
    if not cap:
        enabled = (((result.get("inputs") or {}).get("workload") or {}).get("capacity") or {}).get("enabled")
        return [f"Capacity: {'not measured' if enabled else 'not measured (autotune_capacity off)'}; {operators}.", ""]
    lines = [""] + [line for record in records for line in _capacity_section(host, record)]
    if cap["status"] != "measured":
        return lines + [f"Capacity: {cap['status']}; {operators}.", ""]
    serve = cap["serve"]
    text = f"Served: nginx admits {serve['admitted']} request(s) at once, one more gets 429 with Retry-After"
    if "parallel" in serve:
        text += (f"; {getattr(ENGINES.get(cap['engine']), 'title', cap['engine'])} decodes them in {serve['parallel']} slot(s), "
                 "each of the operator's context")
    if not cap["streams"]:
        text += "; one stream alone misses the targets, so the host serves one at a time"
    if work.get("concurrency", 1) > serve["admitted"]:
        text += (f"; the workload's {work['concurrency']} requests in flight exceed the capacity at the targets: "
                 "the rest are refused until a request ends")
    if any(level.get("noisy") for level in cap["sweep"]["levels"]):
        text += ("; measured under load (other processes took CPU time during the sweep), which lowers the capacity: "
                 "-e autotune_remeasure=true on a quiet host measures it again")
    return [*lines, text + ".", ""]


def report_markdown(result, host, cpu_model, baseline):
    """The sweep table of RESULT as Markdown, with the choice, its gain over the engine defaults and over BASELINE
    (the untuned service's summary, with its prompt_tokens_mean), and where the gain came from."""
    chosen, ref, work = result.get("chosen"), result.get("reference") or {}, result["workload"]
    limits, limit = result.get("limits") or {}, result.get("direct_max_gap_percent")
    keys = [key for key in SETTING_KEYS if key != "tuned"]
    lines = [f"# Auto-tune of {host}", ""]
    bounds = "".join([f", TTFT p95 at most {work['max_ttft_p95_ms']} ms" if work.get("max_ttft_p95_ms") else "",
                      f", TPOT p95 at most {work['max_tpot_p95_ms']} ms" if work.get("max_tpot_p95_ms") else ""])
    lines.append(f"CPU: {cpu_model or '-'}; workload: {work['prompt_tokens']}-token synthetic prompt, "
                 f"{work['output_tokens']} output tokens (EOS ignored), {work.get('concurrency', 1)} request(s) in "
                 f"flight{bounds}.")
    budget_mb = limits.get("memory_budget_mb") or 0
    lines.append(f"Allowed: engines {', '.join(limits.get('engines') or ['transformers'])}; GGUF types below 8 bits "
                 f"{'yes' if limits.get('quantized_allowed') else 'no'}, quantized ones within the quality gate's "
                 f"bounds; memory budget {str(budget_mb) + ' MiB' if budget_mb else 'none'}.")
    lines.append(f"Score: {result['score']}. Time budget {result['time_budget_s']} s, sweep took {result['elapsed_s']} s "
                 f"(finished {result['finished']}).")
    lines += ["", "| setting | stage | engine | format | threads | CPUs | allocator | batching | layout | status | "
              "deploy s | TTFT p50 ms | TTFT p95 ms | TPOT p50 ms | TPOT p95 ms | decode tok/s | output tok/s | "
              "score ms | peak RSS MiB | roofline tok/s | roofline % | other CPUs busy | load before | "
              "twin decode tok/s | slower than twin %, decode / e2e | kernels |",
              "|" + "---|" * 26]
    for row in result["rows"]:
        if not row.get("tuned"):
            kind = "engine defaults"
        elif chosen and _same_setting(row, chosen, keys):
            kind = "**chosen**"
        else:
            kind = "candidate"
        deploy = "-" if row.get("deploy_s") is None else \
            f"{row['deploy_s']}{' (unit)' if row.get('deploy') == 'unit' else ''}"
        busy = _cell(row.get("other_cpus")) + (" (under load)" if row.get("noisy") else "")
        cells = [kind, row.get("stage"), row["engine"], row["format"], _cell(row.get("threads")),
                 row.get("cpus") or "all", row.get("allocator"), _batching(row), _layout(row), row["status"], deploy,
                 _cell(row.get("ttft_ms_p50")), _cell(row.get("ttft_ms_p95")), _cell(row.get("tpot_ms_p50")),
                 _cell(row.get("tpot_ms_p95")), _cell(row.get("decode_tokens_per_s")),
                 _cell(row.get("output_tokens_per_s")), _cell(row.get("score_ms")), _cell(row.get("rss_mb")),
                 _cell(row.get("roofline_tokens_per_s")), _cell(row.get("roofline_percent")), busy,
                 _cell(row.get("loadavg_before")), _cell((row.get("twin") or {}).get("decode_tokens_per_s")),
                 _twin_gap(row, limit), _kernels(row)]
        lines.append("| " + " | ".join(str(cell) for cell in cells) + " |")
    lines.append("")
    measured = [row for row in result["rows"] if row["status"] == "measured"]
    twinned = [row for row in measured if "gap_percent" in (row.get("twin") or {})]
    if twinned:
        gaps = [row["twin"]["gap_percent"]["decode_tokens_per_s"] for row in twinned]
        rounds = [row["twin"]["rounds"]["rounds"] for row in twinned]
        over = [row for row in twinned if row["twin"]["verdict"] == "over"]
        unresolved = [row for row in twinned if row["twin"]["verdict"] == "unresolved"]
        text = (f"Direct-run twins: {len(twinned)} of {len(measured)} measured rows ran the same engine and settings "
                "directly, outside systemd, beside the service, each prompt sent to both in turn "
                f"({min(rounds)} to {max(rounds)} paired rounds a row: rounds are added while a row's gap is beyond "
                f"the limit, up to {(result.get('inputs') or {}).get('twin', {}).get('max_rounds', '-')}, and within "
                f"the row's share of the time budget); the service was slower by {min(gaps)} to {max(gaps)} % in "
                "decode (medians of paired rounds; negative: faster)")
        if not over + unresolved:
            text += f", within {limit} % on every row"
        if over:
            text += f"; over {limit} % in every round on {len(over)} row(s), marked in bold"
        if unresolved:
            text += (f"; beyond {limit} % on {len(unresolved)} row(s) whose rounds disagree (not resolved at "
                     f"{unresolved[0]['twin']['rounds']['rounds']} rounds: the noise is wider than the gap)")
        lines.append(text + ".")
    for row in result["rows"]:
        if "skipped" in (row.get("twin") or {}):
            lines.append(f"No twin for {row['engine']} {row['format']} ({_cell(row.get('threads'))} threads, allocator "
                         f"{row.get('allocator')}): {row['twin']['skipped']}.")
    for per_node in [row for row in measured if row.get("layout") == "per_node"]:
        same = [key for key in keys if key != "layout"]
        single = [row for row in measured if row.get("tuned") and row.get("layout", "single") == "single"
                  and _same_setting(row, per_node, same)]
        if single and "score_ms" in (single[-1].get("twin") or {}) and "score_ms" in (per_node.get("twin") or {}):
            one = single[-1]
            agree = (one["score_ms"] <= per_node["score_ms"]) == (one["twin"]["score_ms"] <= per_node["twin"]["score_ms"])
            lines.append(f"Layout checked by the direct-run twins: one engine scored {one['score_ms']} ms (its twin "
                         f"{one['twin']['score_ms']} ms), one engine per NUMA node {per_node['score_ms']} ms (their twins "
                         f"{per_node['twin']['score_ms']} ms): the twins rank the layouts "
                         f"{'as the services did' if agree else 'the other way round: the choice is within the noise'}.")
    lines += _quality_lines(result)
    under_load = [row for row in measured if row.get("noisy")]
    if under_load:
        lines.append(f"Measured under load (other processes kept more than the busy limit of CPUs busy): "
                     f"{len(under_load)} of {len(measured)} measured rows, marked in the table"
                     + ("; chosen among them, as every row was." if len(under_load) == len(measured) else
                        "; they are shown and not chosen."))
    for gone in result.get("unmeasured_engines") or []:
        lines.append(f"Never measured: {gone['engine']} ({gone['why']}).")
    for note in result.get("notes") or []:
        lines.append(f"Note: {note}.")
    lines.append("")
    if not chosen:
        lines.append("No candidate was measured within the limits.")
        return "\n".join(lines) + "\n"
    lines.append(f"Chosen ({result['reason']}): {chosen['engine']} {chosen['format']}, {_where(chosen)}, allocator "
                 f"{chosen['allocator']}, batching {_batching(chosen)}: score {chosen['score_ms']} ms, "
                 f"{_cell(chosen.get('output_tokens_per_s'))} output tokens/s in all, TTFT p50 {chosen['ttft_ms_p50']} ms, "
                 f"decode {chosen['decode_tokens_per_s']} tokens/s = {_cell(chosen.get('roofline_percent'))} % of the "
                 f"roofline ({_cell(chosen.get('roofline_tokens_per_s'))} tokens/s at {_cell(chosen.get('bandwidth_gb_s'))} "
                 f"GB/s), peak RSS {chosen['rss_mb']} MiB.")
    if ref.get("score_ms") is not None:
        lines.append(f"Gain over the engine defaults (same workload, same OS): score {ref['score_ms']} → "
                     f"{chosen['score_ms']} ms (x{round(ref['score_ms'] / chosen['score_ms'], 2)}), TTFT p50 "
                     f"{ref['ttft_ms_p50']} → {chosen['ttft_ms_p50']} ms, decode {ref['decode_tokens_per_s']} → "
                     f"{chosen['decode_tokens_per_s']} tokens/s (x{round(chosen['decode_tokens_per_s'] / ref['decode_tokens_per_s'], 2)}).")
    base = (baseline or {}).get("decode_tokens_per_s")
    if base:
        lines.append(f"Against the untuned baseline of site.yml (built-in prompts, so only decode speed compares): decode "
                     f"{base} → {chosen['decode_tokens_per_s']} tokens/s (x{round(chosen['decode_tokens_per_s'] / base, 2)}).")
    if result.get("steps") and ref.get("score_ms") is not None:
        lines += ["", "Where the gain came from: the setting kept after each stage (each keeps the best of its rows), "
                  "its score and its share.", "", "| stage | kept after it | score ms | x vs the stage before | decode tok/s |",
                  "|---|---|---|---|---|"]
        if base:
            lines.append(f"| OS settings (decode only: the untuned baseline ran built-in prompts of "
                         f"{_cell(baseline.get('prompt_tokens_mean')) if baseline.get('prompt_tokens_mean') else '?'} tokens "
                         f"on the untuned OS, these rows {ref.get('prompt_tokens_mean') or '?'}; decode slows with the "
                         f"context) | engine defaults | - | x{round(ref['decode_tokens_per_s'] / base, 2)} (decode) | "
                         f"{base} → {ref['decode_tokens_per_s']} |")
        lines.append(f"| engine defaults on the tuned OS | {ref['engine']} {ref['format']} | {ref['score_ms']} | - | "
                     f"{ref['decode_tokens_per_s']} |")
        before = ref["score_ms"]
        for step in result["steps"]:
            lines.append(f"| {LABELS.get(step['stage'], step['stage'])} | {step['engine']} {step['format']}, "
                         f"{_where(step)}, allocator {step['allocator']}, batching {_batching(step)} | "
                         f"{step['score_ms']} | x{round(before / step['score_ms'], 2)} | {step['decode_tokens_per_s']} |")
            before = step["score_ms"]
    lines += _served_lines(result, host)
    return "\n".join(lines) + "\n"
