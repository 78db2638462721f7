"""deploy/: the Knative, KServe and PAI-EAS manifests, held to the APIs that read them and to our own CLI.

- Every Kubernetes object part (containers, probes, env, volumes, resources) is checked field by field against the
  Kubernetes API models of the official `kubernetes` client: an unknown or misspelt field, or a wrong type, fails.
- The custom resources' own fields (Knative Service, KServe ClusterServingRuntime, ClusterStorageContainer,
  InferenceService) are checked against JSON schemas written here from their API references (only the fields
  these manifests use, closed to others).
- Every command line is parsed by `bootstrap`'s own argument parser, probe paths are asked of a real server,
  and the ports the platform routes to are the ports the arguments open.
"""

from __future__ import annotations

import copy
import json
import re
import shlex

import httpx
import jsonschema
import kubernetes.client
import pytest
import yaml

from bootstrap.cli import main_parser
from tests.support import ROOT

DEPLOY = ROOT / "deploy"
ENTRYPOINT = ["bootstrap", "run"]  # the image's (Dockerfile ENTRYPOINT)


def load(relative: str) -> dict:
    text = (DEPLOY / relative).read_text()
    return json.loads(text) if relative.endswith(".json") else yaml.safe_load(text)


def check_model(data, type_name: str, where: str = "") -> None:
    """Check ``data`` against a Kubernetes API model (``V1Container``, ``list[V1EnvVar]``...), strictly."""
    if type_name.startswith("list["):
        assert isinstance(data, list), f"{where}: expected a list"
        for index, item in enumerate(data):
            check_model(item, type_name[5:-1], f"{where}[{index}]")
        return
    if type_name.startswith("dict["):
        assert isinstance(data, dict), f"{where}: expected a mapping"
        value_type = type_name[5:-1].split(",", 1)[1].strip()
        for key, value in data.items():
            check_model(value, value_type, f"{where}.{key}")
        return
    primitives = {"str": str, "int": int, "bool": bool, "float": (int, float), "object": (str, int, dict, list)}
    if type_name in primitives:
        assert isinstance(data, primitives[type_name]) and not (type_name == "int" and isinstance(data, bool)), \
            f"{where}: expected {type_name}, got {data!r}"
        return
    model = getattr(kubernetes.client, type_name)
    assert isinstance(data, dict), f"{where}: expected a {type_name} mapping"
    by_json_name = {json_name: attribute for attribute, json_name in model.attribute_map.items()}
    for key, value in data.items():
        assert key in by_json_name, f"{where}: '{key}' is not a field of {type_name}"
        check_model(value, model.openapi_types[by_json_name[key]], f"{where}.{key}")
    # the client's own required-field checks run when it builds the object
    kubernetes.client.ApiClient()._ApiClient__deserialize(data, type_name)


def closed(properties: dict, required: tuple[str, ...] = ()) -> dict:
    return {"type": "object", "properties": properties, "required": list(required), "additionalProperties": False}


STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
OBJECT_META = closed({"name": {"type": "string"}, "namespace": {"type": "string"}, "labels": STRING_MAP,
                      "annotations": STRING_MAP}, ("name",))
ANY_OBJECT = {"type": "object"}  # a Kubernetes model's part: checked by check_model

KNATIVE_SERVICE = closed({
    "apiVersion": {"const": "serving.knative.dev/v1"}, "kind": {"const": "Service"}, "metadata": OBJECT_META,
    "spec": closed({"template": closed({
        "metadata": closed({"annotations": STRING_MAP, "labels": STRING_MAP, "name": {"type": "string"}}),
        "spec": {"type": "object", "properties": {
            "containerConcurrency": {"type": "integer", "minimum": 0},
            "timeoutSeconds": {"type": "integer", "minimum": 0},
            "containers": {"type": "array", "minItems": 1}}, "required": ["containers"]},
    }, ("spec",)), "traffic": {"type": "array"}}, ("template",)),
}, ("apiVersion", "kind", "metadata", "spec"))

SERVING_RUNTIME = closed({
    "apiVersion": {"const": "serving.kserve.io/v1alpha1"}, "kind": {"const": "ClusterServingRuntime"},
    "metadata": OBJECT_META,
    "spec": closed({
        "annotations": STRING_MAP, "labels": STRING_MAP, "disabled": {"type": "boolean"},
        "multiModel": {"type": "boolean"},
        "supportedModelFormats": {"type": "array", "minItems": 1, "items": closed({
            "name": {"type": "string"}, "version": {"type": "string"}, "autoSelect": {"type": "boolean"},
            "priority": {"type": "integer", "minimum": 1}}, ("name",))},
        "protocolVersions": {"type": "array", "items": {"enum": ["v1", "v2", "grpc-v1", "grpc-v2"]}},
        "containers": {"type": "array", "minItems": 1},
    }, ("supportedModelFormats", "containers")),
}, ("apiVersion", "kind", "metadata", "spec"))

