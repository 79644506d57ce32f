# -*- coding: utf-8 -*-
"""Capacity of a service at its operator's service-level targets, and the same engine's own batched figure beside it.

The one place of: the concurrency levels a capacity sweep runs and why it stops, whether a request and a level meet
the targets, goodput, the capacity, the reading of llama.cpp's llama-batched-bench, the comparison of the service's
aggregate output tokens/s with it, and the Markdown report. library/inference_benchmark.py runs the sweep,
library/engine_batched_bench.py the engine's own benchmark, roles/benchmark/files/capacity_report.py writes the
report and its chart on the controller.

Targets are a dict {"ttft_p95_ms": float, "itl_p95_ms": float}. A level is a level of inference_benchmark (its
RV(levels[]) entry: concurrency, requests, errors, wall_s, ttft_ms, itl_ms, samples (each with ttft_ms, itl_ms_p95
and output_tokens), output_tokens, output_tokens_per_s, requests_per_s, noisy).
"""

from __future__ import annotations

import json

from ansible.module_utils.llmtune_engines import ENGINES
from ansible.module_utils.llmtune_engine_vllm import SERVER_MODULE as VLLM_SERVER_MODULE


def level_requests(concurrency, min_requests):
    """Requests of a sweep level: every stream sends at least two, and at least MIN_REQUESTS for a p95 of TTFT (an
    interpolated p95 of fewer than 20 requests is mostly their maximum)."""
    return max(2 * concurrency, min_requests)


def request_within(sample, targets):
    """True when one request met both targets: its TTFT at most the TTFT target and the p95 of its own inter-token
    gaps at most the ITL target (a request of one token has no gap to break it)."""
    itl = sample.get("itl_ms_p95")
    return sample["ttft_ms"] <= targets["ttft_p95_ms"] and (itl is None or itl <= targets["itl_p95_ms"])


def judge_level(level, targets):
    """What a level gives against TARGETS: goodput_tokens_per_s (output tokens of the requests within both targets
    per second of the level), requests_within_targets, broken (why the level misses: a target above its p95 or
    failed requests; empty when it meets both) and meets_targets. A level's samples are its successful requests,
    whose output tokens make its output_tokens."""
    good = [sample for sample in level["samples"] if request_within(sample, targets)]
    tokens = level["output_tokens"]
    broken = []
    if level["errors"]:
        broken.append(f"{level['errors']} of {level['requests']} requests failed")
    ttft, itl = level["ttft_ms"]["p95"], level["itl_ms"]["p95"]
    if ttft is None or ttft > targets["ttft_p95_ms"]:
        broken.append(f"TTFT p95 {ttft} ms > {targets['ttft_p95_ms']:g} ms")
    if itl is not None and itl > targets["itl_p95_ms"]:
        broken.append(f"ITL p95 {itl} ms > {targets['itl_p95_ms']:g} ms")
    # The level's aggregate rate, in the share of its output tokens that came from requests within both targets.
    share = sum(sample["output_tokens"] for sample in good) / tokens if tokens else 0.0
    return {"goodput_tokens_per_s": round(level["output_tokens_per_s"] * share, 3),
            "requests_within_targets": len(good), "broken": broken, "meets_targets": not broken}


def streams(count):
    """COUNT streams, in words."""
    return f"{count} stream{'' if count == 1 else 's'}"


