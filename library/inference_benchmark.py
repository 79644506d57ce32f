#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module inference_benchmark: smoke benchmark of an OpenAI-compatible chat completions endpoint."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: inference_benchmark
short_description: Measure TTFT, TPOT and decode speed of an OpenAI-compatible LLM endpoint
description:
  - Sends streaming chat completions (C(POST /v1/chat/completions) with C(stream=true)) to the service and
    times each one from just before the connection is opened, on the managed host itself.
  - Per request it measures TTFT (time to the first content delta), end-to-end latency (to the end of the
    stream), the output token count, the inter-token latencies (ITL, gaps between content deltas), TPOT
    (time per output token after the first, (e2e - ttft) / (tokens - 1)) and the decode speed
    (tokens - 1) / (e2e - ttft) in tokens/s. Reasoning deltas (C(reasoning_content)) count as content.
  - Output tokens come from the C(usage.completion_tokens) of the stream (asked for with
    C(stream_options.include_usage)); a server that sends no usage is counted by content deltas, which
    undercounts when one delta carries several tokens. RV(token_count_source) says which was used.
  - Runs C(warmup) unrecorded requests first, then C(requests) requests at each level of C(concurrency).
  - Every request of a run (warm-up included) sends its own prompt, so no request is a prompt-cache hit of
    another (llama.cpp reuses the longest common token prefix of a slot's previous prompt). O(prompts) are used in
    order; a prompt sent a second time is prefixed with its round number, C((2) ). A synthetic prompt
    (O(prompt_tokens)) is a different order of its words per request, starting with a different word.
  - Nor is any request a cache hit of an earlier run, though a server keeps its prompt cache between runs (measured, a
    llama.cpp server that had run the same sequence before reused 18 of 19 prompt tokens per request, TTFT
    51-69 ms against 180 ms). Each run draws a O(prompt_seed), which puts three words before each O(prompts)
    entry (C(time year day. ...), a few tokens; the first differs from request to request) or orders a synthetic
    prompt's words differently (same length). The same seed gives the same prompts, so RV(prompt_seed) repeats a run.
  - Where the engine reports how many prompt tokens it evaluated (llama.cpp's server sends C(timings.prompt_n)
    and C(timings.cache_n) with the last event of a stream, C(tools/server/README.md)), RV(levels[].prompt_tokens_evaluated_mean)
    and RV(levels[].prompt_tokens_cached_mean) show them. Every request of every client shares the chat
    template's opening (C(<|im_start|>user) and a newline, 3 tokens for Qwen3), which the engine reuses; more than
    5 % of a level's prompt tokens reused is reported as a warning (TTFT partly a cache hit). Other engines
    report no counter (null); the unique prompts are then the guarantee.
  - Records the CPU time of the host (C(/proc/stat), proc(5)) while it waits to start and during each level,
    and splits it into the engine process (O(engine_pid), C(/proc/PID/stat) utime+stime), this benchmark
    (C(os.times)) and everything else. Before the first request it waits up to O(settle_timeout) seconds for
    the other processes to use less than O(busy_limit) CPUs; a level during which they used more, or during
    which steal time (a hypervisor running other guests on these CPUs) exceeded 5 %, is marked C(noisy).
  - Percentiles are Python C(statistics.quantiles) with C(n=100) and C(method="inclusive"), the linear interpolation
    between closest ranks that C(numpy.percentile) uses by default; one value is its own percentile.
  - With O(capacity), the levels are a sweep instead of O(concurrency), 1, 2, 4, ... streams, each a closed loop (a
    stream sends its next request when its last one ended) of max(2 x streams, O(capacity_min_requests)) requests,
    until a level breaks a target (O(target_ttft_p95_ms), O(target_itl_p95_ms) for the p95 of TTFT and of the gaps
    between tokens) or has a failed request, or O(capacity_max_concurrency) or O(capacity_time_limit) is reached.
    RV(capacity) is the highest concurrency whose level met both targets, with its goodput, the output tokens/s of
    the requests that met both (DistServe, Zhong et al., OSDI 2024, measures serving by such goodput; vLLM's
    C(vllm bench serve) and NVIDIA's AIPerf count it in requests/s).
  - Also records the load average (C(os.getloadavg)) before and after. On a small machine another busy
    process lowers decode speed more than any tuning changes it (measured on 2 vCPUs, 3-4x slower decode).
  - Never changes the host, so C(changed) is always false, also when O(report_path) is written (the report
    is an output of the measurement, not managed state). In check mode no request is sent and the result
    is RV(skipped).
  - Only the Python standard library is used (C(http.client), C(concurrent.futures)), so it runs with the
    managed host's system python3.
version_added: "0.1.0"
author: llmtune project
options:
  url:
    description:
      - Base URL of the service, without C(/v1) (a trailing C(/v1) is ignored). C(http) or C(https).
    type: str
    default: http://127.0.0.1:8000
  model:
    description:
      - Model id sent in each request. Default the first id listed by C(GET /v1/models).
    type: str
  api_key:
    description:
      - Sent as the C(Authorization) header (C(Bearer) token) when set.
    type: str
  prompts:
    description:
      - User messages to send, one per request, cycled. Default 50 short everyday questions, half in
        Chinese and half in English, as users ask a small chat model.
    type: list
    elements: str
  prompt_seed:
    description:
      - Seed of this run's prompts (see the description); default a new random one per run, so no two runs send
        the same prompts. 0 sends O(prompts) untagged and synthetic prompts in their base order.
    type: int
  prompt_tokens:
    description:
      - Send one fixed-length synthetic prompt instead of O(prompts), for runs comparable across hosts and
        settings. It is that many common English words, each one token of the Qwen2/Qwen3 BPE tokenizer
        (other tokenizers give about as many tokens). The chat template adds its own tokens (about 10 for
        Qwen3); RV(levels[].prompt_tokens_mean) reports what the server counted.
      - Mutually exclusive with O(prompts).
    type: int
  max_tokens:
    description:
      - C(max_tokens) of each request, in tokens. Generation may stop earlier at an end-of-sequence token,
        unless O(ignore_eos) is set.
    type: int
    default: 64
  ignore_eos:
    description:
      - Ask the engine to generate exactly O(max_tokens) tokens, ignoring end-of-sequence, so every request
        decodes the same length, in the request fields the adapter of O(server) names (its C(fixed_length)), so
        C(ignore_eos) for llama.cpp's C(llama-server) and vLLM;
        for C(transformers serve), which rejects unknown fields (HTTP 422), a C(generation_config) JSON string
        setting C(min_new_tokens) and C(max_new_tokens), from which it builds the request's C(GenerationConfig)
        (so sampling is then greedy).
      - A request whose stream reports another count of output tokens (C(usage.completion_tokens)) fails and is
        counted in RV(levels[].errors) with the count and C(finish_reason) the engine gave, since every figure rests
        on one output length.
    type: bool
    default: false
  server:
    description:
      - Server the requests go to, for the one request field outside the OpenAI API (O(ignore_eos)).
    type: str
    default: transformers
    choices: [llama_cpp, transformers, vllm]
  decode_upper_bound:
    description:
      - Roofline of decode for this host and model in tokens/s (memory bandwidth / bytes read per decoded
        token, from the C(memory_bandwidth) module). Fills RV(roofline).
    type: float
  requests:
    description:
      - Recorded requests at each concurrency level.
    type: int
    default: 8
  concurrency:
    description:
      - Concurrency levels to run, each with O(requests) requests and that many requests in flight.
      - RV(summary) uses level 1 (or the lowest level when 1 is not listed).
      - Not used with O(capacity), whose sweep chooses the levels.
    type: list
    elements: int
    default: [1]
  warmup:
    description:
      - Unrecorded requests sent one at a time before the first level (first-request costs such as
        lazy initialisation and page faults in the weights would otherwise skew TTFT).
    type: int
    default: 1
  timeout:
    description:
      - Seconds to wait for the connection and then for each piece of the stream.
    type: float
    default: 120
  engine_pid:
    description:
      - PID of the engine process (for example the C(MainPID) of its systemd unit), to tell its CPU time from
        other processes'. 0 when unknown; the CPU time of the engine then counts as other processes' during
        the levels (the wait before the first request is still meaningful).
    type: int
    default: 0
  more_urls:
    description:
      - Base URLs of further engines of the same service (the inference_service role's layout C(per_node), one
        engine per NUMA node). Request I of a level goes to engine I modulo their number, O(url) first, as clients
        spread evenly over them; the level's figures are the aggregate, and RV(levels[].engines) gives each
        engine's. With O(twin_url), O(more_twin_urls) names each of these engines' twin.
    type: list
    elements: str
    default: []
  more_engine_pids:
    description:
      - PIDs of the engines of O(more_urls), counted with O(engine_pid) as engine CPU time.
    type: list
    elements: int
    default: []
  capacity:
    description:
      - Sweep the concurrency for the service's capacity at O(target_ttft_p95_ms) and O(target_itl_p95_ms) (see the
        description) instead of running O(concurrency) with O(requests) each. Not with O(twin_url), as the sweep's
        closed loop has no paired rounds.
      - Every level is reported in RV(levels) with its goodput and verdict; a level whose requests all failed fails
        the task only when it is the first.
    type: bool
    default: false
  target_ttft_p95_ms:
    description:
      - With O(capacity), the most milliseconds the p95 of a level's TTFT may take, and one request's TTFT for its
        output tokens to count as goodput. Needed with O(capacity).
    type: float
  target_itl_p95_ms:
    description:
      - With O(capacity), the most milliseconds the p95 of a level's inter-token latencies (the gaps between content
        deltas of all its requests) may take, and the p95 of one request's own gaps for its output tokens to count
        as goodput. Needed with O(capacity).
    type: float
  capacity_max_concurrency:
    description:
      - With O(capacity), the most streams a level has; the sweep ends after the largest power of two up to it.
    type: int
    default: 64
  capacity_min_requests:
    description:
      - With O(capacity), the fewest requests of a level (at least twice its streams), enough for a p95 of TTFT.
    type: int
    default: 20
  capacity_time_limit:
    description:
      - With O(capacity), seconds the sweep may take. No level starts that would end after it, estimated from the
        previous level's requests/s; a level started runs to its end.
    type: float
    default: 600
  twin_url:
    description:
      - Base URL of a second server to compare with the first, request by request; meant for the same engine and
        settings run directly, outside systemd (library/engine_direct.py). Each level then runs in rounds of as many
        requests as its concurrency; a round's prompts go to O(url) and then to O(twin_url), the order swapped
        every round, so both see the same prompts (two processes, neither has the other's prompt cache) and the
        same state of the host. Warm-up requests go to both.
      - The twin's figures are in RV(twin), and each round gives one gap between the two; RV(twin.gap_percent)
        holds their median and range. Drift of the host between two runs (measured on a 2-vCPU VM, the same
        engine 18 % faster or 41 % slower than itself minutes apart) cancels out of a paired gap.
      - At a concurrency above 1 a round is a closed batch (the next round starts when its slowest request
        ends), unlike the continuous load of a run without a twin.
    type: str
  twin_engine_pid:
    description:
      - PID of the twin's engine, counted with O(engine_pid) as engine CPU time. 0 when unknown.
    type: int
    default: 0
  more_twin_urls:
    description:
      - With O(twin_url) and O(more_urls), the twin of each engine of O(more_urls), in the same order (one twin
        per engine, so several engines are compared with as many twins). A request goes to engine I modulo their
        number on both sides, so each engine and its own twin answer the same prompts.
    type: list
    elements: str
    default: []
  more_twin_engine_pids:
    description:
      - PIDs of the twins of O(more_twin_urls), counted as engine CPU time.
    type: list
    elements: int
    default: []
  twin_max_gap_percent:
    description:
      - Percent the service may be slower than its twin (median of the rounds, decode and end to end) for
        RV(twin.gap_percent.verdict) C(within). Beyond it the verdict is C(over) only when every round found the
        service slower, else C(unresolved), as the rounds' own spread is wider than the gap (on a 2-vCPU VM single
        rounds of one engine against itself ranged -72 to +32 %).
    type: float
    default: 5.0
  twin_max_rounds:
    description:
      - With O(twin_url), the most paired rounds of a level. While RV(twin.gap_percent.verdict) is not C(within)
        after the planned rounds (O(requests) divided by the concurrency), rounds of new prompts are added, up to
        this many in all, as a gap that is noise shrinks with more rounds, a cost of the unit stays. 0, or a number
        not above the planned rounds, adds none.
    type: int
    default: 0
  twin_deadline:
    description:
      - With O(twin_url), the time (seconds since the epoch, the host's clock) after which no paired round is added
        (O(twin_max_rounds)); the planned rounds run anyway. The auto-tune gives each row a share of its time budget
        so that the rounds of one row do not use up the time of the rows after it. 0 sets no deadline.
    type: float
    default: 0
  busy_limit:
    description:
      - CPUs (in units of one CPU, for example C(0.25) for a quarter of one) that other processes may keep busy
        before the run starts and during a level without the level being marked noisy.
    type: float
    default: 0.25
  settle_timeout:
    description:
      - Seconds to wait before the first request for other processes to stay under O(busy_limit) (sampled in
        2-second windows). 0 does not wait; the state found is recorded either way.
    type: float
    default: 60
  lock_path:
    description:
      - File locked (flock(2), exclusive) for the whole run, so two benchmarks of a host never measure at once. A
        benchmark whose C(ansible-playbook) was killed goes on to its end on the host (over SSH without a terminal
        nothing signals it; C(podman exec) neither), and a rerun started meanwhile would share the engine with it.
        The holder's PID is written into the file. Its folder is made root-only (0700) when missing, and the file
        is opened without following a symbolic link, so no other local user can hold or replace it. Empty locks
        nothing.
    type: path
    default: /run/llmtune/benchmark.lock
  lock_timeout:
    description:
      - Seconds to wait for another benchmark to release O(lock_path) before failing, naming its PID.
    type: float
    default: 1800
  include_usage:
    description:
      - Send C(stream_options.include_usage=true) so the server reports exact token counts. Turn off only
        for a server that rejects the field.
    type: bool
    default: true
  baseline:
    description:
      - A previous result of this module (or its RV(summary)) to compare with; fills RV(gain).
    type: dict
  report_path:
    description:
      - Write the result as JSON to this file, creating its parent directories; atomically and durably (a
        temporary file, fsync, rename, fsync of the folder), so a reader sees the old report or the new one.
      - Written only when every level had at least one answered request (a failed measurement never replaces a
        good one); written also when O(fail_below) fails the task, since the figures are valid.
    type: path
  tuning_state_path:
    description:
      - The llmtune state file (see the rollback role). Its recorded settings are the OS settings llmtune has
        changed and not rolled back; they are listed in RV(host_state.tuned_settings), so a baseline taken on an
        already tuned host says so.
    type: path
    default: /var/lib/llmtune/state.json
  fail_below:
    description:
      - "Minimum ratio to O(baseline) per RV(summary) figure, for example C({decode_tokens_per_s: 0.9}). The
        ratio is the RV(gain) (latencies baseline/new, rates new/baseline; above 1 is better). A figure below
        its minimum fails the task with a message naming the figure, its value, the baseline and the ratio."
      - Needs O(baseline). Checked before any request is sent.
    type: dict
notes:
  - The task fails when every request of a level fails (unreachable service, HTTP errors, timeouts); failed
    requests of a partly failing level are counted in RV(levels[].errors) and reported as a warning.
seealso:
  - name: OpenAI API, streaming chat completions
    link: https://platform.openai.com/docs/api-reference/chat-streaming
"""

EXAMPLES = r"""
- name: Baseline of the untuned service
  inference_benchmark:
    url: http://127.0.0.1:8000
    max_tokens: 64
    requests: 8
    concurrency: [1, 2]
    report_path: /var/lib/llmtune/bench/baseline.json
  register: llmtune_baseline

- name: Validate the tuned service, fail if decode speed dropped below 90 % of the baseline
  inference_benchmark:
    url: http://127.0.0.1:8000
    model: /opt/llmtune/models/qwen3-0.6b
    requests: 8
    concurrency: [1, 2]
    baseline: "{{ llmtune_baseline }}"
    fail_below:
      decode_tokens_per_s: 0.9
      ttft_ms_p50: 0.8
    report_path: /var/lib/llmtune/bench/tuned.json

- name: How many streams the service serves within 2 s TTFT p95 and 100 ms ITL p95
  inference_benchmark:
    prompt_tokens: 128
    max_tokens: 32
    ignore_eos: true
    capacity: true
    target_ttft_p95_ms: 2000
    target_itl_p95_ms: 100
    capacity_time_limit: 300
  register: capacity

- name: Smoke test with own prompts
  inference_benchmark:
    prompts: ["What is a C-state?", "用一句话解释什么是 NUMA。"]
    max_tokens: 32
    requests: 4
    warmup: 0
"""

RETURN = r"""
url:
  description: Base URL used.
  returned: success
  type: str
model:
  description: Model id sent.
  returned: success
  type: str
skipped:
  description: True in check mode, where no request is sent.
  returned: check mode
  type: bool
token_count_source:
  description: C(usage) when every token count came from the server's usage, C(deltas) when all were
    counted as content deltas, C(mixed) otherwise.
  returned: success
  type: str
percentile_method:
  description: How percentiles were computed.
  returned: success
  type: str
  sample: statistics.quantiles(n=100, method='inclusive')
max_tokens:
  description: C(max_tokens) sent with each request.
  returned: success
  type: int
prompt_tokens:
  description: O(prompt_tokens) (null when O(prompts) were sent).
  returned: success
  type: int
ignore_eos:
  description: O(ignore_eos).
  returned: success
  type: bool
prompt_seed:
  description: The run's O(prompt_seed), drawn when not given; pass it to send the same prompts again.
  returned: success
  type: int
started:
  description: UTC start time of the run, ISO 8601.
  returned: success
  type: str
noisy:
  description: True when any level is marked noisy (see RV(levels[].noisy)); such figures are not comparable.
  returned: success
  type: bool
host_load:
  description: Host load while measuring.
  returned: success
  type: dict
  contains:
    cpus:
      description: Logical CPUs, C(os.cpu_count).
      type: int
    other_cpus_before:
      description: CPUs kept busy by other processes in the last 2-second window before the first request.
      type: float
    settle_wait_s:
      description: Seconds waited for other processes to settle under O(busy_limit).
      type: float
    lock_wait_s:
      description: Seconds waited for another benchmark of the host to release O(lock_path).
      type: float
    loadavg_before:
      description: 1, 5 and 15-minute load averages before the first request.
      type: list
      elements: float
    loadavg_after:
      description: The same after the last request.
      type: list
      elements: float
levels:
  description: Figures per concurrency level, in the order of O(concurrency). Percentile keys are
    C(p50), C(p95), C(p99); a figure without data (all requests failed) is null.
  returned: success
  type: list
  elements: dict
  contains:
    concurrency:
      description: Requests in flight.
      type: int
    requests:
      description: Requests sent.
      type: int
    errors:
      description: Requests that failed (connection, HTTP status, timeout, empty stream).
      type: int
    error_messages:
      description: Up to 5 distinct error messages.
      type: list
      elements: str
    wall_s:
      description: Seconds from the first request sent to the last stream ended.
      type: float
    ttft_ms:
      description: Time to first token in milliseconds, C(p50), C(p95), C(p99).
      type: dict
    itl_ms:
      description: Inter-token latency in milliseconds (gaps between content deltas of all requests),
        C(p50), C(p95).
      type: dict
    tpot_ms:
      description: Time per output token after the first, per request, in milliseconds, C(p50), C(p95).
      type: dict
    e2e_ms:
      description: End-to-end request latency in milliseconds, C(p50), C(p95).
      type: dict
    decode_tokens_per_s:
      description: Per-request decode speed in tokens/s, C(p50) and C(mean).
      type: dict
    output_tokens:
      description: Output tokens of all successful requests.
      type: int
    prompt_tokens_mean:
      description: Mean prompt tokens per request from the server's usage (null without usage).
      type: float
    prompt_tokens_evaluated_mean:
      description: Mean prompt tokens the engine reports it evaluated (llama.cpp's C(timings.prompt_n));
        null when the engine reports no counter.
      type: float
    prompt_tokens_cached_mean:
      description: Mean prompt tokens the engine reports it reused from its cache (C(timings.cache_n)); null
        when the engine reports no counter.
      type: float
    engine_prefill_tokens_per_s:
      description: Prompt tokens/s of the engine's own prefill timing, the evaluated prompt tokens of all requests
        over their prefill milliseconds (llama.cpp's C(timings.prompt_n) and C(timings.prompt_ms)); the prefill
        without HTTP, chat template, queueing or the first decode step that TTFT holds. Null when the engine
        reports no timing.
      type: float
    cpu:
      description: CPU use during the level, in CPUs (1.0 = one CPU busy the whole time), from C(/proc/stat).
      type: dict
      contains:
        engine:
          description: The engine processes (O(engine_pid) and O(twin_engine_pid)); null when one is unknown.
          type: float
        benchmark:
          description: This benchmark's own threads.
          type: float
        other:
          description: Everything else (the engine too when O(engine_pid) is 0).
          type: float
        steal_percent:
          description: Steal time, percent of all CPU time.
          type: float
    noisy:
      description: True when other processes used more than O(busy_limit) CPUs or steal exceeded 5 %.
      type: bool
    output_tokens_per_s:
      description: Aggregate throughput, output tokens of the level divided by RV(levels[].wall_s).
      type: float
    requests_per_s:
      description: Successful requests divided by RV(levels[].wall_s).
      type: float
    samples:
      description: Per successful request, in start order, C(ttft_ms), C(e2e_ms), C(output_tokens),
        C(decode_tokens_per_s) and C(itl_ms_p95), the p95 of its own inter-token gaps (null with one token).
      type: list
      elements: dict
    goodput_tokens_per_s:
      description: With O(capacity), output tokens of the requests that met both targets per second of the level.
      returned: with O(capacity)
      type: float
    requests_within_targets:
      description: With O(capacity), the requests that met both targets.
      returned: with O(capacity)
      type: int
    meets_targets:
      description: With O(capacity), true when the level's TTFT p95 and ITL p95 are within the targets and no
        request failed.
      returned: with O(capacity)
      type: bool
    broken:
      description: With O(capacity), what the level missed (a p95 above its target, failed requests); empty when it
        met both.
      returned: with O(capacity)
      type: list
      elements: str
    remeasured:
      description: With O(capacity), true for a level measured a second time because it broke a target while noisy
        (the second measurement is the one reported).
      returned: with O(capacity) and a level measured again
      type: bool
    engines:
      description: With O(more_urls), each engine's share of the level, O(url) first; C(url), C(requests),
        C(errors), C(output_tokens), C(ttft_ms_p50), C(decode_tokens_per_s_p50) (null without successes).
      returned: with O(more_urls)
      type: list
      elements: dict
capacity:
  description: With O(capacity), the sweep's answer.
  returned: with O(capacity)
  type: dict
  contains:
    targets:
      description: C(ttft_p95_ms) and C(itl_p95_ms), the targets.
      type: dict
    concurrency:
      description: The highest number of streams whose level met both targets with no failed request; 0 when even
        one stream missed them.
      type: int
    goodput_tokens_per_s:
      description: Goodput of that level (0 without one).
      type: float
    output_tokens_per_s:
      description: Aggregate output tokens/s of that level (0 without one).
      type: float
    levels:
      description: The streams of every level measured, in order.
      type: list
      elements: int
    stopped:
      description: Why the sweep ended (the target broken and at how many streams, the most streams, or the time
        limit).
      type: str
    elapsed_s:
      description: Seconds the sweep took.
      type: float
  sample:
    targets: {ttft_p95_ms: 2000, itl_p95_ms: 100}
    concurrency: 4
    goodput_tokens_per_s: 58.2
    output_tokens_per_s: 60.1
    levels: [1, 2, 4, 8]
    stopped: "TTFT p95 2710.2 ms > 2000 ms at 8 streams"
    elapsed_s: 141.3
summary:
  description: Figures of concurrency level 1 (or the lowest level), flat, for comparison across runs.
  returned: success
  type: dict
  sample:
    concurrency: 1
    ttft_ms_p50: 61.2
    ttft_ms_p95: 70.3
    itl_ms_p50: 39.8
    tpot_ms_p50: 40.1
    e2e_ms_p50: 2588.0
    decode_tokens_per_s: 24.9
    decode_tokens_per_s_mean: 24.7
    output_tokens_per_s: 24.2
    requests_per_s: 0.38
    errors: 0
gain:
  description: Ratios to O(baseline) per RV(summary) figure; above 1 is better. Latencies (C(_ms)) are
    baseline/new, rates (C(_per_s)) new/baseline. Empty without a baseline.
  returned: success
  type: dict
  sample: {decode_tokens_per_s: 1.18, ttft_ms_p50: 1.25}
worse:
  description: The figures of TTFT p50 and p95, TPOT p50, end-to-end p50 and decode tokens/s that are worse than
    O(baseline), by any amount, the worst first; C(percent) is how much longer (latencies) or slower (decode).
  returned: with O(baseline)
  type: list
  elements: dict
  sample: [{figure: ttft_ms_p95, name: TTFT p95, baseline: 269.3, new: 344.9, percent: 28.1}]
roofline:
  description: Measured decode speed (RV(summary.decode_tokens_per_s)) against O(decode_upper_bound).
  returned: when O(decode_upper_bound) is set
  type: dict
  contains:
    upper_bound_tokens_per_s:
      description: O(decode_upper_bound).
      type: float
    percent:
      description: Measured decode tokens/s as a percent of the upper bound (null without a measurement).
      type: float
  sample: {upper_bound_tokens_per_s: 38.2, percent: 41.5}
twin:
  description: The twin's figures (O(twin_url)) and the paired gaps between the service and its twin.
  returned: when O(twin_url) is set
  type: dict
  contains:
    url:
      description: O(twin_url).
      type: str
    urls:
      description: Every twin, O(twin_url) and then O(more_twin_urls).
      type: list
      elements: str
    levels:
      description: The twin's levels, as RV(levels) (with several twins, C(engines) gives each one's share), each
        with its C(gap_percent).
      type: list
      elements: dict
    summary:
      description: The twin's RV(summary).
      type: dict
    gap_percent:
      description: >-
        Paired gaps of the level of RV(summary): per round, how many percent the service (O(url)) is slower than
        its twin, for C(decode_tokens_per_s) (1 - service/twin, of the round's mean), C(ttft_ms) and C(e2e_ms)
        (service/twin - 1); each as C(median), C(min) and C(max) over the rounds, C(rounds), the rounds with
        answers from both, and C(planned_rounds), the rounds before any was added (O(twin_max_rounds)).
        Negative: the service is faster. C(verdict): C(within) when both medians are at
        most O(twin_max_gap_percent); C(over) when one is beyond it and the service was slower in every round;
        C(unresolved) otherwise.
      type: dict
  sample:
    url: http://127.0.0.1:8100
    summary: {decode_tokens_per_s: 22.8, ttft_ms_p50: 182.0, e2e_ms_p50: 1541.0}
    gap_percent:
      rounds: 4
      planned_rounds: 4
      verdict: within
      decode_tokens_per_s: {median: 1.2, min: -3.0, max: 4.1}
      ttft_ms: {median: 0.8, min: -5.2, max: 6.3}
      e2e_ms: {median: 1.1, min: -2.7, max: 4.0}
report_path:
  description: File the result was written to.
  returned: when O(report_path) is set and the report was written
  type: str
host_state:
  description: The host's state during the measurement, read before the first request.
  returned: unless in check mode
  type: dict
  contains:
    tuned_settings:
      description: Keys of the settings recorded in O(tuning_state_path) (empty when the OS is untuned).
      type: list
      elements: str
    kernel_cmdline:
      description: C(/proc/cmdline).
      type: str
    thp_enabled:
      description: >-
        The selected mode of C(/sys/kernel/mm/transparent_hugepage/enabled)
        (Documentation/admin-guide/mm/transhuge.rst), null without THP.
      type: str
    governor:
      description: >-
        cpufreq governor of the first CPU (C(/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor),
        Documentation/admin-guide/pm/cpufreq.rst), null without cpufreq (most VMs and containers).
      type: str
  sample: {tuned_settings: [thp.enabled], kernel_cmdline: "BOOT_IMAGE=/vmlinuz ro quiet", thp_enabled: madvise,
           governor: null}
"""

import datetime
import http.client
import json
import os
import random
import statistics
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.llmtune_capacity import capacity_of, judge_level, level_requests, next_level
from ansible.module_utils.llmtune_cpuload import cpu_sample, cpu_split, is_noisy
from ansible.module_utils.llmtune_engines import ENGINES, adapter
from ansible.module_utils.llmtune_lock import LockError, hold_lock
from ansible.module_utils.llmtune_state import load_state, write_atomic
from ansible.module_utils.llmtune_sysfs import parse_bracketed, read_text

DEFAULT_PROMPTS = [
    "What is the capital of Australia?",
    "How do I boil an egg so the yolk stays soft?",
    "Explain what a CPU cache is in two sentences.",
    "What is the difference between a virus and a bacterium?",
    "Give me three tips for sleeping better.",
    "How many minutes are there in a week?",
    "What does HTTP stand for?",
    "Write a haiku about autumn rain.",
    "Why is the sky blue?",
    "How do I reverse a list in Python?",
    "What is a good name for a grey cat?",
    "Summarize the plot of Romeo and Juliet in one sentence.",
    "How far is the Moon from the Earth?",
    "What is the boiling point of water at high altitude?",
    "Translate 'good morning' into French and Spanish.",
    "What is compound interest?",
    "How can I make my laptop battery last longer?",
    "Suggest a quick vegetarian dinner.",
    "What is the difference between RAM and storage?",
    "Who wrote Pride and Prejudice?",
    "How do vaccines work?",
    "What is the Linux command to list hidden files?",
    "Give me a short motivational quote.",
    "Why do leaves change color in autumn?",
    "How should I prepare for a job interview?",
    "今天天气怎么样？适合出去散步吗？",
    "请用一句话解释什么是人工智能。",
    "北京有哪些值得去的景点？",
    "怎样做一碗好吃的番茄炒蛋？",
    "给我推荐三本适合入门的编程书。",
    "感冒了应该注意什么？",
    "如何提高英语口语水平？",
    "什么是通货膨胀？",
    "帮我写一句生日祝福语。",
    "为什么要多喝水？",
    "长城有多长？",
    "怎么学习 Python 最快？",
    "请解释一下光合作用。",
    "周末在家可以做些什么有意思的事？",
    "如何缓解工作压力？",
    "中国的四大发明是什么？",
    "请介绍一下月饼的由来。",
    "怎样养成早起的习惯？",
    "手机电池不耐用怎么办？",
    "什么是区块链？用简单的话说。",
    "给我讲一个简短的笑话。",
    "学习数学有什么好方法？",
    "上海到杭州坐高铁要多久？",
    "如何挑选一个好西瓜？",
    "请把“谢谢你的帮助”翻译成英文。",
]

# Common English words that are one token each in the Qwen2/Qwen3 BPE vocabulary, with and without a leading space
# (checked with its tokenizer.json), so any of them can start a prompt.
SYNTHETIC_WORDS = (
    "time year people way day man thing woman life child world school state family student group country problem "
    "hand part place case week company system program question work government number night point home water room "
    "mother area money story fact month lot right study book eye job word business issue side kind head house "
    "service friend father power hour game line end member law car city community name team minute idea "
    "kid body information back parent face others level office door health person art war history party result "
    "change reason research girl moment air teacher force education"
).split()

PERCENTILE_METHOD = "statistics.quantiles(n=100, method='inclusive')"
# Share of a level's prompt tokens the engine may reuse from its cache before TTFT counts as a cache hit: above
# the chat template's opening that every request shares.
CACHED_PROMPT_SHARE = 0.05
SETTLE_WINDOW_S = 2.0
# Summary figures with a gain: for latencies lower is better (gain baseline/new), for rates higher (new/baseline).
LATENCY_FIGURES = ("ttft_ms_p50", "ttft_ms_p95", "itl_ms_p50", "tpot_ms_p50", "e2e_ms_p50")
RATE_FIGURES = ("decode_tokens_per_s", "decode_tokens_per_s_mean", "output_tokens_per_s", "requests_per_s")


class BenchmarkError(Exception):
    """A request or the run failed; the message is one line for the task output."""


def percentiles(values, points):
    """{"p<N>": value} for each N in POINTS, linear interpolation between closest ranks; None without data."""
    if not values:
        return {f"p{p}": None for p in points}
    if len(values) == 1:
        return {f"p{p}": round(values[0], 3) for p in points}
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return {f"p{p}": round(cuts[p - 1], 3) for p in points}


def synthetic_prompt(tokens, index=0, seed=0):
    """Prompt INDEX of a run with prompt seed SEED: TOKENS words from SYNTHETIC_WORDS (TOKENS tokens for the Qwen
    tokenizer).

    Index 0 with seed 0 cycles through the words in order; any other is a shuffled order (seeded by SEED and
    INDEX, so the same for the same pair) that starts with word SEED + INDEX modulo the word count, so two
    indexes of a run below that count share no first token.
    """
    words = list(SYNTHETIC_WORDS)
    if index or seed:
        first = SYNTHETIC_WORDS[(seed + index) % len(SYNTHETIC_WORDS)]
        random.Random(f"{seed}:{index}").shuffle(words)
        words.remove(first)
        words.insert(0, first)
    return " ".join(words[i % len(words)] for i in range(tokens))


def run_tag(seed, index):
    """Three words put before request INDEX's prompt in a run with prompt seed SEED ('' for seed 0): the first is
    word SEED + INDEX (so no two requests of a run below the word count share it: a tag common to the run was a
    cached prefix of every request), the other two drawn from (SEED, INDEX). A request of another run starts with
    the same two words once in 22500 pairs (two of its tokens reusable from a cache; with two tag words that
    happened in a 16-pair test), with the same three once in 3.4 million."""
    if not seed:
        return ""
    draw = random.Random(f"{seed}:{index}")
    return " ".join([SYNTHETIC_WORDS[(seed + index) % len(SYNTHETIC_WORDS)], draw.choice(SYNTHETIC_WORDS),
                     draw.choice(SYNTHETIC_WORDS)])


def prompt_for(params, index):
    """User message of request INDEX of a run (warm-up requests first): a prompt of its own (see DOCUMENTATION)."""
    seed = params.get("prompt_seed") or 0
    if params["prompt_tokens"]:
        return synthetic_prompt(params["prompt_tokens"], index, seed)
    prompts = params["prompts"]
    rounds, position = divmod(index, len(prompts))
    text = prompts[position] if rounds == 0 else f"({rounds + 1}) {prompts[position]}"
    # No bracket or other character before the words: it would be one more token shared by every request.
    return f"{run_tag(seed, index)}. {text}" if seed else text


def settle(pids, busy_limit, timeout):
    """Wait (2-second windows, at most TIMEOUT s) until other processes use at most BUSY_LIMIT CPUs.

    Returns (split of the last window, seconds waited).
    """
    start = time.monotonic()
    while True:
        before = cpu_sample(pids)
        time.sleep(SETTLE_WINDOW_S)
        split = cpu_split(before, cpu_sample(pids))
        waited = time.monotonic() - start
        if not is_noisy(split, busy_limit) or waited >= timeout:
            return split, round(waited, 1)


def roofline(decode_tokens_per_s, upper_bound):
    """Measured decode speed as a percent of the roofline UPPER_BOUND (tokens/s); percent None without data."""
    percent = round(100.0 * decode_tokens_per_s / upper_bound, 1) if decode_tokens_per_s else None
    return {"upper_bound_tokens_per_s": round(upper_bound, 3), "percent": percent}


def _endpoint(url):
    """(scheme, host, port, path prefix) of a base URL; a trailing /v1 is dropped."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BenchmarkError(f"url must be http(s)://host[:port], got {url!r}")
    prefix = parts.path.rstrip("/")
    if prefix.endswith("/v1"):
        prefix = prefix[:-3]
    return parts.scheme, parts.hostname, parts.port, prefix


def _connect(url, timeout):
    scheme, host, port, prefix = _endpoint(url)
    cls = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
    return cls(host, port, timeout=timeout), prefix


def _headers(api_key):
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if api_key:
        headers["Authorization"] = "Bearer " + api_key
    return headers


def first_model(url, api_key, timeout):
    """The first model id of GET /v1/models; BenchmarkError when the service cannot tell."""
    conn, prefix = _connect(url, timeout)
    try:
        conn.request("GET", prefix + "/v1/models", headers=_headers(api_key))
        resp = conn.getresponse()
        body = resp.read()
        if resp.status != 200:
            raise BenchmarkError(f"GET {url}/v1/models: HTTP {resp.status}")
        return json.loads(body)["data"][0]["id"]
    except (OSError, http.client.HTTPException, ValueError, KeyError, IndexError) as error:
        raise BenchmarkError(f"cannot list models at {url}/v1/models ({error}); set model") from error
    finally:
        conn.close()


def _delta_text(event):
    """Generated text of one stream event (content or reasoning deltas), '' if none."""
    text = ""
    for choice in event.get("choices") or []:
        delta = choice.get("delta") or {}
        text += delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning") or ""
    return text


def request_body(model, prompt, params):
    """The JSON body of one streaming chat completion of PROMPT (O(ignore_eos) in the server's own field)."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": params["max_tokens"], "stream": True}
    if params["include_usage"]:
        body["stream_options"] = {"include_usage": True}
    if params["ignore_eos"]:
        body.update(adapter(params["server"]).fixed_length(params["max_tokens"]))
    return body


def stream_request(url, model, prompt, params):
    """Send one streaming chat completion and time it. Returns a sample dict; BenchmarkError on failure.

    Times are time.perf_counter() differences in ms from just before the connection is opened.
    """
    body = request_body(model, prompt, params)
    start = time.perf_counter()
    conn, prefix = _connect(url, params["timeout"])
    deltas, usage, timings, finish = [], None, None, None
    try:
        conn.request("POST", prefix + "/v1/chat/completions", body=json.dumps(body).encode(),
                     headers=_headers(params["api_key"]))
        resp = conn.getresponse()
        if resp.status != 200:
            raise BenchmarkError(f"HTTP {resp.status}: {resp.read(300).decode(errors='replace').strip()}")
        for raw in resp:  # server-sent events, one "data: {json}" line each
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                break
            event = json.loads(payload)
            if event.get("error"):
                raise BenchmarkError(f"server error in stream: {event['error']}")
            if _delta_text(event):
                deltas.append(time.perf_counter())
            finish = next((c["finish_reason"] for c in event.get("choices") or [] if c.get("finish_reason")), finish)
            usage = event.get("usage") or usage
            timings = event.get("timings") or timings
        end = time.perf_counter()
    except (OSError, http.client.HTTPException, ValueError) as error:
        raise BenchmarkError(f"{type(error).__name__}: {error}") from error
    finally:
        conn.close()
    if not deltas:
        raise BenchmarkError("stream ended without any content delta")
    tokens = usage.get("completion_tokens") if usage else None
    if params["ignore_eos"] and tokens and tokens != params["max_tokens"]:
        # Every figure of a run rests on one output length: a stream that ended early is a failed request.
        raise BenchmarkError(f"the engine returned {tokens} of the {params['max_tokens']} output tokens asked for "
                             f"(finish_reason {finish or 'none'}) although ignore_eos was sent")
    sample = {
        "ttft_ms": (deltas[0] - start) * 1000.0,
        "e2e_ms": (end - start) * 1000.0,
        "output_tokens": tokens if tokens else len(deltas),
        "token_source": "usage" if tokens else "deltas",
        "prompt_tokens": usage.get("prompt_tokens") if usage else None,
        "prompt_evaluated": timings.get("prompt_n") if timings else None,
        "prompt_cached": timings.get("cache_n") if timings else None,
        "prompt_ms": timings.get("prompt_ms") if timings else None,
        "itl_ms": [(b - a) * 1000.0 for a, b in zip(deltas, deltas[1:])],
    }
    decode_ms = sample["e2e_ms"] - sample["ttft_ms"]
    if sample["output_tokens"] > 1 and decode_ms > 0:
        sample["tpot_ms"] = decode_ms / (sample["output_tokens"] - 1)
        sample["decode_tokens_per_s"] = 1000.0 / sample["tpot_ms"]
    return sample


def _attempt(url, model, prompt, params):
    """stream_request, with a failure turned into {"error": message} so one bad request does not end a level."""
    try:
        return stream_request(url, model, prompt, params)
    except BenchmarkError as error:
        return {"error": str(error)}


def _mean_of(results, key):
    values = [r[key] for r in results if r.get(key) is not None]
    return round(statistics.fmean(values), 1) if values else None


def engine_prefill_rate(results):
    """Prompt tokens/s of the engine's own prefill timing (llama.cpp's timings.prompt_n over timings.prompt_ms),
    summed over RESULTS that report both; None when none does."""
    timed = [r for r in results if r.get("prompt_evaluated") and r.get("prompt_ms")]
    if not timed:
        return None
    return round(1000.0 * sum(r["prompt_evaluated"] for r in timed) / sum(r["prompt_ms"] for r in timed), 3)


def engine_pids(params):
    """The engine processes of a run: the service's (every engine's) and its twins', those known."""
    return [pid for pid in [params["engine_pid"], params["twin_engine_pid"]] + params["more_engine_pids"]
            + params["more_twin_engine_pids"] if pid]


def engine_figures(urls, results):
    """Each engine's share of a level: its requests, errors, output tokens and medians (RV(levels[].engines))."""
    out = []
    for which, url in enumerate(urls):
        mine = results[which::len(urls)]
        ok = [r for r in mine if "error" not in r]
        out.append({"url": url, "requests": len(mine), "errors": len(mine) - len(ok),
                    "output_tokens": sum(r["output_tokens"] for r in ok),
                    "ttft_ms_p50": percentiles([r["ttft_ms"] for r in ok], (50,))["p50"],
                    "decode_tokens_per_s_p50": percentiles([r["decode_tokens_per_s"] for r in ok
                                                            if "decode_tokens_per_s" in r], (50,))["p50"]})
    return out


def run_level(urls, model, params, concurrency, first_index):
    """Run params["requests"] requests with CONCURRENCY in flight, prompts from FIRST_INDEX on, request I to engine
    URLS[I mod len(URLS)]; the level's figures, and each engine's when there are several."""
    jobs = [(urls[i % len(urls)], prompt_for(params, first_index + i)) for i in range(params["requests"])]
    cpu_before = cpu_sample(engine_pids(params))
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        results = list(pool.map(lambda job: _attempt(job[0], model, job[1], params), jobs))
    wall = time.perf_counter() - start
    level = level_figures(results, wall, cpu_split(cpu_before, cpu_sample(engine_pids(params))), concurrency, params)
    if len(urls) > 1:
        level["engines"] = engine_figures(urls, results)
    return level


def run_capacity(urls, model, params, first_index):
    """The capacity sweep (O(capacity)): levels of doubling streams from prompt FIRST_INDEX on until one breaks a
    target (module_utils/llmtune_capacity.py decides each step). Returns (levels, RV(capacity))."""
    targets = {"ttft_p95_ms": params["target_ttft_p95_ms"], "itl_p95_ms": params["target_itl_p95_ms"]}
    levels, index, start = [], first_index, time.monotonic()
    while True:
        concurrency, again, stopped = next_level(levels, params["capacity_max_concurrency"],
                                                 params["capacity_min_requests"], time.monotonic() - start,
                                                 params["capacity_time_limit"])
        if concurrency is None:
            break
        requests = level_requests(concurrency, params["capacity_min_requests"])
        level = run_level(urls, model, dict(params, requests=requests), concurrency, index)
        index += requests
        level.update(judge_level(level, targets))
        if again:
            level["remeasured"] = True
            levels[-1] = level
        else:
            levels.append(level)
    return levels, capacity_of(levels, targets, stopped, time.monotonic() - start)


def run_paired_level(sides, model, params, concurrency, first_index):
    """The level of run_level on two sides SIDES (the service's engines, their twins, in the same order) in rounds of
    CONCURRENCY requests, each round's prompts sent to one side and then the other, the first swapped every round;
    request I of the level goes to engine I modulo their number on both sides. Rounds are added while the verdict
    is not within (O(twin_max_rounds)) and O(twin_deadline) has not passed. Returns (service level, twin level,
    prompts used); the twin level carries the paired gaps (see RV(twin.gap_percent))."""
    planned = [min(concurrency, params["requests"] - start) for start in range(0, params["requests"], concurrency)]
    results, walls, gaps, used = ([], []), [0.0, 0.0], [], 0
    cpu_before = cpu_sample(engine_pids(params))
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        while len(gaps) < len(planned) or (
                len(gaps) < params["twin_max_rounds"]
                and gap_spread(gaps, params["twin_max_gap_percent"])["verdict"] != "within"
                and not 0 < params["twin_deadline"] <= time.time()):
            size = planned[len(gaps)] if len(gaps) < len(planned) else concurrency
            batch, answers = [(used + i, prompt_for(params, first_index + used + i)) for i in range(size)], [None, None]
            used += size
            for which in ((0, 1) if len(gaps) % 2 == 0 else (1, 0)):
                urls = sides[which]
                start = time.perf_counter()
                answers[which] = list(pool.map(lambda job, u=urls: _attempt(u[job[0] % len(u)], model, job[1], params),
                                               batch))
                walls[which] += time.perf_counter() - start
                results[which].extend(answers[which])
            gaps.append(round_gap(*answers))
    cpu = cpu_split(cpu_before, cpu_sample(engine_pids(params)))
    service, twin = (level_figures(results[i], walls[i], cpu, concurrency, params) for i in (0, 1))
    if len(sides[0]) > 1:
        service["engines"], twin["engines"] = (engine_figures(sides[i], results[i]) for i in (0, 1))
    twin["gap_percent"] = dict(gap_spread(gaps, params["twin_max_gap_percent"]), planned_rounds=len(planned))
    return service, twin, used


def round_gap(service, twin):
    """Percent the SERVICE's answers of one round are slower than the TWIN's (decode: 1 - service/twin of the mean
    tokens/s; ttft_ms, e2e_ms: service/twin - 1 of the means); a figure either side lacks is None."""
    gap = {}
    for figure in ("decode_tokens_per_s", "ttft_ms", "e2e_ms"):
        mine, theirs = (statistics.fmean(values) if values else None
                        for values in ([r[figure] for r in side if r.get(figure) is not None] for side in (service, twin)))
        if not (mine and theirs):
            gap[figure] = None
        elif figure == "decode_tokens_per_s":
            gap[figure] = 100.0 * (1 - mine / theirs)
        else:
            gap[figure] = 100.0 * (mine / theirs - 1)
    return gap


def gap_spread(gaps, limit):
    """Median, min and max of each figure's round gaps (None without any), the rounds with a decode gap, and the
    verdict against LIMIT percent (see RV(twin.gap_percent)): a gap counts as the unit's cost only when no round
    disagrees with it."""
    out = {"rounds": sum(1 for gap in gaps if gap["decode_tokens_per_s"] is not None)}
    for figure in ("decode_tokens_per_s", "ttft_ms", "e2e_ms"):
        values = [gap[figure] for gap in gaps if gap[figure] is not None]
        out[figure] = {"median": round(statistics.median(values), 1), "min": round(min(values), 1),
                       "max": round(max(values), 1)} if values else None
    beyond = [out[figure] for figure in ("decode_tokens_per_s", "e2e_ms") if out[figure] and out[figure]["median"] > limit]
    out["verdict"] = ("within" if not beyond else "over" if any(spread["min"] > 0 for spread in beyond)
                      else "unresolved")
    return out


def level_figures(results, wall, cpu, concurrency, params):
    """The figures of one level from its request RESULTS, its WALL seconds and the CPU split during it."""
    ok = [r for r in results if "error" not in r]
    rates = [r["decode_tokens_per_s"] for r in ok if "decode_tokens_per_s" in r]
    output_tokens = sum(r["output_tokens"] for r in ok)
    return {
        "concurrency": concurrency,
        "requests": len(results),
        "errors": len(results) - len(ok),
        "error_messages": sorted({r["error"] for r in results if "error" in r})[:5],
        "wall_s": round(wall, 3),
        "ttft_ms": percentiles([r["ttft_ms"] for r in ok], (50, 95, 99)),
        "itl_ms": percentiles([gap for r in ok for gap in r["itl_ms"]], (50, 95)),
        "tpot_ms": percentiles([r["tpot_ms"] for r in ok if "tpot_ms" in r], (50, 95)),
        "e2e_ms": percentiles([r["e2e_ms"] for r in ok], (50, 95)),
        "decode_tokens_per_s": dict(percentiles(rates, (50,)), mean=round(statistics.fmean(rates), 3) if rates
                                    else None),
        "output_tokens": output_tokens,
        "prompt_tokens_mean": _mean_of(ok, "prompt_tokens"),
        "prompt_tokens_evaluated_mean": _mean_of(ok, "prompt_evaluated"),
        "prompt_tokens_cached_mean": _mean_of(ok, "prompt_cached"),
        "engine_prefill_tokens_per_s": engine_prefill_rate(ok),
        "cpu": cpu,
        "noisy": is_noisy(cpu, params["busy_limit"]),
        "output_tokens_per_s": round(output_tokens / wall, 3),
        "requests_per_s": round(len(ok) / wall, 3),
        "token_sources": sorted({r["token_source"] for r in ok}),
        "samples": [dict({key: (round(r[key], 3) if isinstance(r.get(key), float) else r.get(key))
                          for key in ("ttft_ms", "e2e_ms", "output_tokens", "decode_tokens_per_s")},
                         itl_ms_p95=percentiles(r["itl_ms"], (95,))["p95"]) for r in ok],
    }


def summarize(level):
    """Flat comparison figures of one level (the RV(summary) keys)."""
    return {
        "concurrency": level["concurrency"],
        "ttft_ms_p50": level["ttft_ms"]["p50"],
        "ttft_ms_p95": level["ttft_ms"]["p95"],
        "itl_ms_p50": level["itl_ms"]["p50"],
        "tpot_ms_p50": level["tpot_ms"]["p50"],
        "e2e_ms_p50": level["e2e_ms"]["p50"],
        "decode_tokens_per_s": level["decode_tokens_per_s"]["p50"],
        "decode_tokens_per_s_mean": level["decode_tokens_per_s"]["mean"],
        "output_tokens_per_s": level["output_tokens_per_s"],
        "requests_per_s": level["requests_per_s"],
        "errors": level["errors"],
    }


def gains(summary, baseline):
    """Ratios to BASELINE (a result or its summary), above 1 is better; figures missing or zero are left out."""
    base = baseline.get("summary", baseline)
    out = {}
    for figure in LATENCY_FIGURES + RATE_FIGURES:
        new, old = summary.get(figure), base.get(figure)
        if isinstance(new, (int, float)) and isinstance(old, (int, float)) and new > 0 and old > 0:
            out[figure] = round(old / new if figure in LATENCY_FIGURES else new / old, 4)
    return out


# The figures a validation reports as worse than the baseline, with their names.
REPORTED_FIGURES = {"ttft_ms_p50": "TTFT p50", "ttft_ms_p95": "TTFT p95", "tpot_ms_p50": "TPOT p50",
                    "e2e_ms_p50": "end-to-end p50", "decode_tokens_per_s": "decode tokens/s"}


def worse_than(gain, summary, baseline):
    """[{figure, name, baseline, new, percent}] of the REPORTED_FIGURES whose GAIN is below 1, the worst first; percent
    is how much worse (latencies: longer, rates: slower)."""
    base = baseline.get("summary", baseline)
    out = []
    for figure, name in REPORTED_FIGURES.items():
        if gain.get(figure, 1) < 1:
            old, new = base[figure], summary[figure]
            ratio = new / old if figure.endswith("_ms") or "_ms_" in figure else old / new
            out.append({"figure": figure, "name": name, "baseline": old, "new": new,
                        "percent": round(100 * (ratio - 1), 1)})
    return sorted(out, key=lambda item: -item["percent"])


def check_options(params):
    """One-line error for bad options, before any request; None when they are fine."""
    if params["prompts"] is not None and params["prompt_tokens"] is not None:
        return "prompts and prompt_tokens are mutually exclusive"
    if params["prompt_tokens"] is not None and params["prompt_tokens"] < 1:
        return "prompt_tokens must be >= 1"
    if params["prompt_seed"] is not None and params["prompt_seed"] < 0:
        return "prompt_seed must be >= 0"
    if params["decode_upper_bound"] is not None and params["decode_upper_bound"] <= 0:
        return "decode_upper_bound must be > 0 tokens/s"
    if params["prompts"] == []:
        return "prompts must not be empty"
    if params["max_tokens"] < 1 or params["requests"] < 1 or params["warmup"] < 0 or params["timeout"] <= 0:
        return "max_tokens and requests must be >= 1, warmup >= 0 and timeout > 0"
    if min(params["engine_pid"], params["twin_engine_pid"], params["busy_limit"], params["settle_timeout"],
           params["lock_timeout"]) < 0:
        return "engine_pid, twin_engine_pid, busy_limit, settle_timeout and lock_timeout must be >= 0"
    if params["twin_max_gap_percent"] < 0:
        return "twin_max_gap_percent must be >= 0"
    if params["twin_max_rounds"] < 0:
        return "twin_max_rounds must be >= 0"
    if params["twin_url"] is not None and len(params["more_twin_urls"]) != len(params["more_urls"]):
        return (f"more_twin_urls: one twin per engine of more_urls ({len(params['more_urls'])}), "
                f"got {len(params['more_twin_urls'])}")
    if params["more_twin_urls"] and params["twin_url"] is None:
        return "more_twin_urls needs twin_url, the twin of url"
    twins = [u.rstrip("/") for u in [params["twin_url"] or ""] + params["more_twin_urls"] if u]
    if set(twins) & {u.rstrip("/") for u in [params["url"]] + params["more_urls"]} or len(set(twins)) < len(twins):
        return "every twin must be a server of its own, none of url and more_urls"
    for pids, urls in (("more_engine_pids", "more_urls"), ("more_twin_engine_pids", "more_twin_urls")):
        if len(params[pids]) > len(params[urls]) or min(params[pids] or [0]) < 0:
            return f"{pids}: at most one PID >= 0 per engine of {urls}"
    if not params["concurrency"] or min(params["concurrency"]) < 1:
        return "concurrency must be a non-empty list of integers >= 1"
    if params["capacity"]:
        problem = check_capacity(params)
        if problem:
            return problem
    if params["fail_below"]:
        if not params["baseline"]:
            return "fail_below needs a baseline to compare with"
        figures = LATENCY_FIGURES + RATE_FIGURES
        unknown = sorted(set(params["fail_below"]) - set(figures))
        if unknown:
            return f"fail_below: unknown figure(s) {', '.join(unknown)}; choose from {', '.join(figures)}"
        for figure, ratio in params["fail_below"].items():
            if _ratio(ratio) is None:
                return f"fail_below.{figure} must be a number > 0 (a ratio to the baseline), got {ratio!r}"
    return None


def check_capacity(params):
    """One-line error for bad options of the capacity sweep, or None."""
    if params["twin_url"]:
        return "capacity and twin_url are mutually exclusive: the sweep's closed loop has no paired rounds"
    targets = (params["target_ttft_p95_ms"], params["target_itl_p95_ms"])
    if None in targets:
        return "capacity needs target_ttft_p95_ms and target_itl_p95_ms"
    if min(targets) <= 0:
        return "target_ttft_p95_ms and target_itl_p95_ms must be > 0 ms"
    if params["capacity_max_concurrency"] < 1 or params["capacity_min_requests"] < 1:
        return "capacity_max_concurrency and capacity_min_requests must be >= 1"
    if params["capacity_time_limit"] <= 0:
        return "capacity_time_limit must be > 0 s"
    return None


def _ratio(value):
    """VALUE as a float > 0, or None; key=value task arguments arrive as strings."""
    if isinstance(value, bool):
        return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if value > 0 else None


def below_threshold(gain, summary, baseline, fail_below):
    """Message naming every figure whose ratio is below its minimum, or None."""
    base = baseline.get("summary", baseline)
    failed = []
    for figure, minimum in sorted(fail_below.items()):
        ratio, minimum = gain.get(figure), _ratio(minimum)
        if ratio is None:
            failed.append(f"{figure}: no value to compare (new {summary.get(figure)}, baseline {base.get(figure)})")
        elif ratio < minimum:
            failed.append(f"{figure} {summary[figure]} vs baseline {base[figure]}: ratio {ratio} < {minimum}")
    return "below baseline: " + "; ".join(failed) if failed else None


def write_report(path, result):
    """Write RESULT as JSON to PATH atomically and durably, creating parent directories; BenchmarkError on failure."""
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        write_atomic(path, json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    except OSError as error:
        raise BenchmarkError(f"cannot write report_path {path}: {error}") from error


def host_state(tuning_state_path):
    """The host's state as RV(host_state) describes it; a damaged state file reads as ValueError's message."""
    try:
        tuned = sorted(load_state(tuning_state_path)["settings"]) if tuning_state_path else []
    except (OSError, ValueError) as error:
        tuned = [f"unreadable {tuning_state_path}: {error}"]
    return {"tuned_settings": tuned, "kernel_cmdline": read_text(None, "/proc/cmdline"),
            "thp_enabled": parse_bracketed(read_text(None, "/sys/kernel/mm/transparent_hugepage/enabled"))[0],
            "governor": read_text(None, "/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor")}


def cache_hit(level):
    """True when the engine reused more than CACHED_PROMPT_SHARE of the level's prompt tokens from its cache."""
    cached, evaluated = level["prompt_tokens_cached_mean"] or 0, level["prompt_tokens_evaluated_mean"] or 0
    return cached > CACHED_PROMPT_SHARE * (cached + evaluated)


def run(params, check_mode=False):
    """Run the benchmark. Returns (result, failure message or None, warnings).

    PARAMS holds every module option (defaults applied). The result is returned also on failure, so the
    caller can show the figures next to the message.
    """
    result, warnings = {"changed": False}, []
    problem = check_options(params)
    if problem:
        return result, problem, warnings
    seed = params["prompt_seed"] if params["prompt_seed"] is not None else random.SystemRandom().randrange(1, 2 ** 31)
    params = dict(params, prompts=params["prompts"] or DEFAULT_PROMPTS, prompt_seed=seed)
    if check_mode:
        return dict(result, skipped=True, msg="check mode: no request sent"), None, warnings
    url = params["url"].rstrip("/")
    try:
        for endpoint in [url] + params["more_urls"]:
            _endpoint(endpoint)
        for endpoint in ([params["twin_url"]] if params["twin_url"] else []) + params["more_twin_urls"]:
            _endpoint(endpoint)
        model = params["model"] or first_model(url, params["api_key"], params["timeout"])
        lock, lock_waited = hold_lock(params["lock_path"], params["lock_timeout"])
    except (BenchmarkError, LockError) as error:
        return result, str(error), warnings
    try:
        return measure(params, url, model, result, warnings, lock_waited)
    finally:
        if lock:
            lock.close()


def measure(params, url, model, result, warnings, lock_waited):
    """run() once the options are checked and the lock is held; returns the same (result, failure, warnings)."""
    before, waited = settle(engine_pids(params), params["busy_limit"], params["settle_timeout"])
    result.update(url=url, model=model, max_tokens=params["max_tokens"], prompt_tokens=params["prompt_tokens"],
                  prompt_seed=params["prompt_seed"],
                  ignore_eos=params["ignore_eos"], percentile_method=PERCENTILE_METHOD,
                  started=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  host_load={"cpus": os.cpu_count() or 1, "loadavg_before": [round(x, 2) for x in os.getloadavg()],
                             "other_cpus_before": before["other"], "settle_wait_s": waited,
                             "lock_wait_s": lock_waited},
                  host_state=host_state(params["tuning_state_path"]))
    if is_noisy(before, params["busy_limit"]):
        warnings.append(f"other processes kept {before['other']} CPUs busy (steal {before['steal_percent']} %) "
                        f"after waiting {waited} s: figures taken now are not comparable")
    twin_url = params["twin_url"].rstrip("/") if params["twin_url"] else None
    urls = [url] + [more.rstrip("/") for more in params["more_urls"]]
    twin_urls = [twin_url] + [more.rstrip("/") for more in params["more_twin_urls"]] if twin_url else []
    for i in range(params["warmup"]):
        for target in urls + twin_urls:
            _attempt(target, model, prompt_for(params, i), params)
    levels, twin_levels, index = [], [], params["warmup"]
    if params["capacity"]:
        levels, result["capacity"] = run_capacity(urls, model, params, index)
    for concurrency in [] if params["capacity"] else params["concurrency"]:
        if twin_url:
            service, twin, used = run_paired_level((urls, twin_urls), model, params, concurrency, index)
            levels.append(service)
            twin_levels.append(twin)
            index += used
        else:
            levels.append(run_level(urls, model, params, concurrency, index))
            index += params["requests"]
    result["host_load"]["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    result["noisy"] = any(level["noisy"] for level in levels)
    for level in levels:
        if level["noisy"]:
            warnings.append(f"concurrency {level['concurrency']}: other processes used {level['cpu']['other']} CPUs "
                            f"and steal was {level['cpu']['steal_percent']} % during the level (noisy)")
        if cache_hit(level):
            warnings.append(f"concurrency {level['concurrency']}: the engine reused {level['prompt_tokens_cached_mean']} "
                            "cached prompt tokens per request: TTFT is partly a prompt-cache hit")
    sources = {s for level in levels for s in level.pop("token_sources")}
    result["token_count_source"] = sources.pop() if len(sources) == 1 else ("mixed" if sources else None)
    result["levels"] = levels
    result["summary"] = summarize(min(levels, key=lambda level: level["concurrency"]))
    if twin_url:
        for level in twin_levels:
            level.pop("token_sources")
        first = min(twin_levels, key=lambda level: level["concurrency"])
        result["twin"] = {"url": twin_url, "urls": twin_urls, "levels": twin_levels, "summary": summarize(first),
                          "gap_percent": first["gap_percent"]}
    result["gain"] = gains(result["summary"], params["baseline"]) if params["baseline"] else {}
    if params["baseline"]:
        result["worse"] = worse_than(result["gain"], result["summary"], params["baseline"])
    if params["decode_upper_bound"]:
        result["roofline"] = roofline(result["summary"]["decode_tokens_per_s"], params["decode_upper_bound"])
    failure = None
    for target, level in [(url, level) for level in levels] + [(twin_url, level) for level in twin_levels]:
        # A sweep stops at a level that fails; only a first level that fails entirely fails the task.
        if level["errors"] == level["requests"] and not (params["capacity"] and level is not levels[0]):
            failure = failure or (f"all {level['requests']} requests at concurrency {level['concurrency']} to "
                                  f"{target} failed: {level['error_messages'][0]}")
        elif level["errors"]:
            warnings.append(f"{level['errors']} of {level['requests']} requests at concurrency "
                            f"{level['concurrency']} failed: {level['error_messages'][0]}")
    if params["report_path"] and not failure:
        try:
            write_report(params["report_path"], dict(result, report_path=params["report_path"]))
            result["report_path"] = params["report_path"]
        except BenchmarkError as error:
            failure = str(error)
    if not failure and params["fail_below"]:
        failure = below_threshold(result["gain"], result["summary"], params["baseline"], params["fail_below"])
    return result, failure, warnings


ARGUMENT_SPEC = {
    "url": {"type": "str", "default": "http://127.0.0.1:8000"},
    "model": {"type": "str"},
    "api_key": {"type": "str", "no_log": True},
    "prompts": {"type": "list", "elements": "str"},
    "prompt_tokens": {"type": "int"},
    "prompt_seed": {"type": "int"},
    "max_tokens": {"type": "int", "default": 64},
    "ignore_eos": {"type": "bool", "default": False},
    "server": {"type": "str", "default": "transformers", "choices": sorted(ENGINES)},
    "decode_upper_bound": {"type": "float"},
    "requests": {"type": "int", "default": 8},
    "concurrency": {"type": "list", "elements": "int", "default": [1]},
    "warmup": {"type": "int", "default": 1},
    "timeout": {"type": "float", "default": 120},
    "engine_pid": {"type": "int", "default": 0},
    "more_urls": {"type": "list", "elements": "str", "default": []},
    "more_engine_pids": {"type": "list", "elements": "int", "default": []},
    "capacity": {"type": "bool", "default": False},
    "target_ttft_p95_ms": {"type": "float"},
    "target_itl_p95_ms": {"type": "float"},
    "capacity_max_concurrency": {"type": "int", "default": 64},
    "capacity_min_requests": {"type": "int", "default": 20},
    "capacity_time_limit": {"type": "float", "default": 600},
    "twin_url": {"type": "str"},
    "twin_engine_pid": {"type": "int", "default": 0},
    "more_twin_urls": {"type": "list", "elements": "str", "default": []},
    "more_twin_engine_pids": {"type": "list", "elements": "int", "default": []},
    "twin_max_gap_percent": {"type": "float", "default": 5.0},
    "twin_max_rounds": {"type": "int", "default": 0},
    "twin_deadline": {"type": "float", "default": 0},
    "busy_limit": {"type": "float", "default": 0.25},
    "settle_timeout": {"type": "float", "default": 60},
    "lock_path": {"type": "path", "default": "/run/llmtune/benchmark.lock"},
    "lock_timeout": {"type": "float", "default": 1800},
    "include_usage": {"type": "bool", "default": True},
    "baseline": {"type": "dict"},
    "report_path": {"type": "path"},
    "tuning_state_path": {"type": "path", "default": "/var/lib/llmtune/state.json"},
    "fail_below": {"type": "dict"},
}


def main():
    """Run the module: measure, never change anything (changed is always false)."""
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    result, failure, warnings = run(module.params, module.check_mode)
    for warning in warnings:
        module.warn(warning)
    if failure:
        module.fail_json(msg=failure, **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
