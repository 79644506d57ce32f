# -*- coding: utf-8 -*-
"""The host's llmtune files as Prometheus metrics, in one place (library/llmtune_metrics.py writes them for the node
exporter's textfile collector; tests/unit/test_metrics.py scrapes them from a real node exporter).

Sources, each read as its writer stores it (a missing file gives no metrics, only ``llmtune_source_present 0``):

- the state file (module_utils/llmtune_state.py): each setting this project changed, when it first recorded it, and
  how many files and packages it changed or installed;
- the untuned baseline and the last passed validation (library/inference_benchmark.py results; the validation as
  roles/benchmark/tasks/validate.yml stores it, with its direct-run twin's row): TTFT, TPOT, ITL, end-to-end and decode
  figures of the summary level, the gain over the baseline, the roofline and the twin gap;
- the auto-tune's stored result (roles/autotune): the chosen stack, mapped by the one mapping the deploy uses
  (module_utils/llmtune_autotune.py service_variables);
- the last drift check (playbooks/verify.yml, rows of library/tuning_drift.py), with its time.

Names follow Prometheus' naming practice (https://prometheus.io/docs/practices/naming/): prefix ``llmtune_``, base
units in the name (``_seconds``, ``_tokens_per_second``, ``_ratio`` for a ratio of 1.0 = 100 %), ``_timestamp_seconds``
for a Unix time. Labels carry facts that do not depend on the host (engine, format, setting, run); Prometheus adds
the host's ``instance``. Text exposition format 0.0.4 (https://prometheus.io/docs/instrumenting/exposition_formats/),
without sample timestamps (the textfile collector refuses them).
"""

from __future__ import annotations

import datetime
import decimal
import math

from ansible.module_utils.llmtune_autotune import GGUF_ENGINES, SLOT_ENGINES, served_setting, service_variables
from ansible.module_utils.llmtune_drift import PENDING, STATUSES

PREFIX = "llmtune_"
# Summary figures of a benchmark result (library/inference_benchmark.py RETURN summary): key, metric name, divisor to
# the base unit (see scaled()), help.
FIGURES = (
    ("ttft_ms_p50", "benchmark_ttft_p50_seconds", 1000,
     "Time to first token of the benchmark's requests (mostly prefill), median."),
    ("ttft_ms_p95", "benchmark_ttft_p95_seconds", 1000, "Time to first token, 95th percentile."),
    ("tpot_ms_p50", "benchmark_tpot_p50_seconds", 1000,
     "Time per output token after the first, (end-to-end - TTFT) / (output tokens - 1), median of the requests."),
    ("itl_ms_p50", "benchmark_itl_p50_seconds", 1000, "Inter-token latency (gaps between streamed deltas), median."),
    ("e2e_ms_p50", "benchmark_e2e_p50_seconds", 1000, "End-to-end request latency, median."),
    ("decode_tokens_per_s", "benchmark_decode_tokens_per_second", 1,
     "Decode speed per request, (output tokens - 1) / (end-to-end - TTFT), median of the requests."),
    ("output_tokens_per_s", "benchmark_output_tokens_per_second", 1,
     "Output tokens of all requests of the level divided by its wall time."),
    ("errors", "benchmark_failed_requests", 1, "Requests of the level that failed."),
)
RUNS = ("baseline", "validation")
SOURCES = ("state", "baseline", "validation", "autotune", "drift")


class Family:
    """One metric family: NAME (without the prefix), TYPE (gauge), HELP and its samples [(labels dict, value)]."""

    def __init__(self, name, help_text, kind="gauge"):
        self.name, self.help, self.kind, self.samples = PREFIX + name, help_text, kind, []

    def add(self, value, **labels):
        """Add a sample (a bool as 0 or 1); a value that is not a finite number (None: a figure the run did not
        have) is left out. Returns the family."""
        value = int(value) if isinstance(value, bool) else _number(value)
        if value is not None:
            self.samples.append((labels, value))
        return self


def timestamp(text):
    """Unix time (float) of an ISO 8601 time as the project writes them ('2026-12-04T21:23:36+00:00' or '...Z'); None
    when TEXT is empty or not such a time. A time without a zone is UTC (the project writes UTC only)."""
    if not isinstance(text, str) or not text:
        return None
    try:
        moment = datetime.datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    return moment.timestamp()