def next_level(levels, max_concurrency, min_requests, elapsed_s, time_limit_s):
    """(concurrency of the next level or None, True when it measures the last level again, why the sweep stops).

    The sweep doubles the streams until a level breaks a target or has failed requests (that level is the last).
    A level that missed a latency target while other processes took CPU time (noisy) is measured once more, time
    permitting, before the sweep stops on it. No level starts that would end after TIME_LIMIT_S, estimated from the
    last level's requests/s (the next level has more streams, so rarely fewer requests per second).
    """
    if not levels:
        return 1, False, None
    last = levels[-1]
    again = bool(last["broken"] and last["noisy"] and not last.get("errors") and not last.get("remeasured"))
    concurrency = last["concurrency"] if again else 2 * last["concurrency"]
    left = time_limit_s - elapsed_s
    estimate = level_requests(concurrency, min_requests) / last["requests_per_s"] if last["requests_per_s"] else None
    in_time = estimate is not None and estimate <= left
    if last["broken"] and not (again and in_time):
        return None, False, f"{'; '.join(last['broken'])} at {streams(last['concurrency'])}"
    if concurrency > max_concurrency:
        return None, False, f"every level up to {streams(max_concurrency)} (capacity_max_concurrency) met the targets"
    if not in_time:
        about = f"about {estimate:.0f} s" if estimate is not None else "an unknown time"
        return None, False, (f"time limit: {streams(concurrency)} would take {about}, {max(left, 0):.0f} s of "
                             f"{time_limit_s:g} s left")
    return concurrency, again, None


def capacity_of(levels, targets, stopped, elapsed_s):
    """The sweep's answer: the highest concurrency whose level met both targets (0 when the first did not), its
    goodput and aggregate output tokens/s, the targets and why the sweep stopped."""
    met = [level for level in levels if level["meets_targets"]]
    best = max(met, key=lambda level: level["concurrency"]) if met else None
    return {"targets": dict(targets), "concurrency": best["concurrency"] if best else 0,
            "goodput_tokens_per_s": best["goodput_tokens_per_s"] if best else 0.0,
            "output_tokens_per_s": best["output_tokens_per_s"] if best else 0.0,
            "levels": [level["concurrency"] for level in levels], "stopped": stopped, "elapsed_s": round(elapsed_s, 1)}


# --- the engine's own batched figure (llama.cpp's tools/batched-bench) ---

# llama-server options that llama-batched-bench does not take: what the server listens on, its slots, its web UI,
# metrics endpoint, key and prompt caches; the value count of each. Every other option (model, threads, context,
# batch sizes, flash attention, cache types, load mode) is passed on as the service has it.
SERVER_ONLY = {"--host": 1, "--port": 1, "--alias": 1, "-a": 1, "--parallel": 1, "-np": 1, "--no-webui": 0,
               "--metrics": 0, "--api-key": 1, "--api-key-file": 1, "--path": 1, "--timeout": 1, "-to": 1,
               "--threads-http": 1, "--slots": 0, "--no-slots": 0, "--props": 0, "--cont-batching": 0, "-cb": 0,
               "--no-cont-batching": 0, "-nocb": 0, "--cache-reuse": 1, "--slot-save-path": 1, "--cache-ram": 1,
               "-cram": 1}


def option_value(argv, names):
    """The value of the first of the option NAMES in ARGV (`--x V` or `--x=V`), or None."""
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                return argv[i + 1]
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
    return None


def batched_bench_argv(server_argv, concurrency, prompt_tokens, output_tokens):
    """The llama-batched-bench command for the llama-server command SERVER_ARGV (the unit's): the program of the same
    build folder, the server's options without the server-only ones, and B = each of CONCURRENCY streams of
    PROMPT_TOKENS-token prompts and OUTPUT_TOKENS output tokens, JSONL output.

    A streamed request of N output tokens is one prefill, whose logits give the first token, and N - 1 decode steps;
    llama-batched-bench prefills B prompts and then decodes TG steps for all B, so TG is N - 1. Each stream's prompt
    is its own (not shared, no -pps), as the sweep's are. The context holds the largest level
    (B x (PP + TG) cells), at least the server's. Returns (argv, slots of the server or None, context of the server
    or None)."""
    server = list(server_argv)
    program_index = next(i for i, arg in enumerate(server) if arg.endswith("llama-server"))
    program = server[program_index][:-len("llama-server")] + "llama-batched-bench"
    slots, context = option_value(server, ("--parallel", "-np")), option_value(server, ("--ctx-size", "-c"))
    rest, i = [], program_index + 1
    while i < len(server):
        name = server[i].split("=", 1)[0]
        if name in SERVER_ONLY or name in ("--ctx-size", "-c"):
            i += 1 + (0 if "=" in server[i] else SERVER_ONLY.get(name, 1))
            continue
        rest.append(server[i])
        i += 1
    tg = max(output_tokens - 1, 1)
    needed = max(concurrency) * (prompt_tokens + tg)
    ctx = max(int(context) if context else 0, needed)
    argv = (server[:program_index] + [program] + rest
            + ["--ctx-size", str(ctx), "-npp", str(prompt_tokens), "-ntg", str(tg),
               "-npl", ",".join(str(c) for c in concurrency), "--output-format", "jsonl"])
    return argv, int(slots) if slots else None, int(context) if context else None


