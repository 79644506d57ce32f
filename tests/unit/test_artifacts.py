"""Artifacts from a mirror: the controller's content-addressed store (module_utils/llmtune_artifacts.py) served by
Debian's nginx (unpacked into the cache by scripts/setup-controller.sh), fetched by the inference_service role's own
tasks (tasks/artifact.yml, tasks/artifact_tar.yml) through Ansible: a host that has a file fetches nothing, a file
damaged on the host is fetched again, and a file the mirror serves damaged never takes its place."""

import hashlib
import json
import os
import signal
import subprocess
import tarfile
from multiprocessing import Pool

import pytest
from ansible.module_utils import llmtune_artifacts as artifacts
from conftest import ROOT, VENV_BIN, free_port, run_nginx



def model_folder(path):
    """A model-like folder: weights, a file in a subfolder, and a hub download's hidden metadata."""
    (path / "tokenizer").mkdir(parents=True)
    (path / ".cache" / "huggingface").mkdir(parents=True)
    (path / "model.safetensors").write_bytes(os.urandom(300_000))
    (path / "config.json").write_text('{"model_type": "qwen3"}\n')
    (path / "tokenizer" / "vocab.json").write_text('{"a": 1}\n')
    (path / ".cache" / "huggingface" / "model.safetensors.metadata").write_text("x\n")
    return path


def test_a_folder_is_stored_once_by_sum_with_its_manifest(tmp_path):
    model = model_folder(tmp_path / "qwen3-proxy")
    store = tmp_path / "store"
    first = artifacts.publish(str(model), str(store))
    assert [f["path"] for f in first["files"]] == ["config.json", "model.safetensors", "tokenizer/vocab.json"]
    assert first["folders"] == ["", "tokenizer"]
    for entry in first["files"]:
        data = (model / entry["path"]).read_bytes()
        assert entry["sha256"] == hashlib.sha256(data).hexdigest() and entry["size"] == len(data)
        blob = store / "sha256" / entry["sha256"]
        # A hard link: one copy of the weights on the controller's disk.
        assert blob.stat().st_ino == (model / entry["path"]).stat().st_ino
    assert sorted(first["placed"]) == sorted(f["sha256"] for f in first["files"]) and first["changed"]
    manifest = json.loads((store / "manifests" / "qwen3-proxy.json").read_text())
    assert manifest == {"name": "qwen3-proxy", "files": first["files"]}
    second = artifacts.publish(str(model), str(store))
    assert second["files"] == first["files"] and second["placed"] == [] and not second["changed"]
    # Each file's path on a host, for the artifact's path there; the manifest stays the artifact's own.
    third = artifacts.publish(str(model), str(store), dest="/opt/llmtune/models/qwen3-proxy")
    assert [f["dest"] for f in third["files"]] == ["/opt/llmtune/models/qwen3-proxy/config.json",
                                                   "/opt/llmtune/models/qwen3-proxy/model.safetensors",
                                                   "/opt/llmtune/models/qwen3-proxy/tokenizer/vocab.json"]
    assert not third["changed"] and json.loads((store / "manifests" / "qwen3-proxy.json").read_text()) == manifest


def test_a_second_publish_reads_no_file_and_a_changed_file_is_read_again(tmp_path, monkeypatch):
    model = model_folder(tmp_path / "m")
    store = tmp_path / "store"
    artifacts.publish(str(model), str(store))
    read = []
    real = artifacts.sha256_of
    monkeypatch.setattr(artifacts, "sha256_of", lambda path: read.append(path) or real(path))
    artifacts.publish(str(model), str(store))
    assert read == []
    (model / "config.json").write_text('{"model_type": "qwen3", "changed": true}\n')
    result = artifacts.publish(str(model), str(store))
    assert read == [str(model / "config.json")]
    new = next(f for f in result["files"] if f["path"] == "config.json")
    assert result["placed"] == [new["sha256"]]


def test_check_mode_computes_the_sums_and_writes_nothing(tmp_path):
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF" + os.urandom(1000))
    result = artifacts.publish(str(model), str(tmp_path / "store"), check=True, dest="/opt/llmtune/models/m.gguf")
    assert result["files"] == [{"path": "", "sha256": hashlib.sha256(model.read_bytes()).hexdigest(), "size": 1004,
                                "dest": "/opt/llmtune/models/m.gguf"}]
    assert result["folders"] == [] and result["changed"] and not (tmp_path / "store").exists()


