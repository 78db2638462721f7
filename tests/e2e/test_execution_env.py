"""A Python model's own environment (``EXECUTION_ENV_PATH``, python_backend's parameter): two models whose
dependencies conflict serve side by side, one from a directory and one from a packed ``.tar.gz`` unpacked once into
the private cache (reused by a warm start); a hostile archive, a missing interpreter and a Python that cannot run
the worker fail the load with the reason; ``auto_complete_config`` runs in the model's environment too.

The environments are venvs of this machine's base Python made by the test (``--without-pip``), numpy reached
through a ``.pth`` file naming a folder that holds only numpy, and a package of their own, ``conflicting``, at a
different version in each: the server's own environment has no such package at all."""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.support import ServerProcess, write_model

MODEL = """
import sys
import numpy as np
import conflicting
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        text = f"{conflicting.VERSION} {sys.prefix}".encode()
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([text], dtype=np.object_))])
                for _ in requests]
"""
AUTO_COMPLETED = MODEL + """
    @staticmethod
    def auto_complete_config(config):
        import conflicting  # only the model's environment has it
        config.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [1]})
        config.add_output({"name": "OUT", "data_type": "TYPE_STRING", "dims": [1]})
        return config
"""


def _config(env: str) -> str:
    return f"""
backend: "python"
max_batch_size: 0
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_STRING dims: [ 1 ] }} ]
parameters {{ key: "EXECUTION_ENV_PATH" value: {{ string_value: "{env}" }} }}
"""


def make_environment(folder: Path, version: str, numpy_too: bool = True) -> Path:
    """A venv of the base Python with package ``conflicting`` at ``version`` (and numpy, unless not asked)."""
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", str(folder)],
                   check=True)
    site = next((folder / "lib").glob("python3*/site-packages"))
    (site / "conflicting").mkdir()
    (site / "conflicting" / "__init__.py").write_text(f"VERSION = {version!r}\n")
    if numpy_too:
        only_numpy = folder.parent / f"{folder.name}-numpy"
        only_numpy.mkdir()
        numpy_dir = Path(np.__file__).parent
        for source in [numpy_dir, *numpy_dir.parent.glob("numpy.libs")]:
            (only_numpy / source.name).symlink_to(source)
        (site / "numpy_only.pth").write_text(f"{only_numpy}\n")
    return folder


def pack(folder: Path, archive: Path) -> Path:
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(folder, arcname=".")
    return archive


def _answer(server: ServerProcess, model: str) -> str:
    client = httpclient.InferenceServerClient(server.http_url)
    inputs = [httpclient.InferInput("IN", [1], "FP32")]
    inputs[0].set_data_from_numpy(np.ones(1, dtype=np.float32))
    return client.infer(model, inputs).as_numpy("OUT")[0].decode()


@pytest.fixture(scope="module")
def environments(tmp_path_factory):
    root = tmp_path_factory.mktemp("environments")
    one = make_environment(root / "one", "1.0")
    two = pack(make_environment(root / "two", "2.0"), root / "two.tar.gz")
    return one, two


def test_two_models_with_conflicting_dependencies_serve_side_by_side(tmp_path, environments):
    one, two = environments
    repository = tmp_path / "models"
    write_model(repository, "from_folder", _config(str(one)), {"1/model.py": MODEL})
    write_model(repository, "from_archive", _config("$$TRITON_MODEL_DIRECTORY/env.tar.gz"),
                {"1/model.py": MODEL, "env.tar.gz": two.read_bytes()})
    write_model(repository, "completed", 'backend: "python"\nparameters { key: "EXECUTION_ENV_PATH" value: { '
                'string_value: "$$TRITON_MODEL_DIRECTORY/env.tar.gz" } }\n',
                {"1/model.py": AUTO_COMPLETED, "env.tar.gz": two.read_bytes()})
    cache = tmp_path / "cache"
    with ServerProcess(repository, "--cache-dir", str(cache), strict=True) as server:
        version, prefix = _answer(server, "from_folder").split()
        assert (version, prefix) == ("1.0", str(one))
        version, prefix = _answer(server, "from_archive").split()
        unpacked = list((cache / "python-environments").glob("env-*"))
        assert version == "2.0" and [Path(prefix)] == unpacked  # one folder for both models of the same archive
        assert _answer(server, "completed").split()[0] == "2.0"
        assert "Using Python execution env" in server.log()
    first = unpacked[0].stat().st_mtime_ns
    with ServerProcess(repository, "--cache-dir", str(cache), strict=True) as server:  # a warm start
        assert _answer(server, "from_archive").split()[0] == "2.0"
        assert "unpacked the Python execution env" not in server.log()
    assert list((cache / "python-environments").glob("env-*")) == unpacked
    assert unpacked[0].stat().st_mtime_ns == first


