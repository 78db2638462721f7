"""Shared fixtures: one repository with good and broken models, served by a real server."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from examples.build_models import EXAMPLE_REPOSITORY, build_add_sub_onnx, build_example_models
from tests.support import IDENTITY_PYTHON_CONFIG, ServerProcess, add_sub_config, python_model_source, write_model

ONNX_ADD_SUB_CONFIG = add_sub_config('platform: "onnxruntime_onnx"', "INT32")

VERSION_PYTHON = python_model_source(
    """
    version = int(self.args["model_version"])
    return [
        pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.full([1], version, dtype=np.float32))])
        for _ in requests
    ]
    """
)


def write_external_data_onnx(path: Path, location: str) -> None:
    """An add-sub-like ONNX model whose initializer claims to live in an external file at ``location``."""
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.zeros(16, dtype=np.int32), "W")
    weight.ClearField("raw_data")
    weight.ClearField("int32_data")
    weight.data_location = TensorProto.EXTERNAL
    weight.external_data.add(key="location", value=location)
    shape = ["batch", 16]
    graph = helper.make_graph(
        [helper.make_node("Add", ["INPUT0", "W"], ["OUTPUT0"]), helper.make_node("Sub", ["INPUT1", "W"], ["OUTPUT1"])],
        "external", [helper.make_tensor_value_info(n, TensorProto.INT32, shape) for n in ("INPUT0", "INPUT1")],
        [helper.make_tensor_value_info(n, TensorProto.INT32, shape) for n in ("OUTPUT0", "OUTPUT1")],
        initializer=[weight],
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(helper.make_model(graph).SerializeToString())


def add_test_models(repository: Path) -> None:
    """Models beside the examples: broken ones, versioned ones, misbehaving Python ones."""
    build_add_sub_onnx(repository / "simple_int32" / "1" / "model.onnx", datatype="INT32")
    write_model(repository, "simple_int32", ONNX_ADD_SUB_CONFIG)

    write_model(repository, "broken_syntax", 'platform: "onnxruntime_onnx"\nmax_batch_size: {\n')
    write_model(repository, "unknown_platform", 'platform: "caffe2_netdef"\n', {"1/model.netdef": "x"})
    write_model(repository, "tensorrt_on_cpu", add_sub_config('platform: "tensorrt_plan"', "INT32"),
                {"1/model.plan": "x"})
    missing = write_model(repository, "missing_file", ONNX_ADD_SUB_CONFIG)
    (missing / "1").mkdir()
    write_model(repository, "name_mismatch", 'name: "another_name"\n' + IDENTITY_PYTHON_CONFIG,
                {"1/model.py": python_model_source("return []")})
    good = (repository / "simple_int32" / "1" / "model.onnx").read_bytes()
    write_model(repository, "truncated_onnx", ONNX_ADD_SUB_CONFIG, {"1/model.onnx": good[: len(good) // 2]})
    write_external_data_onnx(repository / "external_data_onnx" / "1" / "model.onnx", "../../../outside.bin")
    write_model(repository, "external_data_onnx", ONNX_ADD_SUB_CONFIG)
    write_model(repository, "import_error_python", IDENTITY_PYTHON_CONFIG,
                {"1/model.py": "import module_that_does_not_exist\n"})

    write_model(repository, "identity_python", IDENTITY_PYTHON_CONFIG, {"1/model.py": python_model_source(
        "return [pb_utils.InferenceResponse([pb_utils.Tensor('OUT', "
        "pb_utils.get_input_tensor_by_name(r, 'IN').as_numpy())]) for r in requests]"
    )})
    write_model(repository, "wrong_count_python", IDENTITY_PYTHON_CONFIG,
                {"1/model.py": python_model_source("return []")})
    write_model(repository, "raising_python", IDENTITY_PYTHON_CONFIG,
                {"1/model.py": python_model_source("raise ValueError('boom from user code')")})
    write_model(
        repository,
        "error_response_python",
        IDENTITY_PYTHON_CONFIG,
        {"1/model.py": python_model_source(
            "return [pb_utils.InferenceResponse(error=pb_utils.TritonError('IN must be positive', "
            "pb_utils.TritonError.INVALID_ARG)) for _ in requests]"
        )},
    )
    write_model(
        repository,
        "args_python",
        IDENTITY_PYTHON_CONFIG.replace('"OUT" data_type: TYPE_FP32', '"OUT" data_type: TYPE_STRING'),
        {"1/model.py": python_model_source(
            "return [pb_utils.InferenceResponse([pb_utils.Tensor('OUT', "
            "np.array([json.dumps(self.args).encode()], dtype=object))]) for _ in requests]"
        )},
    )
    write_model(
        repository,
        "versioned_python",
        IDENTITY_PYTHON_CONFIG + "version_policy: { specific { versions: [ 1, 3 ] } }\n",
        {f"{v}/model.py": VERSION_PYTHON for v in (1, 2, 3)},
    )
    write_model(
        repository,
        "latest_two_python",
        IDENTITY_PYTHON_CONFIG + "version_policy: { latest { num_versions: 2 } }\n",
        {f"{v}/model.py": VERSION_PYTHON for v in (1, 2, 3, 10)},
    )
    write_model(repository, "default_policy_python", IDENTITY_PYTHON_CONFIG,
                {f"{v}/model.py": VERSION_PYTHON for v in (2, 7)} | {"notaversion/model.py": "raise SystemExit"})


@pytest.fixture(scope="session")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the example repository with its models built, plus the test models."""
    root = tmp_path_factory.mktemp("repo") / "models"
    shutil.copytree(EXAMPLE_REPOSITORY, root, ignore=shutil.ignore_patterns("model.onnx", "model.pt"))
    build_example_models(root)
    add_test_models(root)
    return root


@pytest.fixture(scope="session")
def server(repository: Path):
    """One real server (HTTP on a loopback port) for the whole session."""
    process = ServerProcess(repository, "--device", "cpu", "--allow-client-shm", "true").start()
    yield process
    code = process.stop()
    assert code == 0, process.log()


@pytest.fixture(scope="session")
def grpc_client(server: ServerProcess):
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(server.grpc_url)
    yield client
    client.close()


@pytest.fixture(scope="session")
def http_client(server: ServerProcess):
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(server.http_url)
    yield client
    client.close()


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> Path:
    """The project's wheel, built from the checkout (what images install)."""
    import subprocess
    import sys

    from tests.support import ROOT

    dist = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(ROOT)], check=True,
                   cwd=dist)
    (built,) = dist.glob("serverless_triton-*.whl")
    return built


S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture(scope="session")
def moto_endpoint():
    """A real S3 HTTP endpoint on loopback: moto in server mode."""
    import os

    from moto.server import ThreadedMotoServer

    from tests.support import free_port

    os.environ.update(S3_ENV)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture(scope="session")
def s3(moto_endpoint):
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1",
                        config=Config(s3={"addressing_style": "path"}))


@pytest.fixture
def bucket(s3, request) -> str:
    """A fresh bucket per test."""
    import re
    import uuid

    name = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-") + "-" + uuid.uuid4().hex[:8]
    s3.create_bucket(Bucket=name)
    return name
