"""The fleet's scraper's view of a host: library/llmtune_metrics.py and roles/metrics write the host's llmtune files
(recorded on the local node: tests/fixtures/metrics) for the real node exporter (Debian's prometheus-node-exporter 1.5,
unpacked into the cache by scripts/setup-controller.sh) whose textfile collector serves them over HTTP, parsed with
prometheus_client's text parser; and the engines' own metrics (llama-server --metrics, recorded) through the proxy's
nginx site with the API key.
"""

import json
import os
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import kernel_cmdline
import llmtune_metrics
import pytest
import tuning_drift
from conftest import (FIXTURES, ROOT, VENV_BIN, copy_tree, end_process, free_port, node_exporter_program, read,
                      run_nginx, wait_healthy)
from prometheus_client.parser import text_string_to_metric_families

from ansible.module_utils.llmtune_metrics import timestamp
from ansible.module_utils.testing import patch_module_args

EXPORTER = node_exporter_program()
needs_exporter = pytest.mark.skipif(EXPORTER is None, reason="prometheus-node-exporter is not installed (Debian package; "
                                    "scripts/setup-controller.sh unpacks it into the cache)")
# The host's files as the local node's llama.cpp run of 2026-12-04 left them; its untuned baseline is the one of the
# auto-tune fixtures (the same node, the same run).
SOURCES = {"state.json": "metrics/state.json", "baseline.json": "autotune/benchmark-result.json",
           "validation.json": "metrics/validation.json", "autotune.json": "metrics/autotune.json"}


