"""The Python workers' template (handlers/python/template.py): where a repository's model imports torch (a local
one, or one in object storage), the template has imported it before the worker forks, so the worker starts with
it; where none does, it has not."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import tritonclient.http as httpclient

from handlers.python.template import frameworks_imported
from tests.conftest import S3_ENV
from tests.support import ServerProcess, python_model_source, write_model

CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "PRELOADED" data_type: TYPE_BOOL dims: [ 1 ] } ]
"""
# torch in sys.modules as model.py starts: imported by the template, not by this file (which imports it after)
SEEN = ("import sys\nPRELOADED = 'torch' in sys.modules\n")
ANSWER = python_model_source("""
    return [pb_utils.InferenceResponse([pb_utils.Tensor("PRELOADED", np.array([PRELOADED]))]) for _ in requests]
""")


def _preloaded(server: ServerProcess, model: str) -> bool:
    client = httpclient.InferenceServerClient(server.http_url)
    tensor = httpclient.InferInput("IN", [1], "FP32")
    tensor.set_data_from_numpy(np.zeros(1, np.float32))
    try:
        return bool(client.infer(model, [tensor]).as_numpy("PRELOADED")[0])
    finally:
        client.close()


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
@pytest.mark.parametrize("imports_torch", [True, False], ids=["a model imports torch", "none does"])
def test_the_template_imports_torch_where_a_model_does(tmp_path, imports_torch):
    source = SEEN + ("import torch  # noqa\n" if imports_torch else "") + ANSWER
    write_model(tmp_path / "models", "model", CONFIG, {"1/model.py": source})
    with ServerProcess(tmp_path / "models", strict=True) as server:
        assert _preloaded(server, "model") is imports_torch


def test_only_an_import_statement_of_an_installed_framework_counts():
    installed = importlib.util.find_spec("torch") is not None
    assert frameworks_imported(["import numpy as np\nimport torch\n"]) == (["torch"] if installed else [])
    assert frameworks_imported(["    from torch import nn\n"]) == (["torch"] if installed else [])
    assert frameworks_imported(["# we could import torch here\nx = 'import torch'\n", "import torchvision\n"]) == []


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_the_template_imports_torch_for_a_model_in_object_storage(s3, moto_endpoint, bucket, tmp_path):
    """From S3, what model.py imports is read ahead of the download (the early sync's look at the listing)."""
    s3.put_object(Bucket=bucket, Key="repo/model/config.pbtxt", Body=CONFIG.encode())
    s3.put_object(Bucket=bucket, Key="repo/model/1/model.py",
                  Body=(SEEN + "import torch  # noqa\n" + ANSWER).encode())
    config = tmp_path / "function.yaml"
    config.write_text(f"cache_dir: {tmp_path / 'cache'}\nstorage: {{endpoint_url: '{moto_endpoint}', "
                      "region: us-east-1, addressing_style: path}\n")
    server = ServerProcess(tmp_path / "unused", "--config", str(config), env=S3_ENV, strict=True)
    with server.with_repository_url(f"s3://{bucket}/repo"):
        assert _preloaded(server, "model") is True
