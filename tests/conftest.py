"""Make this project's library/ and module_utils/ importable as Ansible would load them."""

import os
import sys

import ansible.module_utils

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Ansible serves module_utils/ under the ansible.module_utils namespace; tests do the same.
ansible.module_utils.__path__.append(os.path.join(ROOT, "module_utils"))
sys.path.insert(0, os.path.join(ROOT, "library"))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")


def role_module(role, name):
    """Import roles/ROLE/library/NAME.py (a role's own module, which Ansible finds beside the role)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "roles", role, "library", name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def copy_tree(tmp_path, group, name):
    """Copy fixture tree tests/fixtures/GROUP/NAME to TMP_PATH/NAME (a sysroot the test may change); its root."""
    import shutil

    root = tmp_path / name
    shutil.copytree(os.path.join(FIXTURES, group, name), root)
    return root


def stored_choices():
    """[(name, setting)]: the chosen setting of every kind of stored auto-tune result (tests/fixtures/autotune)."""
    import json

    folder = os.path.join(FIXTURES, "autotune")
    with open(os.path.join(folder, "stored-choices.json"), encoding="utf-8") as handle:
        choices = list(json.load(handle).items())
    with open(os.path.join(folder, "autotune-demo.json"), encoding="utf-8") as handle:
        choices.append(("the demo's transformers winner, gguf_type null", json.load(handle)["chosen"]))
    return choices


def zram_generator():
    """Path of the zram-generator program (Debian's systemd-zram-generator installed, or unpacked into the cache by
    scripts/setup-controller.sh), or None."""
    cache = os.path.join(os.environ.get("LLMTUNE_CACHE", os.path.join(ROOT, ".cache")), "zram-generator")
    for base in ("/", cache):
        for folder in ("usr/lib", "lib"):
            path = os.path.join(base, folder, "systemd", "system-generators", "zram-generator")
            if os.access(path, os.X_OK):
                return path
    return None


def node_exporter_program():
    """Path of Debian's prometheus-node-exporter (installed, or unpacked into the cache by scripts/setup-controller.sh),
    or None."""
    cache = os.path.join(os.environ.get("LLMTUNE_CACHE", os.path.join(ROOT, ".cache")), "prometheus-node-exporter")
    for base in ("/", cache):
        path = os.path.join(base, "usr", "bin", "prometheus-node-exporter")
        if os.access(path, os.X_OK):
            return path
    return None


def haproxy_programs():
    """(haproxy, socat, environment to run them with): Debian's, installed or unpacked into the cache by
    scripts/setup-controller.sh with the libraries they need; None where neither is there."""
    cache = os.path.join(os.environ.get("LLMTUNE_CACHE", os.path.join(ROOT, ".cache")), "haproxy")
    for base in ("/", cache):
        haproxy, socat = os.path.join(base, "usr/sbin/haproxy"), os.path.join(base, "usr/bin/socat")
        if os.access(haproxy, os.X_OK) and os.access(socat, os.X_OK):
            env = dict(os.environ, PATH=os.path.dirname(socat) + os.pathsep + os.environ["PATH"])
            if base != "/":
                env["LD_LIBRARY_PATH"] = os.path.join(base, "usr/lib/x86_64-linux-gnu")
            return haproxy, socat, env
    return None


def read(*parts):
    """Text of the file at os.path.join(*PARTS)."""
    with open(os.path.join(*parts), encoding="utf-8") as handle:
        return handle.read()


def engine_proc_tree(proc):
    """A procfs at PROC (a pathlib.Path) of a 24 GiB Debian 12 host whose engine is three processes, as vLLM's: 4242
    (the unit's main process), its child 4243 (engine core) and grandchild 4244 (worker), each with the same captured
    status (VmRSS 8712 kB)."""
    for pid, children in ((4242, "4243"), (4243, "4244 "), (4244, "")):
        (proc / str(pid) / "task" / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "task" / str(pid) / "children").write_text(children)
        (proc / str(pid) / "status").write_text(read(FIXTURES, "jinja", "proc-status"))
    (proc / "meminfo").write_text(read(FIXTURES, "proc", "meminfo-debian12-24g"))


# --- proxy model + real inference service (tests/unit/test_proxy_model.py, test_inference_benchmark.py) ---
import contextlib  # noqa: E402
import glob  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
import urllib.error
import urllib.request  # noqa: E402

import psutil  # noqa: E402
import pytest  # noqa: E402

VENV_BIN = os.path.dirname(sys.executable)
BUILD_PROXY = os.path.join(ROOT, "scripts", "build_proxy_model.py")
PROXY_ENV = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")


def build_proxy(out, preset="qwen3-0.6b", layers=2):
    """Run the real CLI; returns its CompletedProcess (stdout names 'built' or 'unchanged')."""
    cmd = [sys.executable, BUILD_PROXY, "--preset", preset, "--out", str(out), "--layers", str(layers)]
    return subprocess.run(cmd, env=PROXY_ENV, capture_output=True, text=True, timeout=300, check=False)


@pytest.fixture(scope="session")
def proxy_model_dir(tmp_path_factory):
    """A 2-layer qwen3-0.6b proxy (real tokenizer, real shapes except depth), built once per session."""
    out = tmp_path_factory.mktemp("proxy") / "qwen3-0.6b-2l"
    done = build_proxy(out)
    assert done.returncode == 0, done.stderr
    return out


# Debian's nginx and its njs module, unpacked into the cache by scripts/setup-controller.sh (not installed: no service).
NGINX_ROOT = os.path.join(os.environ.get("LLMTUNE_CACHE", os.path.join(ROOT, ".cache")), "nginx")


@contextlib.contextmanager
def run_nginx(prefix, http, url, js=False, user=None):
    """Debian's nginx in the foreground with folder PREFIX: an http block of HTTP (temporary files under PREFIX), the
    njs module when JS, its workers run as USER when given. Waits until URL answers with any HTTP status, yields the
    process and stops it afterwards; skips the test when nginx is not unpacked."""
    binary = os.path.join(NGINX_ROOT, "usr", "sbin", "nginx")
    if not os.path.exists(binary):
        pytest.skip("needs Debian's nginx unpacked by scripts/setup-controller.sh")
    temp = " ".join(f"{name}_temp_path {prefix}/{name};" for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    module = os.path.join(NGINX_ROOT, "usr", "lib", "nginx", "modules", "ngx_http_js_module.so")
    (prefix / "nginx.conf").write_text((f"load_module {module};\n" if js else "") + (f"user {user};\n" if user else "")
                                       + f"pid {prefix}/nginx.pid;\nevents {{}}\nhttp {{ {temp} {http} }}\n")
    proc = subprocess.Popen([binary, "-p", str(prefix), "-c", str(prefix / "nginx.conf"), "-e", str(prefix / "error.log"),
                             "-g", "daemon off; worker_processes 1;"], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        wait_healthy(proc, url, prefix / "error.log", "nginx", timeout=30, path="", any_status=True)
        yield proc
    finally:
        end_process(proc)


def log_lines(path, needle, count, timeout=10):
    """The lines of the log at PATH that contain NEEDLE, once there are at least COUNT (or TIMEOUT seconds passed): a
    server writes a request's line just after its response's last byte, so a client may read the log first."""
    deadline = time.monotonic() + timeout
    while True:
        lines = [line for line in path.read_text().splitlines() if needle in line] if path.exists() else []
        if len(lines) >= count or time.monotonic() > deadline:
            return lines
        time.sleep(0.05)


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def engine_pid(url):
    """PID of the `transformers serve` of serve() listening at URL."""
    port = url.rsplit(":", 1)[1]
    return next(proc.pid for proc in psutil.process_iter(["cmdline"])
                if "serve" in (proc.info["cmdline"] or []) and port in (proc.info["cmdline"] or []))


@pytest.fixture(scope="session")
def tiny_proxy_dir(tmp_path_factory):
    """The test-only qwen3-test-tiny proxy: real tokenizer and architecture, milliseconds per token."""
    out = tmp_path_factory.mktemp("proxy") / "qwen3-test-tiny"
    done = build_proxy(out, preset="qwen3-test-tiny")
    assert done.returncode == 0, done.stderr
    return out


def llama_cpp_build():
    """(the programs' folder of the llama.cpp build in LLMTUNE_CACHE, its source folder with the GGUF converter), or
    None. The test command builds it before the unit tests (playbooks/wheelhouse.yml); the tests that need it skip
    without, and make their GGUF themselves: a GGUF of the cache is there or not by the time the VM's deploy got."""
    cache = os.environ.get("LLMTUNE_CACHE", "")
    # The compile's folder (the test command's, before any scenario) or the build as hosts unpack it.
    programs = sorted(glob.glob(os.path.join(cache, "llama.cpp-*.build", "bin", "llama-server"))
                      + glob.glob(os.path.join(cache, "llama.cpp-*", "llama-server")))
    sources = sorted(glob.glob(os.path.join(cache, "llama.cpp-*-source", "convert_hf_to_gguf.py")))
    return (os.path.dirname(programs[0]), os.path.dirname(sources[0])) if cache and programs and sources else None


needs_llama_cpp = pytest.mark.skipif(llama_cpp_build() is None,
                                     reason="no llama.cpp build in LLMTUNE_CACHE (playbooks/wheelhouse.yml)")


def convert_to_gguf(model_dir, out):
    """MODEL_DIR as a bf16 GGUF at OUT, by the converter of the cached build."""
    source = llama_cpp_build()[1]
    subprocess.run([sys.executable, os.path.join(source, "convert_hf_to_gguf.py"), str(model_dir), "--outtype", "bf16",
                    "--outfile", str(out)], check=True, capture_output=True,
                   env=dict(os.environ, PYTHONPATH=os.path.join(source, "gguf-py")))
    return str(out)


@pytest.fixture(scope="session")
def tiny_gguf(tiny_proxy_dir, tmp_path_factory):
    """The tiny proxy as a bf16 GGUF (skips without a llama.cpp build)."""
    if llama_cpp_build() is None:
        pytest.skip("no llama.cpp build in LLMTUNE_CACHE (playbooks/wheelhouse.yml)")
    return convert_to_gguf(tiny_proxy_dir, tmp_path_factory.mktemp("gguf") / "qwen3-test-tiny-bf16.gguf")


def wait_healthy(proc, url, log_path, name, timeout=120, path="/health", any_status=False):
    """Wait until PROC answers URL + PATH with 200 (with any HTTP status when ANY_STATUS: a server that wants a key);
    fail with its log (LOG_PATH) when it exits or takes longer than TIMEOUT seconds."""
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, f"{name} exited:\n" + log_path.read_text()
        try:
            with urllib.request.urlopen(url + path, timeout=2) as resp:
                if resp.status == 200:
                    return
        except urllib.error.HTTPError:
            if any_status:
                return
        except OSError:
            pass
        assert time.monotonic() < deadline, f"{name} not healthy in {timeout} s:\n" + log_path.read_text()
        time.sleep(0.5 if timeout > 30 else 0.1)


def end_process(proc, timeout=20):
    """SIGTERM to PROC, SIGKILL after TIMEOUT seconds; returns once it has ended. A loaded machine may slow an
    orderly shutdown past any deadline, never the end itself."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def serve(model_dir, log_dir, threads, cpus=None, env=None, stop_timeout=20):
    """The real `transformers serve` with MODEL_DIR preloaded on 127.0.0.1 and THREADS torch threads, bound to the
    set CPUS when given (sched_setaffinity(2)), with ENV added to its environment; yields its base URL and ends it
    afterwards (SIGTERM, then SIGKILL after STOP_TIMEOUT seconds)."""
    port = free_port()
    log_path = log_dir / "serve.log"
    cmd = [os.path.join(VENV_BIN, "transformers"), "serve", str(model_dir), "--device", "cpu",
           "--host", "127.0.0.1", "--port", str(port)]
    env = dict(PROXY_ENV, OMP_NUM_THREADS=str(threads), **(env or {}))
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url, log_path, "transformers serve")
        yield url
    finally:
        end_process(proc, stop_timeout)


@pytest.fixture(scope="session")
def inference_server(tiny_proxy_dir, tmp_path_factory):
    """The tiny proxy served; yields its base URL."""
    # One torch thread: on a 2-core machine shared with the test client, OpenMP spin-waiting threads
    # would make timings swing far more than the benchmark's own error.
    with serve(tiny_proxy_dir, tmp_path_factory.mktemp("serve"), threads=1) as url:
        yield url


def pytest_configure(config):
    config.addinivalue_line("markers", "crosscheck: compares the benchmark with another tool; needs a quiet machine")


TORCH_TEST_FILES = ("test_proxy_model.py", "test_inference_benchmark.py", "test_benchmark_crosscheck.py", "test_capacity.py")


def pytest_collect_file(file_path, parent):
    """Import torch._dynamo before any test module imports ansible.module_utils.basic.

    ansible-core replaces sys.intern with a patch object; torch._dynamo, imported lazily by generate() and
    meta-device model building, then fails with "substitute_in_graph expects a function". Only the torch
    tests pay the import time, and pytest calls this hook for every file of a directory before it imports any.
    """
    if file_path.name in TORCH_TEST_FILES and "torch._dynamo" not in sys.modules:
        try:
            import torch._dynamo  # noqa: F401
        except ImportError:
            pass


@pytest.fixture(autouse=True)
def fresh_module_warnings():
    """Ansible keeps a module's warnings and deprecations in globals that nothing empties: a module's process runs
    once. Tests run modules in one process, so each starts with none, whichever test ran before it."""
    from ansible.module_utils.common import warnings

    warnings._global_warnings.clear()  # pylint: disable=protected-access
    warnings._global_deprecations.clear()  # pylint: disable=protected-access
