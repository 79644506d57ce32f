# -*- coding: utf-8 -*-
"""The statuses of a drift check's rows (library/tuning_drift.py writes them, library/llmtune_metrics.py exports
them): one place for their names."""

from __future__ import annotations

PENDING = "pending reboot"
# ok: as wanted; drift: neither in force nor configured; pending reboot: configured for the next boot, not in force in
# the running kernel; n/a: not applicable here, with a reason.
STATUSES = ("ok", "drift", PENDING, "n/a")


def service_rows(instances, units, answers, stale):
    """The inference service's rows, from what its drift check (roles/inference_service/tasks/verify.yml) read:
    each engine of INSTANCES (the service's layout) named inference_service, or inference_service@<node> for one
    per NUMA node; UNITS, ANSWERS and STALE the results of its loops over them (each carrying its __instance).
    Returns (the units to compare, as tuning_drift's units option takes them; rows: a chat completion answered, no
    file changed since the engine started - or, with no engine deployed, one n/a row naming the units)."""
    names = {i["unit"]: "inference_service" + (f"@{i['node']}" if i["node"] is not None else "") for i in instances}
    deployed = [{"name": names[u["__instance"]["unit"]] + ".unit", "status": u["status"]}
                for u in units if u["status"].get("LoadState", "not-found") != "not-found"]
    if not answers:
        return deployed, [{"setting": "inference_service", "wanted": "-",
                           "actual": "no " + " or ".join(i["unit"] for i in instances), "status": "n/a",
                           "reason": "the service is not deployed here"}]
    rows = []
    for answer, files in zip(answers, stale or [{}] * len(answers)):
        name = names[answer["__instance"]["unit"]]
        code = answer.get("status", -1)
        changed = files.get("stdout_lines") or []
        rows += [{"setting": name + ".answers", "wanted": "a chat completion",
                  "actual": f"HTTP {code}" + ("" if code == 200 else f" {answer.get('msg', '')}"),
                  "status": "ok" if code == 200 else "drift"},
                 {"setting": name + ".started_after_files", "wanted": "no change since the engine started",
                  "actual": "changed since: " + " ".join(changed) if changed else "none changed",
                  "status": "drift" if changed else "ok"}]
    return deployed, rows