@pytest.fixture(name="exporter")
def fixture_exporter(tmp_path):
    """The real node exporter with only its textfile collector, reading TMP/textfile; yields (folder, metrics URL)."""
    folder = tmp_path / "textfile"
    folder.mkdir()
    port = free_port()
    log = open(tmp_path / "node-exporter.log", "w", encoding="utf-8")
    proc = subprocess.Popen([EXPORTER, f"--web.listen-address=127.0.0.1:{port}", "--collector.disable-defaults",
                             "--collector.textfile", f"--collector.textfile.directory={folder}"],
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        wait_healthy(proc, url, tmp_path / "node-exporter.log", "node exporter", timeout=30, path="")
        yield folder, url
    finally:
        end_process(proc)
        log.close()


@pytest.fixture(name="host")
def fixture_host(tmp_path):
    """TMP/llmtune holding the recorded files of SOURCES; returns the module arguments that read them."""
    state_dir = tmp_path / "llmtune"
    state_dir.mkdir()
    for name, fixture in SOURCES.items():
        shutil.copy(os.path.join(FIXTURES, fixture), state_dir / name)
    return {name.split(".")[0] + "_path": str(state_dir / name) for name in SOURCES} | {
        "drift_path": str(state_dir / "drift.json")}


def run(args, capsys, check_mode=False):
    with patch_module_args(dict(args, _ansible_check_mode=check_mode, _ansible_diff=True)):
        with pytest.raises(SystemExit):
            llmtune_metrics.main()
    return json.loads(capsys.readouterr().out)


def scrape(url, headers=None):
    """{(name, labels as a frozenset of pairs): value} of every sample the URL serves, and the families' types."""
    request = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(request, timeout=10) as resp:
        text = resp.read().decode()
    samples, types = {}, {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples, types


def value(samples, name, **labels):
    return samples[(name, frozenset(labels.items()))]


def labelled(samples, name):
    """[labels dict] of every sample of NAME."""
    return [dict(labels) for sample, labels in samples if sample == name]


@needs_exporter
def test_the_hosts_files_reach_the_scraper_through_the_node_exporter(exporter, host, capsys):
    folder, url = exporter
    result = run(dict(host, path=str(folder / "llmtune.prom")), capsys)
    assert result["changed"] is True
    samples, types = scrape(url)
    # The Go parser of the collector took the whole file, and it is the one written.
    assert value(samples, "node_textfile_scrape_error") == 0
    assert ("node_textfile_mtime_seconds", frozenset({("file", str(folder / "llmtune.prom"))})) in samples
    assert {name for name in types if name.startswith("llmtune_")} == set(result["metrics"])
    assert all(types[name] == "gauge" for name in result["metrics"])
    assert {label["source"]: value(samples, "llmtune_source_present", **label)
            for label in labelled(samples, "llmtune_source_present")} == {
        "state": 1, "baseline": 1, "validation": 1, "autotune": 1, "drift": 0}
    # The validation of 2026-12-04 21:23 on the local node: llama.cpp bf16, 2 threads, 3.07x the untuned decode speed.
    figures = {"ttft_p50_seconds": (0.205303, 0.144736), "ttft_p95_seconds": (1.634037, 0.153906),
               "tpot_p50_seconds": (0.123962, 0.04043), "itl_p50_seconds": (0.121946, 0.041338),
               "e2e_p50_seconds": (4.045072, 1.39878), "decode_tokens_per_second": (8.068, 24.773),
               "output_tokens_per_second": (7.185, 22.841), "failed_requests": (0, 0)}
    for figure, (baseline, validation) in figures.items():
        assert value(samples, "llmtune_benchmark_" + figure, run="baseline") == baseline, figure
        assert value(samples, "llmtune_benchmark_" + figure, run="validation") == validation, figure
    assert value(samples, "llmtune_benchmark_gain_ratio", figure="decode_tokens_per_s") == 3.0705
    assert value(samples, "llmtune_benchmark_gain_ratio", figure="ttft_ms_p50") == 1.4185
    assert value(samples, "llmtune_benchmark_roofline_ratio") == 0.914
    assert value(samples, "llmtune_benchmark_roofline_tokens_per_second") == 27.092
    # The service 5.4 % faster than its direct-run twin in the median of 4 paired rounds: within the limit.
    assert value(samples, "llmtune_benchmark_twin_gap_ratio", figure="decode_tokens_per_s") == -0.054
    assert value(samples, "llmtune_benchmark_twin_rounds") == 4
    assert labelled(samples, "llmtune_benchmark_twin_verdict") == [{"verdict": "within"}]
    assert value(samples, "llmtune_benchmark_timestamp_seconds", run="validation") == timestamp("2026-12-04T21:23:36Z")
    assert value(samples, "llmtune_benchmark_noisy", run="validation") == 0
    # The chosen stack, as the serve stage maps it.
    assert labelled(samples, "llmtune_stack_info") == [
        {"engine": "llama_cpp", "format": "bf16", "layout": "single", "allocator": "none"}]
    assert (value(samples, "llmtune_stack_threads"), value(samples, "llmtune_stack_parallel_slots")) == (2, 4)
    # The state file: the grub command line changed (a container boots no kernel of its own: no other setting).
    assert value(samples, "llmtune_setting_applied_timestamp_seconds", setting="grub.cmdline") == \
        timestamp("2026-12-04T20:22:46Z")
    assert [value(samples, "llmtune_state_" + kind) for kind in ("settings", "files", "packages")] == [1, 4, 5]


def test_a_second_write_changes_nothing_and_check_mode_writes_nothing(tmp_path, host, capsys):
    path = tmp_path / "llmtune.prom"
    preview = run(dict(host, path=str(path)), capsys, check_mode=True)
    assert preview["changed"] is True and not path.exists()
    assert preview["diff"]["before"] == "" and "llmtune_stack_info{" in preview["diff"]["after"]
    first = run(dict(host, path=str(path)), capsys)
    mtime = path.stat().st_mtime_ns
    second = run(dict(host, path=str(path)), capsys)
    assert (first["changed"], second["changed"]) == (True, False)
    assert path.stat().st_mtime_ns == mtime and first["text"] == path.read_text() == preview["text"]
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    # Nothing but the file (and the host's folder): the temporary file of the atomic write is gone.
    assert sorted(os.listdir(tmp_path)) == ["llmtune", "llmtune.prom"]


def drift_rows(root, capsys):
    """The rows of a real drift check of the boot parameters of fixture tree ROOT (tests/fixtures/drift), as
    playbooks/verify.yml hands them on, and a THP setting the tree's kernel lacks."""
    args = {"path": str(root / "etc/default/grub"), "running_cmdline": str(root / "proc/cmdline"),
            "_ansible_check_mode": True}
    with patch_module_args(args), pytest.raises(SystemExit):
        kernel_cmdline.main()
    configured = json.loads(capsys.readouterr().out)["cmdline"]
    args = {"sysroot": str(root), "_ansible_check_mode": True,
            "settings": [{"key": "thp.defrag", "path": "/sys/kernel/mm/transparent_hugepage/defrag", "value": "madvise"}],
            "boot_params": {"set": {"intel_idle.max_cstate": "1", "processor.max_cstate": "1",
                                    "transparent_hugepage": "madvise"}, "configured": configured}}
    with patch_module_args(args), pytest.raises(SystemExit):
        tuning_drift.main()
    return json.loads(capsys.readouterr().out)["rows"]


@needs_exporter
def test_a_drift_check_exports_its_rows_until_the_tuning_runs_again(exporter, host, tmp_path, capsys):
    folder, url = exporter
    path = str(folder / "llmtune.prom")
    rows = drift_rows(copy_tree(tmp_path, "drift", "boot-pending"), capsys)
    before = time.time()
    assert run(dict(host, path=path, drift_rows=rows), capsys)["changed"] is True
    stored = json.loads(read(host["drift_path"]))
    assert stored["rows"] == rows and before - 1 <= timestamp(stored["checked"]) <= time.time()
    samples, _types = scrape(url)
    assert value(samples, "node_textfile_scrape_error") == 0
    # Configured in the grub defaults, not in force in the running kernel: a reboot is pending.
    assert value(samples, "llmtune_reboot_pending") == 1
    assert {status: value(samples, "llmtune_drift_settings", status=status)
            for status in ("ok", "drift", "pending reboot", "n/a")} == {"ok": 1, "drift": 0, "pending reboot": 2,
                                                                        "n/a": 1}
    assert sorted((label["setting"], label["status"]) for label in labelled(samples, "llmtune_drift_setting_status")) == [
        ("grub.boot.intel_idle.max_cstate", "pending reboot"), ("grub.boot.processor.max_cstate", "pending reboot"),
        ("grub.boot.transparent_hugepage", "ok"), ("thp.defrag", "n/a")]
    assert value(samples, "llmtune_drift_check_timestamp_seconds") == timestamp(stored["checked"])
    assert value(samples, "llmtune_source_present", source="drift") == 1

    # After the reboot the same check finds every parameter in force.
    run(dict(host, path=path, drift_rows=drift_rows(copy_tree(tmp_path, "drift", "boot-rebooted"), capsys)), capsys)
    samples, _types = scrape(url)
    assert value(samples, "llmtune_reboot_pending") == 0
    assert value(samples, "llmtune_drift_settings", status="pending reboot") == 0

    # site.yml applied the tuning again: the check no longer describes the host, its metrics go until the next one.
    assert run(dict(host, path=path, forget_drift=True), capsys)["changed"] is True
    samples, _types = scrape(url)
    assert not os.path.exists(host["drift_path"])
    assert value(samples, "llmtune_source_present", source="drift") == 0
    assert not [key for key in samples if key[0].startswith(("llmtune_drift", "llmtune_reboot"))]


@needs_exporter
@pytest.mark.parametrize("name, chosen, labels, slots", [
    # The demo's stored transformers winner (gguf_type null), and the first auto-tune's, which named no engine.
    ("the demo's transformers bfloat16", json.loads(read(FIXTURES, "autotune", "autotune-demo.json"))["chosen"],
     {"engine": "transformers", "format": "bfloat16", "layout": "single", "allocator": "none"}, None),
    ("v1 transformers only", json.loads(read(FIXTURES, "autotune", "stored-choices.json"))["v1 transformers only"],
     {"engine": "transformers", "format": "bfloat16", "layout": "single", "allocator": "none"}, None),
    ("one engine per NUMA node",
     json.loads(read(FIXTURES, "autotune", "stored-choices.json"))["one engine per NUMA node"],
     {"engine": "llama_cpp", "format": "bf16", "layout": "per_node", "allocator": "none"}, 4),
    # vLLM: its dtype, and its sequences as the slots.
    ("vLLM", {"engine": "vllm", "format": "bfloat16", "threads": 2, "cpus": "0 1", "tuned": True, "allocator": "none",
              "parallel": 8, "continuous_batching": False, "layout": "single"},
     {"engine": "vllm", "format": "bfloat16", "layout": "single", "allocator": "none"}, 8),
])
def test_every_stored_choice_exports_its_stack(exporter, tmp_path, capsys, name, chosen, labels, slots):
    folder, url = exporter
    (tmp_path / "autotune.json").write_text(json.dumps({"chosen": chosen}))
    missing = str(tmp_path / "none.json")
    run({"path": str(folder / "llmtune.prom"), "autotune_path": str(tmp_path / "autotune.json"),
         "state_path": missing, "baseline_path": missing, "validation_path": missing, "drift_path": missing}, capsys)
    samples, _types = scrape(url)
    assert labelled(samples, "llmtune_stack_info") == [labels], name
    assert value(samples, "llmtune_stack_threads") == chosen["threads"]
    assert labelled(samples, "llmtune_stack_parallel_slots") == ([{}] if slots else [])
    assert value(samples, "llmtune_source_present", source="validation") == 0


@needs_exporter
@pytest.mark.parametrize("capacity, slots, streams", [
    ({"status": "measured", "streams": 2, "serve": {"admitted": 2, "parallel": 2}}, 2, 2),
    # One stream alone missed the targets: served one at a time, and the capacity says 0.
    ({"status": "measured", "streams": 0, "serve": {"admitted": 1, "parallel": 1}}, 1, 0),
    # A failed capacity stage: the chosen row's own slots, no capacity.
    ({"status": "failed: The engine failed to start", "serve": {}}, 4, None),
])
def test_the_served_slots_and_the_capacity_come_from_the_capacity_stage(exporter, tmp_path, capsys, capacity, slots,
                                                                        streams):
    folder, url = exporter
    chosen = json.loads(read(FIXTURES, "autotune", "stored-choices.json"))["one engine per NUMA node"]
    (tmp_path / "autotune.json").write_text(json.dumps({"chosen": chosen, "capacity": capacity}))
    missing = str(tmp_path / "none.json")
    run({"path": str(folder / "llmtune.prom"), "autotune_path": str(tmp_path / "autotune.json"),
         "state_path": missing, "baseline_path": missing, "validation_path": missing, "drift_path": missing}, capsys)
    samples, _types = scrape(url)
    assert value(samples, "llmtune_stack_parallel_slots") == slots
    assert labelled(samples, "llmtune_autotune_capacity_streams") == ([] if streams is None else [{}])
    if streams is not None:
        assert value(samples, "llmtune_autotune_capacity_streams") == streams


@needs_exporter
def test_a_host_without_files_exports_which_are_missing_and_labels_survive_escaping(exporter, tmp_path, capsys):
    folder, url = exporter
    missing = str(tmp_path / "none.json")
    # A drift row whose name holds every character the text format escapes.
    odd = 'cpufreq."policy\\0"\nnext'
    run({"path": str(folder / "llmtune.prom"), "state_path": missing, "baseline_path": missing,
         "validation_path": missing, "autotune_path": "", "drift_path": str(tmp_path / "drift.json"),
         "drift_rows": [{"setting": odd, "wanted": "x", "actual": "y", "status": "drift", "reason": ""}]}, capsys)
    samples, _types = scrape(url)
    assert value(samples, "node_textfile_scrape_error") == 0
    assert value(samples, "llmtune_source_present", source="validation") == 0
    assert labelled(samples, "llmtune_drift_setting_status") == [{"setting": odd, "status": "drift"}]
    assert not [key for key in samples if key[0].startswith(("llmtune_benchmark", "llmtune_stack", "llmtune_state"))]


def test_a_damaged_file_fails_naming_it_and_writes_nothing(tmp_path, host, capsys):
    with open(host["validation_path"], "w", encoding="utf-8") as handle:
        handle.write('{"result": ')
    result = run(dict(host, path=str(tmp_path / "llmtune.prom")), capsys)
    assert result["failed"] is True and result["msg"].startswith(f"llmtune_metrics: {host['validation_path']} is not JSON")
    assert not (tmp_path / "llmtune.prom").exists()


# --- the role, as site.yml and playbooks/verify.yml run it ------------------------------------------------------

def play(tmp_path, entry, variables, check=False):
    """Run roles/metrics (tasks_from ENTRY) on this machine with VARIABLES; returns the recap's changed count."""
    book = tmp_path / "play.yml"
    book.write_text(json.dumps([{"hosts": "localhost", "gather_facts": False, "tasks": [
        {"ansible.builtin.include_role": {"name": "metrics", "tasks_from": entry}}]}]))
    cmd = [os.path.join(VENV_BIN, "ansible-playbook"), "-i", "localhost,", "-c", "local", str(book),
           "-e", json.dumps(dict(variables, ansible_python_interpreter=os.path.join(VENV_BIN, "python")))]
    done = subprocess.run(cmd + (["--check"] if check else []), cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg")), check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return int(done.stdout.rsplit("changed=", 1)[1].split()[0])


@needs_exporter
def test_the_role_writes_once_checks_the_exporter_and_exports_a_drift_check(exporter, host, tmp_path):
    folder, url = exporter
    variables = {"metrics_textfile": str(folder / "llmtune.prom"), "metrics_check_url": url,
                 "metrics_state_path": host["state_path"], "benchmark_baseline_path": host["baseline_path"],
                 "benchmark_validation_path": host["validation_path"], "autotune_state_path": host["autotune_path"]}
    assert play(tmp_path, "main", variables, check=True) == 1
    assert not (folder / "llmtune.prom").exists()
    assert [play(tmp_path, "main", variables), play(tmp_path, "main", variables)] == [1, 0]
    rows = [{"setting": "thp.enabled", "wanted": "madvise", "actual": "always", "status": "drift", "reason": ""}]
    # An output of every check, as the reports: never a change.
    assert play(tmp_path, "drift", dict(variables, metrics_drift_rows=rows)) == 0
    samples, _types = scrape(url)
    assert labelled(samples, "llmtune_drift_setting_status") == [{"setting": "thp.enabled", "status": "drift"}]
    assert value(samples, "llmtune_benchmark_decode_tokens_per_second", run="validation") == 24.773
    # llmtune_autotune=false: the service is pinned by variables, not the stored choice.
    play(tmp_path, "main", dict(variables, llmtune_autotune=False))
    samples, _types = scrape(url)
    assert value(samples, "llmtune_source_present", source="autotune") == 0 and not labelled(samples, "llmtune_stack_info")


def test_the_role_writes_nothing_without_a_textfile_folder(tmp_path, host):
    variables = {"metrics_textfile": str(tmp_path / "absent" / "llmtune.prom"), "metrics_state_path": host["state_path"]}
    assert play(tmp_path, "main", variables) == 0
    assert not (tmp_path / "absent").exists()


# --- the engines' own metrics through nginx ------------------------------------------------------------------

CLIENT_KEY = "client-key-0123456789abcdefABCDEF+/"
ENGINE_KEY = "engine-key-0123456789abcdefghijklmnop"
# llama-server 0.3.36 (--metrics, --api-key-file) after one chat completion, GET /metrics with its key.
LLAMA_METRICS = read(FIXTURES, "metrics", "llama-server-metrics.txt")


def fake_engine(index, seen):
    """An HTTP server answering /metrics as llama-server does: its recorded metrics for ENGINE_KEY (engine INDEX's
    tokens_predicted_total is 1000 * INDEX + 4), 401 otherwise; SEEN collects (index, Authorization) of each request."""
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            seen.append((index, self.headers.get("Authorization")))
            if self.path != "/metrics":
                self.send_error(404)
                return
            ok = self.headers.get("Authorization") == f"Bearer {ENGINE_KEY}"
            body = (LLAMA_METRICS.replace("llamacpp:tokens_predicted_total 4",
                                          f"llamacpp:tokens_predicted_total {1000 * index + 4}") if ok else
                    '{"error":{"message":"Invalid API Key","type":"authentication_error","code":401}}').encode()
            self.send_response(200 if ok else 401)
            self.send_header("Content-Type", "text/plain; version=0.0.4" if ok else "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture(name="proxy", scope="module")
def fixture_proxy(tmp_path_factory):
    """The role's nginx site in front of two engines (inference_service_layout per_node); yields (port, seen)."""
    from test_proxy_nginx import proxy_site
    seen = []
    engines = [fake_engine(index, seen) for index in range(2)]
    prefix = tmp_path_factory.mktemp("nginx")
    port = free_port()
    http = proxy_site(prefix, port, [f"127.0.0.1:{engine.server_port}" for engine in engines], CLIENT_KEY, ENGINE_KEY,
                      inference_proxy_max_output_tokens=16)
    try:
        with run_nginx(prefix, http, f"http://127.0.0.1:{port}/metrics", js=True):
            yield port, seen
    finally:
        for engine in engines:
            engine.shutdown()


def status(port, path, key):
    """HTTP status of GET PATH with KEY as bearer token (None: no header); 0 when nginx does not answer."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}",
                                     headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code
    except OSError:
        return 0


def test_each_engines_metrics_reach_the_scraper_with_the_key(proxy):
    port, seen = proxy
    bearer = {"Authorization": f"Bearer {CLIENT_KEY}"}
    for index in (0, 1):
        seen.clear()
        samples, types = scrape(f"http://127.0.0.1:{port}/metrics/{index}", bearer)
        assert value(samples, "llamacpp:tokens_predicted_total") == 1000 * index + 4
        assert types["llamacpp:tokens_predicted"] == "counter"
        # The engine gets its own key; the client's stays with nginx.
        assert seen == [(index, f"Bearer {ENGINE_KEY}")]
    # /metrics is always the first engine's: a scrape that hopped between engines would make counters jump.
    assert {value(scrape(f"http://127.0.0.1:{port}/metrics", bearer)[0], "llamacpp:tokens_predicted_total")
            for _ in range(4)} == {4}


@pytest.mark.parametrize("path", ["/metrics", "/metrics/0", "/metrics/1"])
@pytest.mark.parametrize("key", [None, CLIENT_KEY[:-1], ENGINE_KEY])
def test_metrics_without_the_client_key_get_401_before_any_engine(proxy, path, key):
    port, seen = proxy
    seen.clear()
    assert status(port, path, key) == 401
    assert seen == []


def test_no_metrics_of_an_engine_that_is_not_there(proxy):
    port, seen = proxy
    seen.clear()
    assert status(port, "/metrics/2", CLIENT_KEY) == 404
    assert seen == []
