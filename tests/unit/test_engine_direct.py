"""library/engine_direct.py: the service's command read from real `systemctl show` output, and a real twin run."""

import os
import subprocess
import time
import urllib.request

import pytest

import engine_direct as ed  # noqa: E402  (library/ is on sys.path via conftest)
from conftest import FIXTURES, PROXY_ENV, VENV_BIN, engine_proc_tree, free_port  # noqa: E402


def show(name):
    with open(os.path.join(FIXTURES, "systemd", name), encoding="utf-8") as handle:
        return ed.parse_show(handle.read())


def test_untuned_unit_runs_its_command_unpinned_on_the_twin_port():
    argv, env, user, group, cpus = ed.twin_spec(show("show-untuned"), 8100)
    assert argv == ["/opt/llmtune/venv/bin/transformers", "serve", "/opt/llmtune/models/qwen3-0.6b-proxy",
                    "--device", "cpu", "--host", "127.0.0.1", "--port", "8100", "--dtype", "auto"]
    assert env == {"HF_HUB_OFFLINE": "1", "HF_HOME": "/var/cache/llm-inference"}
    assert (user, group, cpus) == ("llm", "llm", None)


def test_tuned_unit_keeps_threads_and_pinning():
    argv, env, user, _group, cpus = ed.twin_spec(show("show-tuned"), 9000)
    assert argv[argv.index("--port") + 1] == "9000"
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "2"
    assert (user, cpus) == ("llm", [0, 1])


def test_numa_binding_runs_under_numactl():
    argv, *_ = ed.twin_spec(dict(show("show-tuned"), NUMAPolicy="bind", NUMAMask="1"), 8100)
    assert argv[:2] == ["numactl", "--membind=1"]


def test_an_instance_of_a_template_unit_runs_with_its_drop_ins_port_and_threads():
    # systemd substitutes ${LLMTUNE_PORT} when it starts the command; `systemctl show` prints it unsubstituted.
    argv, env, _user, _group, cpus = ed.twin_spec(show("show-instance"), 8100)
    assert argv[argv.index("--port") + 1] == "8100"
    assert argv[argv.index("--threads") + 1] == argv[argv.index("--threads-batch") + 1] == "2"
    assert not [arg for arg in argv if "$" in arg]
    assert (env["LLMTUNE_PORT"], cpus) == ("8001", [2, 3])


@pytest.mark.parametrize("argv, expanded", [
    (["e", "--threads", "${T}"], ["e", "--threads", "4"]),
    (["e", "--x=${T}${T}"], ["e", "--x=44"]),
    (["e", "$ARGS", "z"], ["e", "-a", "b", "z"]),
    (["e", "$UNSET", "${UNSET}"], ["e", ""]),
    (["e", "$$T", "a$$b"], ["e", "$T", "a$b"]),
])
def test_environment_substitution_as_systemd_does_it(argv, expanded):
    assert ed.expand(argv, {"T": "4", "ARGS": "-a  b"}) == expanded


@pytest.mark.parametrize("exec_start, message", [
    ("", "the unit has no ExecStart (is it installed?)"),
    ("{ path=/bin/engine ; argv[]=/bin/engine --host 127.0.0.1 ; ignore_errors=no }",
     "the service's command has no --port option: /bin/engine --host 127.0.0.1"),
])
def test_a_command_the_twin_cannot_copy_is_named(exec_start, message):
    with pytest.raises(ed.DirectError) as error:
        ed.twin_spec({"ExecStart": exec_start}, 8100)
    assert str(error.value) == message


def test_port_given_with_equals_sign():
    assert ed.with_port(["engine", "--port=8000"], 8100) == ["engine", "--port=8100"]