# vLLM's own batched figure, run with the service's Python: one engine of the service's engine arguments (vLLM's
# own parser; the server's HTTP options are not engine arguments and are left out), B prompts of PP random token ids
# each (new ones every run, so no prefix-cache hit) prefilled and decoded together with the sampling the server
# applies, the median of REPEATS runs after a warm-up, once with TG + 1 output tokens and once with 1 (the prefill).
# One JSON line per B, in llama-batched-bench's fields.
VLLM_BATCHED = r"""
import json, random, statistics, sys, time
from vllm import LLM
from vllm.engine.arg_utils import EngineArgs
from vllm.inputs import TokensPrompt
from vllm.utils.argparse_utils import FlexibleArgumentParser

spec = json.loads(sys.argv[1])
args, _ = EngineArgs.add_cli_args(FlexibleArgumentParser()).parse_known_args(spec["server_args"])
llm = LLM.from_engine_args(EngineArgs.from_cli_args(args))
vocab = llm.get_tokenizer().vocab_size
draw = random.Random(spec["seed"])


def seconds(streams, tokens):
    prompts = [TokensPrompt(prompt_token_ids=[draw.randrange(vocab) for _ in range(spec["pp"])])
               for _ in range(streams)]
    sampling = llm.get_default_sampling_params()
    sampling.max_tokens, sampling.ignore_eos = tokens, True
    start = time.perf_counter()
    outputs = llm.generate(prompts, sampling, use_tqdm=False)
    took = time.perf_counter() - start
    if sorted(len(out.outputs[0].token_ids) for out in outputs) != [tokens] * streams:
        sys.exit(f"vLLM did not give {tokens} tokens for each of {streams} prompts")
    return took


seconds(max(spec["pl"]), spec["tg"] + 1)
for streams in spec["pl"]:
    t = statistics.median(seconds(streams, spec["tg"] + 1) for _ in range(spec["repeats"]))
    t_pp = statistics.median(seconds(streams, 1) for _ in range(spec["repeats"]))
    t_tg = max(t - t_pp, 1e-6)
    print(json.dumps({"pp": spec["pp"], "tg": spec["tg"], "pl": streams, "t_pp": round(t_pp, 4),
                      "t_tg": round(t_tg, 4), "t": round(t, 4), "speed_pp": round(streams * spec["pp"] / t_pp, 3),
                      "speed_tg": round(streams * spec["tg"] / t_tg, 3),
                      "speed": round(streams * (spec["pp"] + spec["tg"]) / t, 3)}), flush=True)
"""

def vllm_batched_argv(server_argv, concurrency, prompt_tokens, output_tokens, repeats=3, seed=0):
    """vLLM's own batched run (VLLM_BATCHED) for the server command SERVER_ARGV (the unit's `python -m
    vllm.entrypoints.openai.api_server ...`): the same Python and engine arguments, B = each of CONCURRENCY streams of
    PROMPT_TOKENS-token prompts and OUTPUT_TOKENS output tokens (TG = OUTPUT_TOKENS - 1, as for llama-batched-bench).
    Returns (argv, the server's --max-num-seqs or None, its --max-model-len or None)."""
    server = list(server_argv)
    index = server.index(VLLM_SERVER_MODULE)
    spec = {"server_args": server[index + 1:], "pp": prompt_tokens, "tg": max(output_tokens - 1, 1),
            "pl": list(concurrency), "repeats": repeats, "seed": seed}
    slots, context = option_value(server, ("--max-num-seqs",)), option_value(server, ("--max-model-len",))
    argv = server[:index - 1] + ["-c", VLLM_BATCHED, json.dumps(spec)]
    return argv, int(slots) if slots else None, int(context) if context else None