STORAGE_CONTAINER = closed({
    "apiVersion": {"const": "serving.kserve.io/v1alpha1"}, "kind": {"const": "ClusterStorageContainer"},
    "metadata": OBJECT_META,
    "spec": closed({
        "container": ANY_OBJECT,
        "supportedUriFormats": {"type": "array", "minItems": 1, "items": {
            "type": "object", "minProperties": 1, "maxProperties": 1, "additionalProperties": False,
            "properties": {"prefix": {"type": "string"}, "regex": {"type": "string"}}}},
        "workloadType": {"enum": ["initContainer", "localModelDownloadJob"]},
    }, ("container", "supportedUriFormats")),
}, ("apiVersion", "kind", "metadata", "spec"))

INFERENCE_SERVICE = closed({
    "apiVersion": {"const": "serving.kserve.io/v1beta1"}, "kind": {"const": "InferenceService"},
    "metadata": OBJECT_META,
    "spec": closed({"predictor": closed({
        "minReplicas": {"type": "integer", "minimum": 0}, "maxReplicas": {"type": "integer", "minimum": 0},
        "containerConcurrency": {"type": "integer", "minimum": 0},
        "model": closed({
            "modelFormat": closed({"name": {"type": "string"}, "version": {"type": "string"}}, ("name",)),
            "runtime": {"type": "string"}, "protocolVersion": {"enum": ["v1", "v2", "grpc-v2"]},
            "storageUri": {"type": "string", "pattern": "^(s3|oss)://[^/]+/.+"},
        }, ("modelFormat", "storageUri")),
    }, ("model",))}, ("predictor",)),
}, ("apiVersion", "kind", "metadata", "spec"))

EAS_SERVICE = closed({
    "metadata": closed({"name": {"type": "string", "pattern": "^[a-z][a-z0-9_]*$"},
                        "instance": {"type": "integer", "minimum": 0}, "cpu": {"type": "integer", "minimum": 1},
                        "memory": {"type": "integer", "minimum": 1}, "gpu": {"type": "integer", "minimum": 0},
                        "enable_grpc": {"type": "boolean"}}, ("name", "instance")),
    "containers": {"type": "array", "minItems": 1, "items": closed({
        "image": {"type": "string"}, "script": {"type": "string"}, "command": {"type": "string"},
        "port": {"type": "integer"},
        "env": {"type": "array", "items": closed({"name": {"type": "string"}, "value": {"type": "string"}},
                                                  ("name", "value"))}}, ("image", "port"))},
    "storage": {"type": "array", "items": closed({
        "mount_path": {"type": "string"},
        "empty_dir": closed({"medium": {"enum": ["memory", ""]}, "size_limit": {"type": "integer"}}),
        "oss": closed({"path": {"type": "string"}, "readOnly": {"type": "boolean"}}, ("path",)),
    }, ("mount_path",))},
}, ("metadata", "containers"))


def run_options(arguments: list[str], prefix: list[str] = ENTRYPOINT):
    """The namespace `bootstrap` itself parses from a container's command line (a setting's flag: `flag_<name>`)."""
    command = prefix + arguments
    assert command[0] == "bootstrap", command
    return main_parser().parse_args(command[1:])


def test_the_knative_service():
    service = load("knative/service.yaml")
    jsonschema.validate(service, KNATIVE_SERVICE)
    template = service["spec"]["template"]
    annotations = template["metadata"]["annotations"]
    assert annotations["autoscaling.knative.dev/min-scale"] == "0"  # scale to zero
    assert re.fullmatch(r"\d+[smh]", annotations["autoscaling.knative.dev/scale-down-delay"])  # keep warm
    assert all(key.startswith("autoscaling.knative.dev/") for key in annotations)
    pod = {key: value for key, value in template["spec"].items() if key not in ("containerConcurrency",
                                                                                  "timeoutSeconds")}
    (container,) = pod["containers"]
    filled = copy.deepcopy(pod)  # Knative fills a probe's port with the containerPort; Kubernetes needs one
    for probe in ("readinessProbe", "livenessProbe"):
        assert "port" not in container[probe]["httpGet"]
        filled["containers"][0][probe]["httpGet"]["port"] = container["ports"][0]["containerPort"]
    check_model(filled, "V1PodSpec", "spec.template.spec")
    assert [port["name"] for port in container["ports"]] == ["h2c"]  # Knative: HTTP/2 cleartext to the container
    options = run_options(container["args"])
    assert options.flag_http_port is None  # Knative's $PORT decides (it is the containerPort)
    assert options.flag_single_port is True  # gRPC on that port too
    assert options.flag_model_repository.startswith("s3://")
    assert options.flag_shutdown_timeout < 30  # drains within the default terminationGracePeriodSeconds
    mounts = {mount["name"] for mount in container["volumeMounts"]}
    assert mounts <= {volume["name"] for volume in pod["volumes"]}


