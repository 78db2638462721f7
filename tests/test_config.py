"""config.pbtxt parsing into ModelSpec, version policies, and Triton-style JSON."""

from __future__ import annotations

import pytest

from runtime.config.config_text import VersionPolicy
from runtime.config.pbtxt import parse_model_config
from runtime.errors import ModelLoadError
from runtime.scheduling.batch_forming import batch_signature
from runtime.types import InferRequest, InferTensor
from runtime.validation import validate_request

ONNX = """
platform: "onnxruntime_onnx"
max_batch_size: 4
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1, 3 ] reshape: { shape: [ 3, -1 ] } } ]
output [ { name: "Y" data_type: TYPE_STRING dims: [ 2 ] } ]
instance_group [ { kind: KIND_CPU count: 2 }, { kind: KIND_GPU gpus: [ 0, 1 ] } ]
dynamic_batching { preferred_batch_size: [ 2, 4 ] max_queue_delay_microseconds: 500
                   default_queue_policy { max_queue_size: 16 default_timeout_microseconds: 1000 } }
parameters { key: "intra_op_thread_count" value { string_value: "1" } }
"""


def test_parse_full_config():
    spec = parse_model_config(ONNX, "m")
    assert spec.name == "m"
    assert spec.handler == "onnxruntime"
    assert spec.backend == "onnxruntime"
    assert spec.max_batch_size == 4
    assert spec.inputs[0].datatype == "FP32"
    assert spec.inputs[0].dims == (-1, 3)
    assert spec.inputs[0].reshape == (3, -1)
    assert spec.outputs[0].datatype == "BYTES"
    assert [(g.kind, g.count, g.gpus) for g in spec.instance_groups] == [("KIND_CPU", 2, ()), ("KIND_GPU", 1, (0, 1))]
    assert spec.instance_count == 3
    assert spec.dynamic_batching.preferred_batch_sizes == (2, 4)
    assert spec.dynamic_batching.max_queue_delay_microseconds == 500
    assert spec.dynamic_batching.queue_policy.max_queue_size == 16
    assert spec.parameters == {"intra_op_thread_count": "1"}
    assert spec.default_model_filename == "model.onnx"


def test_json_prints_int64_fields_as_numbers():
    data = parse_model_config(ONNX, "m").to_json_dict()
    assert data["input"][0]["dims"] == [-1, 3]
    assert data["input"][0]["reshape"]["shape"] == [3, -1]
    assert data["dynamic_batching"]["max_queue_delay_microseconds"] == 500
    assert data["dynamic_batching"]["default_queue_policy"]["default_timeout_microseconds"] == 1000
    assert data["instance_group"][1]["gpus"] == [0, 1]
    assert data["version_policy"] == {"latest": {"num_versions": 1}}


@pytest.mark.parametrize(
    "platform, backend, handler, file_name",
    [
        ("onnxruntime_onnx", "", "onnxruntime", "model.onnx"),
        ("pytorch_libtorch", "", "pytorch", "model.pt"),
        ("", "onnxruntime", "onnxruntime", "model.onnx"),
        ("", "pytorch", "pytorch", "model.pt"),
        ("", "python", "python", "model.py"),
        ("", "openvino", "openvino", "model.xml"),
    ],
)
def test_platform_and_backend_select_the_handler(platform, backend, handler, file_name):
    text = (f'platform: "{platform}"\n' if platform else "") + (f'backend: "{backend}"\n' if backend else "")
    text += 'input [ { name: "A" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
    text += 'output [ { name: "B" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
    spec = parse_model_config(text, "m")
    assert spec.handler == handler
    assert spec.default_model_filename == file_name


@pytest.mark.parametrize(
    "text, reason",
    [
        ("platform: ", "syntax error"),
        ('platform: "caffe2_netdef"', "unknown platform 'caffe2_netdef' (served here: "),
        ('backend: "dali"', "unknown backend 'dali'"),
        ('name: "other" backend: "python"', "does not match its folder name"),
        ("max_batch_size: 2", "neither platform nor backend"),
        ('platform: "onnxruntime_onnx" backend: "pytorch"', "does not match backend"),
        ('backend: "python" default_model_filename: "../evil.py"', "invalid default_model_filename"),
        ('backend: "python" input [ { name: "A" dims: [ 1 ] } ]', "has no data_type"),
        ('backend: "python" input [ { name: "A" data_type: TYPE_FP32 dims: [ -3 ] } ]', "invalid dims"),
        ('backend: "python" dynamic_batching { }', "needs max_batch_size > 0"),
        ('backend: "python" input [ { name: "A" data_type: TYPE_FP32 dims: [1] }, '
         '{ name: "A" data_type: TYPE_FP32 dims: [1] } ]', "duplicate input names"),
        ('platform: "onnxruntime_onnx"', "must declare its inputs and outputs"),
    ],
)
def test_bad_configs_give_a_reason(text, reason):
    with pytest.raises(ModelLoadError) as info:
        parse_model_config(text, "m")
    assert reason in str(info.value)


