"""Three replicas behind a real HTTP/2-capable load balancer (nginx, `grpc_pass` for gRPC), one bucket on a real
S3 endpoint (moto server): what a serverless platform's scale-out relies on from each replica.

- every replica cold-starts from the bucket (its own empty cache), and its start-to-first-answer time is printed;
- a new model version uploaded to the bucket is picked up by every replica (poll mode) while traffic flows
  through the balancer over HTTP and gRPC, with zero failed requests;
- a replica killed (SIGKILL) under load costs at most the requests it held: the balancer sends the rest on.

nginx comes from Debian's packages (.ci/run installs it). Without it the test skips, except under CI
(REQUIRE_NGINX=1), where it fails.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from examples.build_models import build_add_sub_onnx
from tests.conftest import ONNX_ADD_SUB_CONFIG, S3_ENV, VERSION_PYTHON
from tests.e2e.test_cli import upload
from tests.support import IDENTITY_PYTHON_CONFIG, ServerProcess, free_port, write_model

REPLICAS = 3
NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)

pytestmark = pytest.mark.timeout(240)


def nginx_config(prefix: Path, http_port: int, grpc_port: int, replicas: list[ServerProcess]) -> Path:
    http = "\n".join(f"    server {r.http_url} max_fails=1 fail_timeout=30s;" for r in replicas)
    grpc = "\n".join(f"    server {r.grpc_url} max_fails=1 fail_timeout=30s;" for r in replicas)
    config = prefix / "nginx.conf"
    config.write_text(f"""
