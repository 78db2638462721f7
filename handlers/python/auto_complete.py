"""Triton's auto-complete for Python models: ``TritonPythonModel.auto_complete_config``.

At load, a model whose ``model.py`` defines ``auto_complete_config`` gets its configuration as written
(possibly nothing but ``backend: "python"``) and returns it completed: inputs, outputs, max batch size,
dynamic batching, transaction policy.  The model's code runs in a short-lived process of its own, never
in the server; a model without the method (found by reading its source, not running it) costs nothing.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from google.protobuf import json_format

from handlers.python.environment import PARAMETER as ENVIRONMENT_PARAMETER
from handlers.python.environment import PythonEnvironment, default_environments_dir, prepare_environment
from handlers.python.environment_process import start_in_environment
from runtime.config.layout import PYTHON_MODEL_FILE, newest_model_file
from runtime.config.spec import config_to_json_dict
from runtime.errors import ModelLoadError
from runtime.protocol.model_config_pb2 import ModelConfig

if TYPE_CHECKING:
    from handlers.python.runner import RunnerSpec

AUTO_COMPLETE_TIMEOUT = 120.0


def defines_auto_complete(source: str) -> bool:
    """Whether class TritonPythonModel in ``source`` defines auto_complete_config (False if it does not parse:
    loading the model then reports the syntax error)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return False
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "TritonPythonModel":
            return any(isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == "auto_complete_config"
                       for item in node.body)
    return False


def complete_config(config: ModelConfig, model_dir: Path, environments_dir: Path | None = None) -> ModelConfig:
    """The config completed by the model's ``auto_complete_config`` (unchanged for other models), run under the
    model's own environment where its config names one (``EXECUTION_ENV_PATH``)."""
    if config.backend != "python" or config.platform:
        return config
    path = newest_model_file(model_dir, config.default_model_filename or PYTHON_MODEL_FILE)
    if path is None:
        return config
    try:
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return config  # loading reports it
    if not defines_auto_complete(source):
        return config
    from handlers.python.runner import RunnerSpec  # the worker side, only when a model needs it

    spec = RunnerSpec(model_name=model_dir.name, version=int(path.parent.name), instance_index=0,
                      model_path=str(path), version_dir=str(path.parent), args={})
    written = config_to_json_dict(config)
    written["name"] = model_dir.name
    environment = None
    named = config.parameters.get(ENVIRONMENT_PARAMETER)
    if named is not None and named.string_value:
        environment = prepare_environment(named.string_value, model_dir, environments_dir or default_environments_dir())
    completed = _run_in_process(spec, written, AUTO_COMPLETE_TIMEOUT, environment)
    result = ModelConfig()
    try:
        json_format.Parse(json.dumps(completed), result)
    except json_format.ParseError as exc:
        raise ModelLoadError(f"model '{model_dir.name}': auto_complete_config returned an invalid config: "
                             f"{str(exc)[:512]}") from None
    return result


def _run_in_process(spec: RunnerSpec, config: dict, timeout: float,
                    environment: PythonEnvironment | None = None) -> dict:
    """``auto_complete_config`` in a short-lived process of its own (under ``environment``'s interpreter, if
    given); the completed config."""
    from handlers.python.template import worker_context
    from handlers.python.worker import auto_complete_main

    name = f"triton-autocomplete-{spec.model_name}"
    process: Any
    if environment is not None:
        process, connection, _ = start_in_environment(environment, "auto_complete", (spec, config), name)
    else:
        context = worker_context()
        connection, child = context.Pipe()
        process = context.Process(target=auto_complete_main, args=(child, spec, config), daemon=True, name=name)
        process.start()
        child.close()
    try:
        if not connection.poll(timeout):
            raise ModelLoadError(f"auto_complete_config did not finish within {timeout:.0f}s")
        kind, payload = connection.recv()
    except (EOFError, OSError):
        raise ModelLoadError("the process running auto_complete_config ended unexpectedly") from None
    finally:
        process.kill() if process.is_alive() else None
        process.join(5)
        connection.close()
    if kind != "ok":
        raise ModelLoadError(payload)
    return payload
