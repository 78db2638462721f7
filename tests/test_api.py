"""The core's declared interface (runtime/api.py): the in-process core and the front ends' remote service both
serve every method of it with the same signature, and the owner's endpoint forwards exactly those."""

from __future__ import annotations

import inspect

import pytest

from runtime.api import API_METHODS, REMOTE_CALLS, InferenceApi
from runtime.core import InferenceService
from runtime.frontends.endpoint import CALLABLE
from runtime.frontends.remote import RemoteService


def _parameters(function) -> list[tuple[str, object]]:
    return [(p.name, p.default) for p in inspect.signature(function).parameters.values() if p.name != "self"]


@pytest.mark.parametrize("service", [InferenceService, RemoteService])
def test_both_services_serve_the_whole_interface(service):
    for name in sorted(API_METHODS):
        declared, served = getattr(InferenceApi, name), getattr(service, name)
        assert _parameters(served) == _parameters(declared), name
        assert inspect.iscoroutinefunction(served) == inspect.iscoroutinefunction(declared), name
        assert inspect.isasyncgenfunction(served) or not inspect.isasyncgenfunction(declared), name


def test_front_ends_forward_exactly_the_interface():
    assert CALLABLE == REMOTE_CALLS == API_METHODS - {"infer", "infer_stream", "tensor_buffer", "direct_models",
                                                      "watch_direct_offer", "note_activity", "direct_response"}
    assert {"live", "infer", "trace_settings", "load_model"} <= API_METHODS