daemon off;
worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  client_body_temp_path {prefix}/body;
  proxy_temp_path {prefix}/proxy;
  fastcgi_temp_path {prefix}/fastcgi;
  uwsgi_temp_path {prefix}/uwsgi;
  scgi_temp_path {prefix}/scgi;
  upstream replicas_http {{
{http}
    keepalive 32;
  }}
  upstream replicas_grpc {{
{grpc}
    keepalive 32;
  }}
  server {{
    listen 127.0.0.1:{http_port};
    location / {{
      proxy_pass http://replicas_http;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      # a replica that refuses the connection (killed) never accepted the request: send it to the next one
      proxy_next_upstream error timeout non_idempotent;
    }}
  }}
  server {{
    listen 127.0.0.1:{grpc_port} http2;
    location / {{
      grpc_pass grpc://replicas_grpc;
      grpc_next_upstream error timeout non_idempotent;
    }}
  }}
}}
""")
    return config


class Traffic:
    """Requests through the balancer from threads (HTTP and gRPC), until stopped; records versions and failures."""

    def __init__(self, http_url: str, grpc_url: str, threads_per_protocol: int = 3) -> None:
        self.http_url, self.grpc_url = http_url, grpc_url
        self.versions: list[int] = []
        self.failures: list[str] = []
        self.answered = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._loop, args=(protocol,), daemon=True)
                         for protocol in ("http", "grpc") for _ in range(threads_per_protocol)]

    def _loop(self, protocol: str) -> None:
        module = httpclient if protocol == "http" else grpcclient
        client = module.InferenceServerClient(self.http_url if protocol == "http" else self.grpc_url)
        value = module.InferInput("IN", [1], "FP32")
        value.set_data_from_numpy(np.zeros(1, dtype=np.float32))
        add = [module.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
        for tensor in add:
            tensor.set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
        while not self._stop.is_set():
            try:
                version = int(client.infer("versioned", [value]).as_numpy("OUT")[0])
                total = client.infer("adder", add).as_numpy("OUTPUT0")
                assert total.tolist() == [[2] * 16]
                with self._lock:
                    self.versions.append(version)
                    self.answered += 2
            except Exception as exc:  # noqa: BLE001 - every failure is recorded and asserted on
                with self._lock:
                    self.failures.append(f"{protocol}: {exc}")

    def __enter__(self) -> Traffic:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)


def wait_until(condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def answers(url: str) -> bool:
    try:
        return httpclient.InferenceServerClient(url).is_server_ready()
    except Exception:  # noqa: BLE001 - not listening yet
        return False


def served_versions(replica: ServerProcess) -> set[str]:
    index = httpclient.InferenceServerClient(replica.http_url).get_model_repository_index()
    return {row["version"] for row in index if row["name"] == "versioned" and row.get("state") == "READY"}


def test_three_replicas_behind_nginx_sync_one_bucket_roll_a_version_and_survive_a_kill(
        s3, moto_endpoint, bucket, tmp_path):
    if NGINX is None:
        if os.environ.get("REQUIRE_NGINX"):
            pytest.fail("nginx is required here (REQUIRE_NGINX is set): apt-get install nginx-light")
        pytest.skip("nginx is not installed (apt-get install nginx-light)")
    local = tmp_path / "local"
    build_add_sub_onnx(local / "adder" / "1" / "model.onnx", datatype="INT32")
    write_model(local, "adder", ONNX_ADD_SUB_CONFIG)
    write_model(local, "versioned", IDENTITY_PYTHON_CONFIG, {"1/model.py": VERSION_PYTHON})
    upload(s3, bucket, local)

    replicas = []
    for index in range(REPLICAS):
        config = tmp_path / f"replica-{index}.yaml"
        config.write_text(f"cache_dir: {tmp_path / f'cache-{index}'}\nstorage: {{endpoint_url: '{moto_endpoint}', "
                          "region: us-east-1, addressing_style: path}\n"
                          "model_control: {mode: poll, poll_interval_seconds: 1}\n")
        replicas.append(ServerProcess(Path("unused"), "--config", str(config), env=S3_ENV,
                                      log=tmp_path / f"replica-{index}.log").with_repository_url(f"s3://{bucket}/repo"))
    started = time.monotonic()
    for replica in replicas:
        replica.start(wait_ready=False)
    first_answers = {}
    balancer = None
    try:
        for index, replica in enumerate(replicas):
            replica.wait_for("/v2/health/ready", 120)
            client = httpclient.InferenceServerClient(replica.http_url)
            value = httpclient.InferInput("IN", [1], "FP32")
            value.set_data_from_numpy(np.zeros(1, dtype=np.float32))
            assert client.infer("versioned", [value]).as_numpy("OUT")[0] == 1
            first_answers[index] = time.monotonic() - started
            assert "model 'adder': listed 2 objects, 2 selected; downloaded 2 files" in replica.log()
        print("\ncold start to first answer per replica (3 started at once on this machine): "
              + ", ".join(f"replica {i}: {s:.2f} s" for i, s in first_answers.items()))

        prefix = tmp_path / "nginx"
        prefix.mkdir()
        http_port, grpc_port = free_port(), free_port()
        config = nginx_config(prefix, http_port, grpc_port, replicas)
        balancer = subprocess.Popen([NGINX, "-p", str(prefix), "-c", str(config)], stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
        wait_until(lambda: answers(f"127.0.0.1:{http_port}"), 30)

        # a new version, uploaded once, reaches every replica; nothing fails on the way
        with Traffic(f"127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}") as traffic:
            wait_until(lambda: len(traffic.versions) > 30)
            s3.put_object(Bucket=bucket, Key="repo/versioned/2/model.py", Body=VERSION_PYTHON.encode())
            wait_until(lambda: all(served_versions(r) == {"2"} for r in replicas), 60)
            answered = traffic.answered
            wait_until(lambda: traffic.answered > answered + 30)
        assert traffic.failures == []
        switch = traffic.versions.index(2)
        assert set(traffic.versions[switch:][-20:]) == {2}
        assert all("model 'versioned'" in r.log() and "downloaded 1 files" in r.log() for r in replicas)

        # a replica killed under load: at most the requests it held fail
        with Traffic(f"127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}") as traffic:
            wait_until(lambda: traffic.answered > 60)
            replicas[2].process.send_signal(signal.SIGKILL)
            replicas[2].process.wait()
            answered = traffic.answered
            wait_until(lambda: traffic.answered > answered + 100)
        held_at_most = 6  # one request per client thread can be in flight on the killed replica
        assert len(traffic.failures) <= held_at_most, traffic.failures
        total = traffic.answered + len(traffic.failures)
        print(f"replica killed under load: {len(traffic.failures)} failed of {total}")
    finally:
        if balancer is not None:
            balancer.terminate()
            balancer.wait(10)
        for replica in replicas:
            if replica.process is not None and replica.process.poll() is None:
                assert replica.stop() == 0, replica.log()
            else:
                replica.stop()