def test_twin_runs_the_real_engine_pinned_with_the_units_environment(tiny_proxy_dir, tmp_path):
    """The real `transformers serve` started from a unit's settings, answering on the twin port, then ended."""
    port = free_port()
    exec_start = (f"{{ path={VENV_BIN}/transformers ; argv[]={VENV_BIN}/transformers serve {tiny_proxy_dir} --device cpu "
                  f"--host 127.0.0.1 --port 1 ; ignore_errors=no ; start_time=[n/a] ; pid=0 ; status=0/0 }}")
    unit = {"ExecStart": exec_start, "User": "root", "Group": "", "CPUAffinity": "0",
            "Environment": f"OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 HF_HOME={PROXY_ENV.get('HF_HOME', tmp_path)}"}
    params = {"port": port, "health_path": "/health", "timeout": 120, "timeout_stop": 20,
              "pid_file": str(tmp_path / "twin.pid"), "log_path": str(tmp_path / "log" / "twin.log")}
    result = ed.start(params, unit)
    try:
        assert result["url"] == f"http://127.0.0.1:{port}"
        with urllib.request.urlopen(result["url"] + "/health", timeout=5) as resp:
            assert resp.status == 200
        with open(f"/proc/{result['pid']}/status", encoding="ascii") as handle:
            status = dict(line.split(":\t", 1) for line in handle.read().splitlines() if ":\t" in line)
        assert status["Cpus_allowed_list"].strip() == "0"
        with open(f"/proc/{result['pid']}/environ", "rb") as handle:
            environ = handle.read().split(b"\0")
        assert b"OMP_NUM_THREADS=1" in environ and b"HF_HUB_OFFLINE=1" in environ
        assert result["environment"] == ["HF_HOME", "HF_HUB_OFFLINE", "OMP_NUM_THREADS"]
        assert ed.read_pid(params["pid_file"]) == result["pid"]
    finally:
        assert ed.stop(params["pid_file"], 20) is True
    with open(f"/proc/{result['pid']}/stat", encoding="ascii") as handle:
        assert handle.read().rsplit(")", 1)[1].split()[0] == "Z"  # ended; reaped by its parent, this test
    assert ed.stop(params["pid_file"], 20) is False  # nothing left to stop


@pytest.mark.parametrize("script", [
    # The leader ends on SIGTERM; a worker it started ignores it: SIGKILL must still reach the worker.
    '(trap "" TERM; exec sleep 300) & exec sleep 300',
    # Nothing of the group ends on SIGTERM.
    'trap "" TERM; sleep 300 & wait',
], ids=["worker-ignores-sigterm", "group-ignores-sigterm"])
def test_stop_returns_when_the_whole_group_has_ended(tmp_path, script):
    """stop() is done only when no process of the twin's group runs, so the memory and port are free for the next."""
    proc = subprocess.Popen(["/bin/sh", "-c", script], start_new_session=True)
    pid_file = tmp_path / "twin.pid"
    pid_file.write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + 10
    while len(ed.group_running(proc.pid)) < 2:
        assert time.monotonic() < deadline, "the worker did not start"
        time.sleep(0.05)
    try:
        assert ed.stop(str(pid_file), 0.5) is True
        assert ed.group_running(proc.pid) == []
        assert not pid_file.exists()
    finally:
        proc.kill()
        proc.wait()


def test_each_engine_has_a_twin_of_its_own(tmp_path, monkeypatch):
    """One engine per NUMA node: two units' twins run at once, each with its own PID file and log by default, and
    stopping one leaves the other."""
    monkeypatch.setattr(ed, "PID_DIR", str(tmp_path / "run"))
    monkeypatch.setattr(ed, "LOG_DIR", str(tmp_path / "log"))
    server = ("import sys, http.server as h; h.HTTPServer(('127.0.0.1', int(sys.argv[2])), "
              "h.SimpleHTTPRequestHandler).serve_forever()")
    unit = {"ExecStart": f"{{ path=/usr/bin/python3 ; argv[]=/usr/bin/python3 -c \"{server}\" --port 1 ; "
                         "ignore_errors=no }", "User": "root"}
    twins = {}
    try:
        for name in ("llm-inference@0.service", "llm-inference@1.service"):
            params = dict(ed.twin_files(name), port=free_port(), health_path="/", timeout=30, timeout_stop=5)
            twins[name] = (params, ed.start(params, unit))
        files = [params["pid_file"] for params, _ in twins.values()]
        assert files == [str(tmp_path / "run" / f"llm-inference@{i}.service.pid") for i in (0, 1)]
        assert [ed.read_pid(f) for f in files] == [result["pid"] for _, result in twins.values()]
        assert ed.stop(files[0], 5) is True
        assert ed.read_pid(files[0]) is None and ed.read_pid(files[1]) == twins["llm-inference@1.service"][1]["pid"]
        assert os.path.isfile(tmp_path / "log" / "llm-inference@1.service.log")
    finally:
        for params, _ in twins.values():
            ed.stop(params["pid_file"], 5)
    # Given files win over the defaults.
    assert ed.twin_files("x.service", "/p", "/l") == {"pid_file": "/p", "log_path": "/l"}