@pytest.mark.parametrize("setup, message", [
    (lambda path: None, "no such file or folder"),
    (lambda path: path.mkdir(), "an empty folder"),
])
def test_a_missing_or_empty_artifact_is_named(tmp_path, setup, message):
    setup(tmp_path / "absent")
    with pytest.raises(artifacts.ArtifactError, match=message):
        artifacts.publish(str(tmp_path / "absent"), str(tmp_path / "store"))


def publish_in_a_process(args):
    return artifacts.publish(*args)["files"]


def test_forks_publishing_one_artifact_at_once_agree(tmp_path):
    model = model_folder(tmp_path / "m")
    with Pool(4) as pool:
        results = pool.map(publish_in_a_process, [(str(model), str(tmp_path / "store"))] * 4)
    assert all(files == results[0] for files in results)
    assert sorted(os.listdir(tmp_path / "store" / "sha256")) == sorted(f["sha256"] for f in results[0])


@pytest.fixture(name="mirror")
def fixture_mirror(tmp_path):
    """Debian's nginx serving the store folder, logging each request: (URL, store, access log)."""
    store, prefix = tmp_path / "store", tmp_path / "nginx"
    store.mkdir()
    prefix.mkdir()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # The pytest folder is private to its user: the workers run as that user too.
    with run_nginx(prefix, f"access_log {prefix}/access.log; server {{ listen 127.0.0.1:{port}; root {store}; }}",
                   url + "/", user="root"):
        yield url, store, prefix / "access.log"