def _number(value):
    """VALUE when it is a finite int or float (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value if math.isfinite(value) else None


def scaled(value, divisor):
    """VALUE (a figure as stored, e.g. 205.303 ms) divided by DIVISOR in decimal: the float nearest to the decimal
    result (0.205303 s), where binary arithmetic gives 0.20530299999999999; None stays None."""
    if value is None or divisor == 1:
        return value
    return float(decimal.Decimal(repr(float(value))) / divisor)


def _dict(value):
    return value if isinstance(value, dict) else {}


def state_families(state):
    """Families of the state file STATE (dict, module_utils/llmtune_state.py layout)."""
    applied = Family("setting_applied_timestamp_seconds",
                     "When llmtune recorded the original of this setting, just before it first changed it (state "
                     "file); present while the change stands, gone after a rollback.")
    for key, entry in sorted(_dict(state.get("settings")).items()):
        applied.add(timestamp(_dict(entry).get("recorded")), setting=key)
    return [
        Family("state_settings", "Settings llmtune changed on this host (state file).")
        .add(len(_dict(state.get("settings")))),
        applied,
        Family("state_files", "Files llmtune edited or created on this host (state file).")
        .add(len(_dict(state.get("files")))),
        Family("state_packages", "Packages llmtune installed on this host (state file).")
        .add(len(_dict(state.get("packages")))),
    ]


def benchmark_families(results):
    """Families of the benchmark results RESULTS ({run: inference_benchmark result}, runs of RUNS)."""
    families = [Family(metric, help_text) for _key, metric, _scale, help_text in FIGURES]
    when = Family("benchmark_timestamp_seconds", "When the run's measurement started.")
    noisy = Family("benchmark_noisy",
                   "1 when another process or steal time disturbed the measurement (its figures are not comparable).")
    for run in RUNS:
        result = _dict(results.get(run))
        if not result:
            continue
        summary = _dict(result.get("summary"))
        for (key, _metric, divisor, _help), family in zip(FIGURES, families):
            value = _number(summary.get(key))
            family.add(scaled(value, divisor), run=run)
        when.add(timestamp(result.get("started")), run=run)
        if isinstance(result.get("noisy"), bool):
            noisy.add(result["noisy"], run=run)
    return families + [when, noisy]


def validation_families(validation):
    """Families of the stored validation VALIDATION (dict: result, twin) beyond its figures: the gain, the roofline
    and the direct-run twin."""
    result = _dict(validation.get("result"))
    gain = Family("benchmark_gain_ratio",
                  "Validation over the untuned baseline, per figure of the summary; above 1 is better (latencies "
                  "baseline/tuned, rates tuned/baseline).")
    for figure, value in sorted(_dict(result.get("gain")).items()):
        gain.add(_number(value), figure=figure)
    roofline = _dict(result.get("roofline"))
    percent = _number(roofline.get("percent"))
    twin = _dict(validation.get("twin"))
    gaps = Family("benchmark_twin_gap_ratio",
                  "How much slower the service is than the same engine started directly beside it, median of the "
                  "paired rounds (decode: 1 - service/twin; latencies: service/twin - 1); negative is faster.")
    for figure, value in sorted(_dict(twin.get("gap_percent")).items()):
        value = _number(value)
        gaps.add(scaled(value, 100), figure=figure)
    verdict = Family("benchmark_twin_verdict",
                     "The twin comparison's verdict (within the limit, over it, unresolved), as a label.")
    if isinstance(twin.get("verdict"), str):
        verdict.add(1, verdict=twin["verdict"])
    return [
        gain,
        Family("benchmark_roofline_tokens_per_second",
               "Decode speed bound by memory bandwidth: bandwidth / bytes read per decoded token.")
        .add(_number(roofline.get("upper_bound_tokens_per_s"))),
        Family("benchmark_roofline_ratio", "Validated decode tokens/s over the roofline.")
        .add(scaled(percent, 100)),
        gaps,
        Family("benchmark_twin_rounds", "Paired rounds with answers from the service and its twin.")
        .add(_number(_dict(twin.get("rounds")).get("rounds"))),
        verdict,
    ]


def stack_families(autotune):
    """Families of the auto-tune's stored result AUTOTUNE (dict with ``chosen``)."""
    chosen = _dict(autotune.get("chosen"))
    if not chosen:
        return []
    setting = served_setting(autotune)
    served = service_variables(setting, 0)
    gguf = served["inference_service_engine"] in GGUF_ENGINES
    info = Family("stack_info",
                  "The stack the auto-tune chose and the service serves: engine, weight format (GGUF type or dtype), "
                  "layout (single, or per_node: one engine per NUMA node) and allocator.")
    info.add(1, engine=served["inference_service_engine"],
             format=served["inference_service_gguf_type"] if gguf else served["inference_service_dtype"],
             layout=served["inference_service_layout"], allocator=served["inference_service_allocator"])
    threads = served["inference_service_threads"]
    parallel = _number(setting.get("parallel")) if served["inference_service_engine"] in SLOT_ENGINES else None
    capacity = _dict(autotune.get("capacity"))
    return [
        info,
        Family("stack_threads", "Threads of each engine of the chosen stack (0: the engine's default).").add(threads),
        Family("stack_parallel_slots", "llama.cpp slots or vLLM sequences (requests decoded together) of the chosen "
               "stack.").add(parallel),
        Family("autotune_capacity_streams",
               "Concurrent streams the chosen stack served within the latency targets (the auto-tune's capacity "
               "stage); nginx admits as many requests, at least one.")
        .add(_number(capacity.get("streams")) if capacity.get("status") == "measured" else None),
        Family("autotune_timestamp_seconds", "When the auto-tune stored its choice.")
        .add(timestamp(autotune.get("finished"))),
    ]