def _hostile(tmp_path: Path, entries: list[tarfile.TarInfo]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for entry in entries:
            tar.addfile(entry, io.BytesIO(b"x" * entry.size) if entry.isfile() else None)
    return buffer.getvalue()


def _entry(name: str, kind: bytes = tarfile.REGTYPE, link: str = "", size: int = 1) -> tarfile.TarInfo:
    entry = tarfile.TarInfo(name)
    entry.type, entry.linkname, entry.size = kind, link, size if kind == tarfile.REGTYPE else 0
    return entry


def test_bad_environments_fail_the_load_with_the_reason(tmp_path, environments):
    outside = tmp_path / "outside"
    outside.mkdir()
    no_numpy = make_environment(tmp_path / "no-numpy", "3.0", numpy_too=False)
    hostile = {
        "absolute": ([_entry(str(outside / "planted"))], "has an absolute path"),
        "dotdot": ([_entry("bin/../../planted")], "has '..' in its path"),
        "through_a_link": ([_entry("out", tarfile.SYMTYPE, str(outside)), _entry("out/planted")],
                           "is written through a link"),
        "hard_link_out": ([_entry("hard", tarfile.LNKTYPE, "../../etc/passwd")], "points out of the environment"),
        "device": ([_entry("dev", tarfile.CHRTYPE)], "is a device or a pipe"),
    }
    repository = tmp_path / "models"
    for name, (entries, _) in hostile.items():
        write_model(repository, name, _config("$$TRITON_MODEL_DIRECTORY/env.tar.gz"),
                    {"1/model.py": MODEL, "env.tar.gz": _hostile(tmp_path, entries)})
    write_model(repository, "missing", _config(str(tmp_path / "nowhere")), {"1/model.py": MODEL})
    empty = tmp_path / "empty-env"
    (empty / "bin").mkdir(parents=True)
    write_model(repository, "no_activate", _config(str(empty)), {"1/model.py": MODEL})
    write_model(repository, "no_numpy", _config(str(no_numpy)), {"1/model.py": MODEL})
    write_model(repository, "in_a_thread", _config(str(environments[0])) + 'parameters { key: "isolation" '
                'value: { string_value: "thread" } }', {"1/model.py": MODEL})
    with ServerProcess(repository, "--cache-dir", str(tmp_path / "cache")) as server:
        client = httpclient.InferenceServerClient(server.http_url)
        reasons = {row["name"]: row.get("reason", "") for row in client.get_model_repository_index()}
    for name, (_, why) in hostile.items():
        assert why in reasons[name], (name, reasons[name])
    assert reasons["missing"] == f"Failed to get the canonical path for {tmp_path / 'nowhere'}."
    assert "does not exist. The Python environment should contain an 'activate' script." in reasons["no_activate"]
    assert "cannot run the worker (it needs Python 3.10 or newer with numpy)" in reasons["no_numpy"]
    assert "No module named 'numpy'" in reasons["no_numpy"]
    assert "needs isolation 'process'" in reasons["in_a_thread"]
    assert list(outside.iterdir()) == []  # nothing planted outside
    assert not list((tmp_path / "cache" / "python-environments").glob("*.partial"))  # no half-unpacked folder


def test_an_environment_synced_from_object_storage(s3, moto_endpoint, bucket, tmp_path, environments):
    """The archive beside config.pbtxt in s3:// is synced as any model file, then unpacked from the cache."""
    from tests.conftest import S3_ENV
    from tests.e2e.test_cli import storage_config, upload

    local = tmp_path / "local"
    write_model(local, "from_storage", _config("$$TRITON_MODEL_DIRECTORY/env.tar.gz"),
                {"1/model.py": MODEL, "env.tar.gz": environments[1].read_bytes()})
    upload(s3, bucket, local)
    config = storage_config(tmp_path, moto_endpoint, tmp_path / "cache")
    process = ServerProcess(Path("unused"), "--config", str(config), env=S3_ENV, log=tmp_path / "server.log",
                            strict=True)
    with process.with_repository_url(f"s3://{bucket}/repo"):
        version, prefix = _answer(process, "from_storage").split()
    assert version == "2.0" and Path(prefix).parent == tmp_path / "cache" / "python-environments"