@pytest.mark.parametrize(
    "policy, available, selected",
    [
        (VersionPolicy(), [1, 2, 10], [10]),
        (VersionPolicy(kind="latest", num_versions=2), [3, 1, 2], [2, 3]),
        (VersionPolicy(kind="all"), [2, 1], [1, 2]),
        (VersionPolicy(kind="specific", versions=(1, 5)), [1, 2, 3], [1]),
        (VersionPolicy(kind="latest", num_versions=5), [1], [1]),
    ],
)
def test_version_policy_selection(policy, available, selected):
    assert policy.select(available) == selected


@pytest.mark.parametrize("files, platform, backend", [
    (["1/model.onnx"], "onnxruntime_onnx", "onnxruntime"),
    (["1/model.pt"], "pytorch_libtorch", "pytorch"),
    (["1/model.xml", "1/model.bin"], "", "openvino"),
    (["1/model.pt", "2/model.onnx"], "onnxruntime_onnx", "onnxruntime"),  # the newest version decides
    (["1/model.savedmodel/saved_model.pb"], "tensorflow_savedmodel", "tensorflow"),
    (["1/model.graphdef"], "tensorflow_graphdef", "tensorflow"),
    (["1/model.plan"], "tensorrt_plan", "tensorrt"),
    (["1/model.netdef"], "", ""),  # no platform to detect: the config check says so
])
def test_a_config_without_platform_or_backend_gets_them_from_the_model_file(tmp_path, files, platform, backend):
    from runtime.models.repository import ModelRepository

    folder = tmp_path / "m"
    for relative in files:
        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
        (folder / relative).write_bytes(b"")
    (folder / "config.pbtxt").write_text('input [ { name: "A" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
                                         'output [ { name: "B" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
                                         'version_policy: { all { } }\n')
    repository = ModelRepository(tmp_path)
    if not backend:
        with pytest.raises(ModelLoadError, match="config sets neither platform nor backend"):
            repository.read_spec("m")
        return
    spec = repository.read_spec("m")
    assert (spec.platform, spec.backend) == (platform, backend)


def test_config_json_keys_in_the_proto_order_as_triton_prints_them():
    """json_format prints the fields that are set first; Triton (checked against 2.51) prints declaration order."""
    data = parse_model_config(ONNX, "m").to_json_dict()
    assert list(data)[:8] == ["name", "platform", "backend", "runtime", "version_policy", "max_batch_size", "input",
                              "output"]
    assert list(data["input"][0])[:4] == ["name", "data_type", "format", "dims"]
    assert list(data["instance_group"][0])[:3] == ["name", "kind", "count"]


FIXED = """
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "B" data_type: TYPE_INT32 dims: [ 2, 3 ] }, { name: "A" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


def test_a_fixed_input_signature_is_every_valid_requests_batch_signature():
    spec = parse_model_config(FIXED, "fixed")
    for rows in (1, 5):
        request = InferRequest("fixed", inputs=[
            InferTensor("A", "FP32", (rows, 4), None, {}, bytes(rows * 16)),
            InferTensor("B", "INT32", (rows, 2, 3), None, {}, bytes(rows * 24))])
        validate_request(spec, request)
        assert spec.fixed_input_signature == batch_signature(request, batched=True)
    # where valid requests may differ past the batch dim, or be reshaped first, each is asked its own
    declared = '{ name: "A" data_type: TYPE_FP32 dims: [ 4 ] }'
    for other in ('dims: [ -1 ]', 'dims: [ 4 ] optional: true', 'dims: [ 4 ] reshape: { shape: [ 2, 2 ] }',
                  'dims: [ 4 ] allow_ragged_batch: true'):
        config = FIXED.replace(declared, '{ name: "A" data_type: TYPE_FP32 ' + other + ' }')
        assert config != FIXED
        assert parse_model_config(config, "fixed").fixed_input_signature is None, other
