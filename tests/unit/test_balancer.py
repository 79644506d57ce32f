"""The balancer role's HAProxy configuration, run by Debian's haproxy in front of two streaming HTTP servers, and its
`server` entry point (community.general.haproxy on the real runtime API): requests over a host's maxconn wait in the
queue, past the queue timeout they get a 503 with Retry-After, no stream is cut, and a host taken out of the pool gets
no new request and is left only once its last stream ended."""

import http.client
import json
import os
import re
import signal
import ssl
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from conftest import ROOT, end_process, free_port, haproxy_programs

PROGRAMS = haproxy_programs()
pytestmark = pytest.mark.skipif(PROGRAMS is None, reason="needs haproxy and socat (scripts/setup-controller.sh)")
CHUNKS = 10


class Engine(ThreadingHTTPServer):
    """One inference host as the balancer sees it: /health, and a chat completion streamed in CHUNKS events
    self.step seconds apart. Counts the streams in flight and the most at once."""

    daemon_threads = True

    def handle_error(self, request, client_address):
        """Quiet: haproxy ends each health check's connection with a reset."""

    def __init__(self, port):
        super().__init__(("127.0.0.1", port), EngineHandler)
        self.step = 0.1
        self.lock = threading.Lock()
        self.in_flight = 0
        self.most = 0
        self.served = 0


class EngineHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with self.server.lock:
            self.server.in_flight += 1
            self.server.most = max(self.server.most, self.server.in_flight)
        try:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for index in range(CHUNKS):
                time.sleep(self.server.step)
                self.chunk(f"data: {json.dumps({'index': index})}\n\n")
            self.chunk("data: [DONE]\n\n")
        finally:
            # Counted before the last byte: only after it does the balancer send this engine another request and
            # the client see its stream end.
            with self.server.lock:
                self.server.in_flight -= 1
                self.server.served += 1
        self.wfile.write(b"0\r\n\r\n")

    def chunk(self, text):
        data = text.encode()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()


def stream(port, results, tls=True):
    """POST a chat completion through the balancer (HTTPS, its certificate self-signed, unless not TLS); append
    (status, headers by lower-case name, body, events received)."""
    conn = (http.client.HTTPSConnection("127.0.0.1", port, timeout=30, context=ssl._create_unverified_context())
            if tls else http.client.HTTPConnection("127.0.0.1", port, timeout=30))
    conn.request("POST", "/v1/chat/completions", body=b'{"stream": true}',
                 headers={"Content-Type": "application/json", "Authorization": "Bearer client-key"})
    resp = conn.getresponse()
    body = resp.read().decode()
    headers = {name.lower(): value for name, value in resp.getheaders()}
    results.append((resp.status, headers, body, len(re.findall(r"^data: \{", body, re.M))))
    conn.close()


def streams(port, count, spacing=0.0):
    """COUNT streams at once (SPACING seconds between their starts); their results."""
    results = []
    threads = [threading.Thread(target=stream, args=(port, results)) for _ in range(count)]
    for thread in threads:
        thread.start()
        time.sleep(spacing)
    for thread in threads:
        thread.join()
    return results


def complete(result):
    status, dummy, body, events = result
    return status == 200 and events == CHUNKS and body.rstrip().endswith("data: [DONE]")


