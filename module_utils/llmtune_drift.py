# -*- coding: utf-8 -*-
"""The statuses of a drift check's rows (library/tuning_drift.py writes them, library/llmtune_metrics.py exports
them): one place for their names."""

from __future__ import annotations

PENDING = "pending reboot"
# ok: as wanted; drift: neither in force nor configured; pending reboot: configured for the next boot, not in force in
# the running kernel; n/a: not applicable here, with a reason.
STATUSES = ("ok", "drift", PENDING, "n/a")