def drift_families(drift):
    """Families of the last drift check DRIFT (dict: checked, rows)."""
    rows = [row for row in drift.get("rows") or [] if isinstance(row, dict) and row.get("status") in STATUSES]
    counts = Family("drift_settings", "Rows of the last drift check (playbooks/verify.yml) per status.")
    for status in STATUSES:
        counts.add(sum(1 for row in rows if row["status"] == status), status=status)
    each = Family("drift_setting_status",
                  "Each setting of the last drift check, with its status as a label (ok, drift, pending reboot, n/a).")
    for row in rows:
        each.add(1, setting=str(row.get("setting", "")), status=row["status"])
    return [
        Family("drift_check_timestamp_seconds", "When the last drift check ran.").add(timestamp(drift.get("checked"))),
        counts,
        each,
        Family("reboot_pending",
               "1 when the last drift check found settings configured for the next boot but not in force.")
        .add(int(any(row["status"] == PENDING for row in rows))),
    ]


def collect(sources):
    """Every family for SOURCES ({source: dict or None}, keys of SOURCES; None: the file is absent)."""
    present = Family("source_present", "1 when llmtune's file of this source is on the host (0: no such metrics).")
    for source in SOURCES:
        present.add(int(sources.get(source) is not None), source=source)
    families = [present]
    if sources.get("state") is not None:
        families += state_families(sources["state"])
    runs = {"baseline": sources.get("baseline"), "validation": _dict(sources.get("validation")).get("result")}
    families += benchmark_families({run: result for run, result in runs.items() if result})
    if sources.get("validation") is not None:
        families += validation_families(sources["validation"])
    if sources.get("autotune") is not None:
        families += stack_families(sources["autotune"])
    if sources.get("drift") is not None:
        families += drift_families(sources["drift"])
    return [family for family in families if family.samples]


def _escape(text, quote):
    text = text.replace("\\", "\\\\").replace("\n", "\\n")
    return text.replace('"', '\\"') if quote else text


def _value(value):
    """A sample value as the text format writes it: an int as digits, a float by repr (shortest round trip)."""
    return str(value) if isinstance(value, int) else repr(float(value))


def render(families):
    """The text exposition of FAMILIES: HELP and TYPE, then one line per sample."""
    lines = []
    for family in families:
        lines.append("# HELP %s %s" % (family.name, _escape(family.help, False)))
        lines.append("# TYPE %s %s" % (family.name, family.kind))
        for labels, value in family.samples:
            pairs = ",".join('%s="%s"' % (key, _escape(str(val), True)) for key, val in labels.items())
            lines.append("%s%s %s" % (family.name, "{%s}" % pairs if pairs else "", _value(value)))
    return "\n".join(lines) + "\n" if lines else ""