def test_the_twin_runs_in_a_scope_of_the_units_slice(tmp_path):
    """Issue 39, kind 4: the twin shares the service's slice limits, not the login's; systemd-run (a stand-in that
    records its options and executes the command in place, as the real one does in --scope mode) switches user."""
    log = tmp_path / "systemd-run.args"
    fake = tmp_path / "systemd-run"
    fake.write_text('#!/bin/sh\necho "$@" > %s\nwhile [ "$1" != -- ]; do shift; done\nshift\nexec "$@"\n' % log)
    fake.chmod(0o755)
    server = ("import sys, http.server as h; h.HTTPServer(('127.0.0.1', int(sys.argv[2])), "
              "h.SimpleHTTPRequestHandler).serve_forever()")
    unit = {"ExecStart": f"{{ path=/usr/bin/python3 ; argv[]=/usr/bin/python3 -c \"{server}\" --port 1 ; "
                         "ignore_errors=no }", "User": "root", "CPUAffinity": "0", "Slice": "system.slice"}
    params = {"port": free_port(), "health_path": "/", "timeout": 30, "timeout_stop": 5,
              "pid_file": str(tmp_path / "twin.pid"), "log_path": str(tmp_path / "twin.log")}
    result = ed.start(params, unit, systemd_run=str(fake))
    try:
        assert log.read_text().split(" -- ")[0] == "--scope --quiet --slice=system.slice --uid=root --gid=0"
        assert result["slice"] == "system.slice" and result["argv"][0] == "/usr/bin/python3"
        # The command replaced systemd-run: the PID file names the server itself, pinned as the unit says.
        with open(f"/proc/{result['pid']}/cmdline", "rb") as handle:
            assert handle.read().split(b"\0")[0] == b"/usr/bin/python3"
        with open(f"/proc/{result['pid']}/status", encoding="ascii") as handle:
            assert "Cpus_allowed_list:\t0\n" in handle.read()
    finally:
        assert ed.stop(params["pid_file"], 5) is True
    # Without systemd the twin runs where the module runs, and says so.
    assert ed.scope_argv(["e"], "system.slice", "llm", 7, None) == ["e"]


def test_a_twin_that_exits_fails_with_its_output(tmp_path):
    unit = {"ExecStart": "{ path=/bin/sh ; argv[]=/bin/sh -c \"echo no model here; exit 3\" --port 1 ; ignore_errors=no }",
            "User": "root"}
    params = {"port": free_port(), "health_path": "/health", "timeout": 30, "timeout_stop": 5,
              "pid_file": str(tmp_path / "twin.pid"), "log_path": str(tmp_path / "twin.log")}
    with pytest.raises(ed.DirectError) as error:
        ed.start(params, unit)
    assert str(error.value) == "the twin exited with status 3: no model here"


@pytest.mark.parametrize("margin_mb, short", [
    (0, None),
    # MemAvailable 24191764 kB against VmRSS 8712 kB + the margin: room up to a margin of 23616 MiB.
    (23616, None),
    (23617, "not enough memory for the twin beside the service: VmRSS 8 MiB + margin 23617 MiB > MemAvailable "
            "23624 MiB"),
])
def test_the_twin_needs_room_for_a_second_copy_beside_the_service(tmp_path, margin_mb, short):
    """Real captures: a Python process's /proc/PID/status and this 24 GiB machine's /proc/meminfo."""
    (tmp_path / "4242").mkdir()
    for source, target in (("jinja/proc-status", "4242/status"), ("proc/meminfo-debian12-24g", "meminfo")):
        with open(os.path.join(FIXTURES, source), encoding="ascii") as handle:
            (tmp_path / target).write_text(handle.read())
    assert ed.memory_short(4242, margin_mb, proc=str(tmp_path)) == short
    # No running service (MainPID 0, or a process that is gone): nothing to keep room for.
    assert ed.memory_short(0, 10 ** 6, proc=str(tmp_path)) is None
    assert ed.memory_short(4343, 10 ** 6, proc=str(tmp_path)) is None


def test_the_twin_needs_room_for_the_services_child_processes_too(tmp_path):
    """vLLM's model lives in a worker, a child of the engine core, a child of the unit's main process: the room a
    twin needs is the whole tree's (the same capture for each process, VmRSS 8712 kB)."""
    engine_proc_tree(tmp_path)
    # MemAvailable 24191764 kB: room for 3 x 8712 kB and a margin of up to 23599 MiB.
    assert ed.memory_short(4242, 23599, proc=str(tmp_path)) is None
    assert ed.memory_short(4242, 23600, proc=str(tmp_path)) == (
        "not enough memory for the twin beside the service: VmRSS 25 MiB + margin 23600 MiB > MemAvailable 23624 MiB")