def fetch(tmp_path, url, store, tasks, artifact, dest, expect_rc=0, more=None, check=False):
    """Run the role's entry points TASKS (artifact, artifact_tar; artifact_server first) on this machine as the host,
    with the role's defaults and the variables in MORE, in check mode with CHECK: (the host's stats, its tasks)."""
    playbook = tmp_path / "fetch.yml"
    playbook.write_text(json.dumps([{
        "hosts": "localhost", "gather_facts": False,
        "vars": {"inference_service_artifact_url": url, "inference_service_artifact_store": str(store),
                 "inference_service_artifact_timeout": 10, "inference_service_artifact_retries": 1,
                 "inference_service_home": str(dest), "inference_service_controller_cache": str(artifact),
                 **(more or {})},
        "tasks": [{"ansible.builtin.include_role": {"name": "inference_service", "tasks_from": entry},
                   "vars": {"__artifact_src": str(artifact), "__artifact_dest": str(dest),
                            "__artifact_name": "build", "__artifact_done": "build-info.txt"}}
                  for entry in tasks.split()],
    }]))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
               ANSIBLE_CALLBACKS_ENABLED="ansible.posix.json")
    run = subprocess.run([os.path.join(VENV_BIN, "ansible-playbook"), "-i", "localhost,", "-c", "local", str(playbook),
                          "-e", json.dumps({"ansible_python_interpreter": os.path.join(VENV_BIN, "python")})]
                         + (["--check"] if check else []),
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == expect_rc, run.stdout[-4000:] + run.stderr[-2000:]
    report = json.loads(run.stdout)
    return report["stats"]["localhost"], [task for play in report["plays"] for task in play["tasks"]]


def gets(log, method="GET"):
    return sum(1 for line in log.read_text().splitlines() if f'"{method} /sha256/' in line) if log.exists() else 0


def test_hosts_fetch_from_the_mirror_once_and_fetch_a_damaged_file_again(tmp_path, mirror):
    url, store, log = mirror
    model = model_folder(tmp_path / "controller" / "qwen3-proxy")
    host = tmp_path / "host" / "qwen3-proxy"
    host.parent.mkdir()
    stats, dummy = fetch(tmp_path, url, store, "artifact", model, host)
    assert stats["changed"] > 0 and gets(log) == 3
    for name in ("model.safetensors", "config.json", "tokenizer/vocab.json"):
        assert (host / name).read_bytes() == (model / name).read_bytes()
    assert not (host / ".cache").exists()
    # A host that has every file: no request at all.
    stats, dummy = fetch(tmp_path, url, store, "artifact", model, host)
    assert stats["changed"] == 0 and gets(log) == 3
    # A file cut short on the host (a disk filled, a copy interrupted): fetched again, and only it.
    weights = (host / "model.safetensors").read_bytes()
    (host / "model.safetensors").write_bytes(weights[:1000])
    stats, dummy = fetch(tmp_path, url, store, "artifact", model, host)
    assert stats["changed"] > 0 and gets(log) == 4 and (host / "model.safetensors").read_bytes() == weights


def test_check_mode_on_a_fresh_host_asks_the_mirror_and_writes_nothing(tmp_path, mirror):
    url, store, log = mirror
    model = model_folder(tmp_path / "controller" / "qwen3-proxy")
    # The mirror has the files (an earlier host's run stored them); this host has not even the folders.
    artifacts.publish(str(model), str(store))
    host = tmp_path / "host" / "models" / "qwen3-proxy"
    stats, dummy = fetch(tmp_path, url, store, "artifact", model, host, check=True)
    assert stats["changed"] > 0 and gets(log, "HEAD") == 3 and gets(log) == 0
    assert not (tmp_path / "host").exists()


def test_a_file_the_mirror_serves_damaged_never_takes_its_place(tmp_path, mirror):
    url, store, log = mirror
    model = tmp_path / "controller" / "model.gguf"
    model.parent.mkdir()
    model.write_bytes(b"GGUF" + os.urandom(200_000))
    digest = hashlib.sha256(model.read_bytes()).hexdigest()
    host = tmp_path / "host"
    host.mkdir()
    # The mirror's copy truncated (an interrupted sync of the controller's store to it).
    (store / "sha256").mkdir()
    (store / "sha256" / digest).write_bytes(model.read_bytes()[:50_000])
    dummy, tasks = fetch(tmp_path, url, tmp_path / "controller-store", "artifact", model, host / "model.gguf",
                         expect_rc=2)
    failed = next(task for task in tasks if "Fetch from the mirror" in task["task"]["name"])["hosts"]["localhost"]
    assert failed["failed"] and "did not match" in failed["results"][0]["msg"]
    # Tried 1 + inference_service_artifact_retries times, and nothing left: no file, no partial download.
    assert gets(log) == 2 and os.listdir(host) == []


def test_a_tar_is_fetched_unpacked_and_removed_and_not_fetched_once_unpacked(tmp_path, mirror):
    url, store, log = mirror
    cache = tmp_path / "controller"
    cache.mkdir()
    (cache / "llama-server").write_bytes(os.urandom(5000))
    (cache / "build-info.txt").write_text("CPU variants: haswell\n")
    with tarfile.open(cache / "build.tar", "w") as tar:
        for name in ("llama-server", "build-info.txt"):
            tar.add(cache / name, arcname=name)
    home = tmp_path / "host"
    (home / "build").mkdir(parents=True)
    fetch(tmp_path, url, store, "artifact_tar", cache, home)
    assert (home / "build" / "llama-server").read_bytes() == (cache / "llama-server").read_bytes()
    assert sorted(os.listdir(home)) == ["build"] and gets(log) == 1
    stats, dummy = fetch(tmp_path, url, store, "artifact_tar", cache, home)
    assert stats["changed"] == 0 and gets(log) == 1


def test_without_a_mirror_the_controller_serves_its_store_for_the_run(tmp_path):
    model = tmp_path / "controller" / "model.gguf"
    model.parent.mkdir()
    model.write_bytes(b"GGUF" + os.urandom(100_000))
    store, host = tmp_path / "store", tmp_path / "host"
    host.mkdir()
    more = {"inference_service_artifact_server": True, "inference_service_artifact_server_address": "127.0.0.1",
            "inference_service_artifact_server_port": free_port(), "inference_service_artifact_server_lifetime_s": 120}
    pidfile = tmp_path / "store.server.pid"
    try:
        dummy, tasks = fetch(tmp_path, "", store, "artifact_server artifact", model, host / "model.gguf", more=more)
        assert (host / "model.gguf").read_bytes() == model.read_bytes()
        started = next(task for task in tasks if task["task"]["name"].endswith("Serve the artifact store from the controller"))
        assert started["hosts"]["localhost"]["changed"]
        server = int(pidfile.read_text())
        # The next batch finds it running, and its host has the file.
        stats, tasks = fetch(tmp_path, "", store, "artifact_server artifact", model, host / "model.gguf", more=more)
        assert stats["changed"] == 0 and int(pidfile.read_text()) == server
        os.kill(server, 0)
    finally:
        # timeout(1) passes the signal on to the server.
        if pidfile.exists():
            os.kill(int(pidfile.read_text()), signal.SIGTERM)