def parse_batched_bench(text):
    """The rows of llama-batched-bench's JSONL output (one JSON object per line with pp, tg, pl, t_pp, t_tg, t and the
    speeds; other lines are the program's log), or VLLM_BATCHED's. ValueError when there is none."""
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{") and '"pl"' in line:
            rows.append(json.loads(line))
    if not rows:
        raise ValueError("no result line in the engine's own benchmark's output")
    return rows


def engine_output_rate(row):
    """Output tokens/s of one llama-batched-bench row, prefill included: B streams of TG + 1 output tokens each (the
    prefill gives the first) in T_PP + T_TG seconds, as a streamed request's output tokens per its whole time."""
    return round(row["pl"] * (row["tg"] + 1) / row["t"], 3)


def _ratio(service, engine):
    return round(service / engine, 3) if service and engine else None


def phase_ratios(level, row):
    """The service's prefill and decode against the engine's own run ROW at the same streams, each as a ratio:
    prefill by the engine's own timing of the served prompts (RV(levels[].engine_prefill_tokens_per_s) of
    inference_benchmark) and as a client sees it (prompt tokens over TTFT p50, which also holds HTTP, the chat
    template, queueing and the first decode step), against ROW's prefill (B prompts over T_PP); decode per stream
    (the requests' median) against ROW's lockstep decode per stream (S_TG / B)."""
    prompt, ttft = level.get("prompt_tokens_mean"), (level.get("ttft_ms") or {}).get("p50")
    client = round(1000.0 * prompt / ttft, 3) if prompt and ttft else None
    engine_pp, engine_tg = round(row["speed_pp"], 3), round(row["speed_tg"] / row["pl"], 3)
    service_pp = level.get("engine_prefill_tokens_per_s")
    service_tg = (level.get("decode_tokens_per_s") or {}).get("p50")
    return {"prefill": {"service_tokens_per_s": service_pp, "client_tokens_per_s": client,
                        "engine_tokens_per_s": engine_pp, "ratio": _ratio(service_pp, engine_pp),
                        "client_ratio": _ratio(client, engine_pp)},
            "decode": {"service_tokens_per_s": service_tg, "engine_tokens_per_s": engine_tg,
                       "ratio": _ratio(service_tg, engine_tg)}}


def compare_with_engine(levels, rows, slots, limit_percent, engine_noisy=False, tool="llama-batched-bench"):
    """Per level of the sweep: the service's aggregate output tokens/s against the engine's own at the same number of
    streams (RV of engine_batched_bench, comparison[]): gap_percent = 100 x (1 - service / engine), verdict
    within (|gap| at most LIMIT_PERCENT), beyond or not measured, the reason of a gap beyond it (ENGINE_NOISY:
    other processes took CPU time from the engine's own run, TOOL), and the prefill and decode apart (phase_ratios)."""
    by_streams = {row["pl"]: row for row in rows}
    out = []
    for level in levels:
        count, row = level["concurrency"], by_streams.get(level["concurrency"])
        entry = {"concurrency": count, "service_tokens_per_s": level["output_tokens_per_s"],
                 "engine_tokens_per_s": engine_output_rate(row) if row else None,
                 "engine_decode_tokens_per_s": round(row["speed_tg"], 3) if row else None,
                 "gap_percent": None, "verdict": "not measured", "reason": None,
                 "phases": phase_ratios(level, row) if row else None}
        if row:
            gap = 100.0 * (1 - level["output_tokens_per_s"] / entry["engine_tokens_per_s"])
            entry["gap_percent"] = round(gap, 1) + 0.0  # no -0.0
            entry["verdict"] = "within" if abs(gap) <= limit_percent else "beyond"
            if entry["verdict"] == "beyond":
                entry["reason"] = gap_reason(level, gap, slots, engine_noisy, tool)
        else:
            entry["reason"] = f"{tool} gave no row for {streams(count)}"
        out.append(entry)
    return out


def gap_reason(level, gap, slots, engine_noisy=False, tool="llama-batched-bench"):
    """Why the service's aggregate output tokens/s is GAP percent below (or above) the engine's own: every cause the
    measurement shows (fewer slots than streams, failed requests, other processes), else what differs between the
    two by design."""
    count, causes = level["concurrency"], []
    if gap > 0 and slots and count > slots:
        causes.append(f"the service decodes at most {streams(slots)} together (--parallel {slots}): the other "
                      f"{count - slots} wait for a slot")
    if level["errors"]:
        causes.append(f"{level['errors']} of the service's requests failed")
    if level["noisy"] or engine_noisy:
        which = " and ".join(name for name, flag in (("the service's level", level["noisy"]),
                                                    (tool, engine_noisy)) if flag)
        causes.append(f"other processes took CPU time during {which}")
    if causes:
        return "; ".join(causes)
    if gap < 0:
        return ("the service was faster than the engine's own run right after it: the host's speed drifts between "
                "runs (docs/results.md)")
    return ("serving: HTTP and streaming, and each new prompt prefilled between the other streams' decode steps "
            f"({tool} prefills all B prompts, then decodes the B streams in lockstep)")


# --- the report ---

def _cell(value):
    return "-" if value is None else value


def report_markdown(host, result, engine, engine_name):
    """Markdown lines of a host's capacity: the targets, the capacity and goodput, why the sweep stopped, a row per
    level with the engine's own batched figure beside it (ENGINE, the engine_batched_bench result or None) and what
    is compared for ENGINE_NAME when nothing is."""
    cap = result["capacity"]
    targets = cap["targets"]
    levels = result["levels"]
    first = levels[0] if levels else {}
    prompt = (f"{result['prompt_tokens']}-token synthetic prompts" if result.get("prompt_tokens")
              else "the built-in questions")
    lines = [f"## Capacity of {host} at the targets", "",
             f"Targets: TTFT p95 at most {targets['ttft_p95_ms']:g} ms, ITL p95 at most {targets['itl_p95_ms']:g} ms. "
             f"Workload: {prompt} (about {_cell(first.get('prompt_tokens_mean'))} tokens with the chat template), "
             f"{result['max_tokens']} output tokens{' (EOS ignored)' if result.get('ignore_eos') else ''}, a prompt "
             "of its own per request, each stream sending its next request when the last one ended (closed loop).", ""]
    if cap["concurrency"]:
        lines.append(f"**{host} serves {cap['concurrency']} concurrent stream(s) within the targets**, goodput "
                     f"{cap['goodput_tokens_per_s']} output tokens/s (of {cap['output_tokens_per_s']} in all).")
    else:
        lines.append(f"**{host} meets the targets at no concurrency**: one stream alone misses them.")
    lines += [f"The sweep stopped: {cap['stopped']} ({cap['elapsed_s']} s).", ""]
    by_streams = {entry["concurrency"]: entry for entry in (engine or {}).get("comparison", [])}
    lines += ["| streams | requests | errors | output tok/s | goodput tok/s | requests within targets | TTFT p50 ms | "
              "TTFT p95 ms | ITL p50 ms | ITL p95 ms | engine's own tok/s | service below own % | note |",
              "|" + "---|" * 13]
    for level in levels:
        entry = by_streams.get(level["concurrency"], {})
        notes = list(level.get("broken") or [])
        if level.get("remeasured"):
            notes.append("measured again (noisy)")
        elif level.get("noisy"):
            notes.append("noisy")
        if entry.get("reason"):
            notes.append(entry["reason"])
        mark = "**" if level["concurrency"] == cap["concurrency"] else ""
        cells = [f"{mark}{level['concurrency']}{mark}", level["requests"], level["errors"],
                 level["output_tokens_per_s"], level.get("goodput_tokens_per_s"),
                 f"{level.get('requests_within_targets')} of {level['requests']}", level["ttft_ms"]["p50"],
                 level["ttft_ms"]["p95"], level["itl_ms"]["p50"], level["itl_ms"]["p95"],
                 _cell(entry.get("engine_tokens_per_s")), _cell(entry.get("gap_percent")),
                 "; ".join(notes) or "-"]
        lines.append("| " + " | ".join(str(cell) for cell in cells) + " |")
    lines.append("")
    lines.append(engine_sentence(engine, engine_name))
    return lines


def engine_sentence(engine, engine_name):
    """One paragraph on the engine's own batched figure: what ran and how the service compares, or why none."""
    if not getattr(ENGINES.get(engine_name), "batched_bench", False):
        return (f"Engine's own batched figure: none compared. {engine_name} has no batched benchmark of its own that "
                "runs the served stack (transformers ships none; a generate() batch is not the code path of "
                "`transformers serve`), so the service's figures stand alone.")
    if not engine or engine.get("skipped"):
        return f"Engine's own batched figure: not measured ({(engine or {}).get('msg', 'not run')})."
    comparison = engine["comparison"]
    beyond = [entry for entry in comparison if entry["verdict"] == "beyond"]
    measured = [entry for entry in comparison if entry["verdict"] != "not measured"]
    tool = engine.get("tool", "llama-batched-bench")
    if tool == "llama-batched-bench":
        program = next(i for i, arg in enumerate(engine["argv"]) if arg.endswith("llama-batched-bench"))
        command = " ".join(["llama-batched-bench"] + engine["argv"][program + 1:])
        what = f"llama-batched-bench of the same build, GGUF, threads, CPUs and batch sizes (`{command}`"
    else:
        spec = json.loads(engine["argv"][-1])
        what = (f"vLLM's offline engine ({tool}) in the same Python with the server's engine arguments "
                f"(`{' '.join(spec['server_args'])}`), CPUs and environment, the median of {spec['repeats']} runs "
                "of new prompts given at once")
    text = (f"Engine's own batched figure: {what}, {engine['seconds']} s right after the sweep), B streams of "
            f"{engine['prompt_tokens']}-token prompts and {engine['output_tokens']} output tokens each, output tokens/s "
            f"with the prefill included. The service is within {engine['max_gap_percent']:g} % of it at "
            f"{len(measured) - len(beyond)} of {len(measured)} levels")
    if beyond:
        text += "; beyond it at " + "; ".join(f"{streams(entry['concurrency'])} ({entry['gap_percent']} %: "
                                             f"{entry['reason']})" for entry in beyond)
    return text + "." + phases_sentence(comparison, tool)


def phases_sentence(comparison, tool):
    """' At one stream, ...': the first level's prefill and decode against TOOL's, or '' when it was not measured."""
    entry = next((entry for entry in comparison if entry.get("phases")), None)
    if entry is None:
        return ""
    prefill, decode = entry["phases"]["prefill"], entry["phases"]["decode"]
    own = (f"{prefill['service_tokens_per_s']} tokens/s by the engine's own timing, {prefill['ratio']} of "
           f"{tool}'s {prefill['engine_tokens_per_s']}; " if prefill["ratio"] else "")
    return (f" At {streams(entry['concurrency'])}, prefill {own}{prefill['client_tokens_per_s']} tokens/s as the "
            f"client sees it (prompt over TTFT p50, which holds HTTP, the chat template and the first decode step "
            f"too), {prefill['client_ratio']} of it; decode {decode['service_tokens_per_s']} tokens/s per stream, "
            f"{decode['ratio']} of {tool}'s {decode['engine_tokens_per_s']}.")