def ansible(tmp_path, playbook, env, extra):
    """Run PLAYBOOK against the inventory of two inference hosts and one balancer, all on this machine."""
    path = tmp_path / "playbook.yml"
    path.write_text(playbook)
    run = subprocess.run(["ansible-playbook", "-i", str(tmp_path / "inventory.yml"), str(path), "-e",
                          json.dumps(extra)], cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    return run.stdout


def render(tmp_path, env, extra):
    """The role's configuration and error page for the inventory in TMP_PATH, written into TMP_PATH: its path. The
    package's haproxy user and chroot are not on this machine: those lines are left out, and it runs in the
    foreground."""
    ansible(tmp_path, f"""
- hosts: balancer
  gather_facts: false
  tasks:
    - ansible.builtin.include_vars: {ROOT}/roles/balancer/defaults/main.yml
    - ansible.builtin.include_vars: {ROOT}/roles/balancer/vars/main.yml
    - ansible.builtin.include_vars:
        {{file: {ROOT}/roles/inference_service/defaults/main.yml, name: __balancer_inference_defaults}}
    - ansible.builtin.template:
        {{src: {ROOT}/roles/balancer/templates/503.http.j2, dest: "{{{{ __balancer_error_file }}}}", mode: "0644"}}
    - ansible.builtin.template:
        {{src: {ROOT}/roles/balancer/templates/haproxy.cfg.j2, dest: "{{{{ __balancer_config }}}}", mode: "0644"}}
""", env, extra)
    config = tmp_path / "haproxy.cfg"
    config.write_text(re.sub(r"^\s*(chroot|user|group|daemon)\b.*\n", "", config.read_text(), flags=re.M))
    check = subprocess.run([PROGRAMS[0], "-c", "-q", "-f", str(config)], env=env, capture_output=True, text=True,
                           check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    return config


def inventory(tmp_path, engines, defaults=()):
    """Inference hosts with the port and one slot of each engine, and hosts named in DEFAULTS with neither."""
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    hosts = {name: {**local, "balancer_server_address": "127.0.0.1",
                    "inference_service_proxy_port": engine.server_address[1], "inference_service_max_concurrent": 1}
             for name, engine in engines.items()}
    hosts.update({name: {**local, "balancer_server_address": "127.0.0.1"} for name in defaults})
    (tmp_path / "inventory.yml").write_text(json.dumps({
        "inference_nodes": {"hosts": hosts}, "balancer": {"hosts": {"lb": local}}}))


def paths(tmp_path):
    """The role's files, moved into TMP_PATH."""
    return {"balancer_socket": str(tmp_path / "admin.sock"), "__balancer_error_file": str(tmp_path / "503.http"),
            "__balancer_server_state_file": str(tmp_path / "server-state"),
            "__balancer_config": str(tmp_path / "haproxy.cfg"), "balancer_listen": "127.0.0.1"}


# The role's entry point `server` on the host named by the extra variable target.
SERVER_PLAYBOOK = f"""
- hosts: "{{{{ target }}}}"
  gather_facts: false
  tasks:
    - ansible.builtin.include_role: {{name: {ROOT}/roles/balancer, tasks_from: server}}
"""


@pytest.fixture(name="haproxy", scope="module")
def fixture_haproxy(tmp_path_factory):
    """haproxy on the role's configuration with TLS, in front of two engines of one slot each:
    (port, engines, run, folder)."""
    tmp_path = tmp_path_factory.mktemp("balancer")
    haproxy, dummy, env = PROGRAMS
    env = dict(env, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"))
    engines = {name: Engine(free_port()) for name in ("node1", "node2")}
    for engine in engines.values():
        threading.Thread(target=engine.serve_forever, daemon=True).start()
    inventory(tmp_path, engines)
    pem = tmp_path / "balancer.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-keyout", str(pem), "-out", str(tmp_path / "cert.pem")], check=True, capture_output=True)
    pem.write_text(pem.read_text() + (tmp_path / "cert.pem").read_text())
    port = free_port()
    extra = dict(paths(tmp_path), balancer_port=port, balancer_queue_timeout_s=2, balancer_health_interval_s=1,
                 balancer_tls_certificate=str(pem), __balancer_certificate_file=str(pem))
    config = render(tmp_path, env, extra)
    log = open(tmp_path / "haproxy.log", "w", encoding="utf-8")
    proc = subprocess.Popen([haproxy, "-db", "-f", str(config)], env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 20
    while not all(up(tmp_path, env, name) for name in engines):
        assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "haproxy.log").read_text()
        time.sleep(0.2)

    def run(playbook, more):
        return ansible(tmp_path, playbook, env, dict(extra, **more))

    yield port, engines, run, tmp_path
    end_process(proc)
    log.close()
    for engine in engines.values():
        engine.shutdown()


@pytest.fixture(name="balancer")
def fixture_balancer(haproxy):
    """The module's haproxy, its engines' counts at zero, both hosts in the pool."""
    port, engines, run, folder = haproxy
    for engine in engines.values():
        engine.step, engine.most, engine.served = 0.1, 0, 0
    yield port, engines, run
    assert all(status.startswith("UP") for status, dummy in server_status(folder, PROGRAMS[2]).values())


def servers(tmp_path, env):
    """The servers' rows of `show stat` (haproxy's runtime API), split into fields."""
    out = subprocess.run(["socat", "stdio", f"unix-connect:{tmp_path / 'admin.sock'}"], input="show stat\n", env=env,
                         capture_output=True, text=True, check=True).stdout
    return [line.split(",") for line in out.splitlines() if line.startswith("llmtune_inference,node")]


def server_status(tmp_path, env):
    """{server: (status, sessions now)}."""
    return {row[1]: (row[17], int(row[4])) for row in servers(tmp_path, env)}


def weights(tmp_path, env):
    """{server: its weight now}."""
    return {row[1]: int(row[18]) for row in servers(tmp_path, env)}


def up(tmp_path, env, name):
    try:
        return server_status(tmp_path, env).get(name, ("",))[0] == "UP"
    except subprocess.CalledProcessError:
        return False


def test_requests_over_the_slots_wait_in_the_queue_and_none_is_cut(balancer):
    port, engines, dummy = balancer
    # Two slots in all, four streams of about 1 s: two wait about 1 s, inside the 2 s queue timeout.
    results = streams(port, 4)
    assert [complete(result) for result in results] == [True] * 4, results
    assert [engine.most for engine in engines.values()] == [1, 1]
    assert sum(engine.served for engine in engines.values()) == 4


def test_past_the_queue_timeout_a_503_with_retry_after_and_the_streams_in_flight_end_whole(balancer):
    port, engines, dummy = balancer
    for engine in engines.values():
        engine.step = 0.4  # 4 s a stream, past the 2 s queue timeout
    results = streams(port, 4, spacing=0.1)
    served = [result for result in results if result[0] == 200]
    refused = [result for result in results if result[0] != 200]
    assert len(served) == 2 and all(complete(result) for result in served), results
    assert [status for status, *dummy in refused] == [503, 503], refused
    for dummy, headers, body, dummy in refused:
        assert headers.get("retry-after") == "2", (headers, body)
        assert json.loads(body)["error"]["code"] == "service_unavailable"
    assert [engine.most for engine in engines.values()] == [1, 1]


def test_a_host_taken_out_ends_its_streams_gets_no_new_one_and_comes_back(balancer, haproxy):
    port, engines, run = balancer
    tmp_path = haproxy[3]
    dummy, dummy, env = PROGRAMS
    engines["node1"].step = engines["node2"].step = 0.3  # 3 s a stream
    # node2 out of the pool first, so the first stream goes to node1.
    playbook = SERVER_PLAYBOOK
    run(playbook, {"target": "node2", "balancer_server_state": "disabled"})
    assert server_status(tmp_path, env)["node2"][0] == "MAINT"
    first = []
    thread = threading.Thread(target=stream, args=(port, first))
    thread.start()
    time.sleep(0.5)
    assert engines["node1"].in_flight == 1
    # Back with node2, out with node1: the call returns once node1's stream ended, and it ended whole.
    run(playbook, {"target": "node2", "balancer_server_state": "enabled"})
    started = time.monotonic()
    run(playbook, {"target": "node1", "balancer_server_state": "disabled"})
    assert not thread.is_alive() and complete(first[0]), first
    assert time.monotonic() - started > 1
    assert server_status(tmp_path, env)["node1"] == ("MAINT", 0)
    # While node1 is out, every request goes to node2.
    served = engines["node1"].served
    engines["node2"].step = 0.02
    assert all(complete(result) for result in streams(port, 3, spacing=0.4))
    assert engines["node1"].served == served
    run(playbook, {"target": "node1", "balancer_server_state": "enabled"})
    # "UP 1/2" right after the maintenance: up, its health checks not all passed yet.
    assert server_status(tmp_path, env)["node1"][0].startswith("UP")


def test_a_host_put_back_takes_its_weight(balancer, haproxy):
    dummy, dummy, run = balancer
    tmp_path, env = haproxy[3], PROGRAMS[2]
    run(SERVER_PLAYBOOK, {"target": "node2", "balancer_server_state": "disabled"})
    expected = {3: 3, 0: 3, 300: 256, 1: 1}
    for weight, then in expected.items():
        run(SERVER_PLAYBOOK, {"target": "node2", "balancer_server_state": "enabled", "balancer_server_weight": weight})
        assert weights(tmp_path, env) == {"node1": 1, "node2": then}, weight


def test_without_a_certificate_it_listens_in_plain_http(tmp_path):
    dummy, dummy, env = PROGRAMS
    env = dict(env, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"))
    engine = Engine(free_port())
    # node2 sets neither its nginx's port nor its limit: the inference_service role's defaults.
    inventory(tmp_path, {"node1": engine}, defaults=["node2"])
    engine.server_close()
    config = render(tmp_path, env, dict(paths(tmp_path), balancer_port=8443)).read_text()
    assert re.findall(r"^\s*bind .*$", config, flags=re.M) == ["    bind 127.0.0.1:8443"]
    assert re.findall(r"^\s*server .*$", config, flags=re.M) == [
        f"    server node1 127.0.0.1:{engine.server_address[1]} maxconn 1", "    server node2 127.0.0.1:8080 maxconn 4"]


@pytest.mark.parametrize("bad, message", [
    ({"balancer_port": 0}, "balancer_port must be a TCP port (1-65535) (got 0)"),
    ({"balancer_health_path": "health"}, 'balancer_health_path must be a path starting with / (got "health")'),
    ({"balancer_drain_timeout_s": 1}, "balancer_drain_timeout_s must be 2 or more (got 1)"),
    ({"balancer_servers_group": "nowhere"},
     'balancer_servers_group must be a group of the inventory with at least one host (got "nowhere")'),
])
def test_a_bad_variable_is_named_before_anything_is_recorded_or_installed(tmp_path, bad, message):
    dummy, dummy, env = PROGRAMS
    env = dict(env, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"))
    engine = Engine(free_port())
    inventory(tmp_path, {"node1": engine})
    engine.server_close()
    extra = dict(paths(tmp_path), balancer_state_path=str(tmp_path / "state.json"), **bad)
    (tmp_path / "playbook.yml").write_text(f"""
- hosts: balancer
  gather_facts: false
  roles: [{ROOT}/roles/balancer]
""")
    run = subprocess.run(["ansible-playbook", "-i", str(tmp_path / "inventory.yml"), str(tmp_path / "playbook.yml"),
                          "-e", json.dumps(extra)], cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    assert run.returncode == 2 and message in run.stdout, run.stdout[-3000:]
    assert "Traceback" not in run.stdout + run.stderr
    assert not (tmp_path / "state.json").exists() and not (tmp_path / "haproxy.cfg").exists()


def test_a_reload_counts_once_its_new_worker_runs_while_the_old_one_drains_a_stream(tmp_path):
    """files/unit-inputs.sh reloaded, which the role asks whether haproxy loaded its files: Debian's haproxy in
    master-worker mode (as its unit runs it), reloaded with SIGUSR2 while a stream holds the old worker. The reload
    came after the file changed, so nothing is stale, although the old worker started before the change."""
    haproxy, dummy, env = PROGRAMS
    engine = Engine(free_port())
    engine.step = 0.8  # 8 s a stream: the old worker outlives the checks
    threading.Thread(target=engine.serve_forever, daemon=True).start()
    port = free_port()
    config = tmp_path / "haproxy.cfg"
    config.write_text(f"""defaults
    mode http
    timeout connect 5s
    timeout client 30s
    timeout server 30s
frontend f
    bind 127.0.0.1:{port}
    default_backend b
backend b
    server s1 127.0.0.1:{engine.server_address[1]}
""")
    master = subprocess.Popen([haproxy, "-W", "-f", str(config)], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.STDOUT)
    # systemctl(1) answering the script's one question that matters here: haproxy.service's main process.
    systemctl = tmp_path / "bin" / "systemctl"
    systemctl.parent.mkdir()
    systemctl.write_text(f'#!/bin/sh\ncase "$*" in *"--property MainPID "*) echo {master.pid} ;; *) echo ;; esac\n')
    systemctl.chmod(0o755)
    check_env = dict(env, PATH=f"{systemctl.parent}{os.pathsep}{env['PATH']}")

    def stale():
        return subprocess.run([os.path.join(ROOT, "files", "unit-inputs.sh"), "reloaded", "haproxy.service", str(config)],
                              env=check_env, capture_output=True, text=True, check=True).stdout.split()

    def workers(count):
        deadline = time.monotonic() + 20
        while True:
            pids = subprocess.run(["ps", "-o", "pid=", "--ppid", str(master.pid)], capture_output=True, text=True,
                                  check=False).stdout.split()
            if len(pids) == count:
                return pids
            assert time.monotonic() < deadline and master.poll() is None, pids
            time.sleep(0.1)

    results = []
    client = threading.Thread(target=stream, args=(port, results, False))
    try:
        old = workers(1)
        client.start()
        time.sleep(2)
        assert engine.in_flight == 1
        config.touch()
        # Changed after the worker started: the script names the file.
        assert stale() == [str(config)]
        time.sleep(1.1)
        master.send_signal(signal.SIGUSR2)
        # ps(1) counts whole seconds: the new worker at least one old.
        new = [pid for pid in workers(2) if pid not in old]
        time.sleep(1.2)
        # The new worker runs the changed file; the old one, started before the change, still drains the stream.
        assert old[0] in workers(2) and len(new) == 1 and engine.in_flight == 1
        assert stale() == []
        client.join()
        assert complete(results[0]), results
    finally:
        end_process(master)
        engine.shutdown()