def test_the_kserve_runtime_storage_initializer_and_inference_service():
    runtime = load("kserve/cluster-serving-runtime.yaml")
    jsonschema.validate(runtime, SERVING_RUNTIME)
    (container,) = runtime["spec"]["containers"]
    check_model(container, "V1Container", "spec.containers[0]")
    assert container["name"] == "kserve-container"
    assert {f["name"] for f in runtime["spec"]["supportedModelFormats"]} >= {"triton", "onnx", "pytorch"}
    assert set(runtime["spec"]["protocolVersions"]) == {"v2", "grpc-v2"}
    options = run_options(container["args"])
    assert options.flag_model_repository == "/mnt/models/repository"
    assert container["readinessProbe"]["httpGet"]["port"] == options.flag_http_port
    assert [port["containerPort"] for port in container["ports"]] == [options.flag_grpc_port]

    initializer = load("kserve/cluster-storage-container.yaml")
    jsonschema.validate(initializer, STORAGE_CONTAINER)
    check_model(initializer["spec"]["container"], "V1Container", "spec.container")
    assert initializer["spec"]["container"]["name"] == "storage-initializer"  # KServe requires this name
    # KServe appends the storageUri and /mnt/models: our CLI must read them as source and destination
    sync = main_parser().parse_args([*initializer["spec"]["container"]["command"][1:], "oss://bucket/models",
                                 "/mnt/models"])
    assert (sync.command, sync.source, sync.destination) == ("sync", "oss://bucket/models", "/mnt/models")

    service = load("kserve/inference-service.yaml")
    jsonschema.validate(service, INFERENCE_SERVICE)
    model = service["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    assert model["modelFormat"]["name"] in {f["name"] for f in runtime["spec"]["supportedModelFormats"]}
    assert any(model["storageUri"].startswith(f["prefix"]) for f in initializer["spec"]["supportedUriFormats"])


def test_the_pai_eas_service():
    service = load("pai-eas/service.json")
    jsonschema.validate(service, EAS_SERVICE)
    (container,) = service["containers"]
    options = run_options(shlex.split(container["script"]), prefix=[])
    assert options.command == "run" and options.flag_model_repository.startswith("oss://")
    assert container["port"] == options.flag_http_port == 8000 and options.flag_grpc_port == 8001
    assert {"AWS_REGION", "FUNCTION_AUTH_TOKEN"} <= {env["name"] for env in container["env"]}  # oss:// needs a region
    assert any(item["mount_path"] == "/dev/shm" and item["empty_dir"]["medium"] == "memory"
               for item in service["storage"])


def test_the_checks_catch_mistakes():
    with pytest.raises(AssertionError, match="'readinesProbe' is not a field of V1Container"):
        check_model({"name": "x", "readinesProbe": {}}, "V1Container")
    with pytest.raises(AssertionError, match="expected int"):
        check_model({"name": "x", "ports": [{"containerPort": "8080"}]}, "V1Container")
    with pytest.raises(ValueError):
        check_model({"image": "x"}, "V1Container")  # no name
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**load("kserve/inference-service.yaml"), "spec": {"predictor": {"model": {
            "modelFormat": {"name": "triton"}, "storageUri": "gs://bucket/x"}}}}, INFERENCE_SERVICE)
    with pytest.raises(SystemExit):
        run_options(["--no-such-flag"])


def probe_paths() -> set[str]:
    paths = set()
    for relative in ("knative/service.yaml", "kserve/cluster-serving-runtime.yaml"):
        document = load(relative)
        spec = document["spec"]
        containers = spec["template"]["spec"]["containers"] if "template" in spec else spec["containers"]
        for container in containers:
            for probe in ("readinessProbe", "livenessProbe"):
                paths.add(container[probe]["httpGet"]["path"])
    return paths


def test_every_probe_path_answers_200_on_a_real_server(server):
    paths = probe_paths()
    assert paths == {"/v2/health/ready", "/v2/health/live"}
    for path in paths:
        assert httpx.get(f"http://{server.http_url}{path}").status_code == 200


def test_the_manifests_name_one_image_repository():
    images = set()
    for path in DEPLOY.rglob("*"):
        if path.suffix in (".yaml", ".json"):
            images.update(re.findall(r"registry\.example\.com/serverless-triton:(\w+)", path.read_text()))
    assert images <= {"cpu", "gpu"} and images

