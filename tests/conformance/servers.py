"""Real Triton (the oracle) and our server, started side by side on copies of one repository."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.support import ROOT, ServerProcess, free_port

ORACLE_SCRIPT = ROOT / "scripts" / "triton_oracle.sh"


def oracle_home() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(os.environ.get("ORACLE_HOME", Path(cache) / "serverless-triton" / "triton-oracle"))


def prepare_oracle() -> Path:
    """Run scripts/triton_oracle.sh (idempotent); returns ORACLE_HOME."""
    home = oracle_home()
    subprocess.run(["bash", str(ORACLE_SCRIPT)], check=True, env={**os.environ, "ORACLE_HOME": str(home)},
                   stdout=subprocess.DEVNULL)
    return home


@dataclass
class Endpoints:
    http: str
    grpc: str
    metrics: str


class TritonProcess:
    """tritonserver on loopback ports, started from a folder without triton_python_backend_utils.py."""

    def __init__(self, repository: Path, *extra: str, log: Path) -> None:
        self.home = prepare_oracle()
        self.repository = repository
        self.http_port, self.grpc_port, self.metrics_port = free_port(), free_port(), free_port()
        self.extra = list(extra)
        self.log_path = log
        self.process: subprocess.Popen | None = None
        self._cwd = Path(tempfile.mkdtemp(prefix="triton-cwd-"))

    @property
    def endpoints(self) -> Endpoints:
        return Endpoints(f"127.0.0.1:{self.http_port}", f"127.0.0.1:{self.grpc_port}",
                         f"127.0.0.1:{self.metrics_port}")

    def start(self, wait_for: str = "/v2/health/live", timeout: float = 120.0) -> TritonProcess:
        site = (self.home / "ready").read_text().strip()
        server = self.home / "tritonserver"
        env = {**os.environ, "LD_LIBRARY_PATH": f"{site}/nvidia_pytriton.libs", "PYTHONPATH": site,
               "PATH": f"{self.home / 'venv' / 'bin'}:{os.environ.get('PATH', '')}"}
        command = [str(server / "bin" / "tritonserver"), f"--model-repository={self.repository}",
                   f"--backend-directory={server / 'backends'}", f"--cache-directory={server / 'caches'}",
                   "--http-address=127.0.0.1", "--grpc-address=127.0.0.1", "--metrics-address=127.0.0.1",
                   f"--http-port={self.http_port}", f"--grpc-port={self.grpc_port}",
                   f"--metrics-port={self.metrics_port}", "--exit-on-error=false", *self.extra]
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(command, cwd=self._cwd, env=env, stdout=self._log, stderr=self._log)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"tritonserver exited with {self.process.returncode}:\n{self.log()[-3000:]}")
            try:
                if httpx.get(f"http://{self.endpoints.http}{wait_for}", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"tritonserver not up after {timeout}s:\n{self.log()[-3000:]}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process is not None:
            self._log.close()
        shutil.rmtree(self._cwd, ignore_errors=True)


@dataclass
class Pair:
    """The same repository served by both: ``triton`` and ``ours``."""

    triton: Endpoints
    ours: Endpoints
    triton_process: TritonProcess
    ours_process: ServerProcess

    def stop(self) -> None:
        self.triton_process.stop()
        self.ours_process.stop()


def start_pair(repository: Path, workdir: Path, triton_args: tuple[str, ...] = (),
               our_args: tuple[str, ...] = (), wait_for: str = "/v2/health/live") -> Pair:
    """Start both on separate copies of ``repository`` (so that a model folder change can be made to both)."""
    theirs, ours = workdir / "triton-models", workdir / "our-models"
    shutil.copytree(repository, theirs)
    shutil.copytree(repository, ours)
    triton = TritonProcess(theirs, *triton_args, log=workdir / "triton.log").start(wait_for)
    frontends = os.environ.get("CONFORMANCE_FRONTEND_PROCESSES")  # the suite against front-end processes
    if frontends:
        our_args = (*our_args, "--frontend-processes", frontends)
    # Triton 2.51 lets clients register shared memory; we follow 2.69, which does so only when allowed
    server = ServerProcess(ours, *our_args, "--allow-client-shm", "true", log=workdir / "ours.log", strict=True)
    server.start(wait_ready=False)
    server.wait_for(wait_for)
    server.wait_loaded()  # Triton answers only once it has loaded its models; we answer at once
    return Pair(triton.endpoints, Endpoints(server.http_url, server.grpc_url, f"127.0.0.1:{server.metrics_port}"),
                triton, server)
