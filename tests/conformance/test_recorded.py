"""What the e2e suite holds us to from one observation of Triton, observed again on real Triton on every run: the
order dynamic batching's priority levels serve requests in (tests/e2e/test_priority_levels.py) and the trace file a
served request leaves (tests/e2e/test_tracing.py). Each scenario runs on both servers: ours must match Triton's, and
Triton's must still be what the e2e tests recorded."""

from __future__ import annotations

from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.conformance.servers import start_pair
from tests.e2e.test_priority_levels import CONFIG as PRIORITY_CONFIG
from tests.e2e.test_priority_levels import MODEL as PRIORITY_MODEL
from tests.e2e.test_priority_levels import TRITON_ORDER, priority_run
from tests.e2e.test_tracing import (
    TIMESTAMPS,
    TRACE_FLAGS,
    build_trace_repository,
    read_traces,
    send_traced_requests,
    trace_shape,
)
from tests.support import write_model


@pytest.fixture(scope="module")
def priority_pair(tmp_path_factory):
    folder = tmp_path_factory.mktemp("priority-pair")
    write_model(folder / "models", "prio", PRIORITY_CONFIG, {"1/model.py": PRIORITY_MODEL})
    pair = start_pair(folder / "models", folder, wait_for="/v2/health/ready")
    yield pair
    pair.stop()


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_priority_levels_serve_in_tritons_order(priority_pair, module):
    orders = {}
    for name, endpoints, process in (("triton", priority_pair.triton, priority_pair.triton_process),
                                     ("ours", priority_pair.ours, priority_pair.ours_process)):
        url = endpoints.http if module is httpclient else endpoints.grpc
        answers = priority_run(module, url, endpoints.metrics, Path(str(process.repository)) / "prio" / "holding")
        refused = answers.pop("p1c")
        orders[name] = (sorted(answers, key=answers.__getitem__), "Exceeds maximum queue size" in str(refused))
    assert orders["ours"] == orders["triton"]
    assert orders["triton"] == (sorted(TRITON_ORDER, key=TRITON_ORDER.__getitem__), True)  # as recorded


def test_the_trace_file_has_tritons_records(tmp_path):
    repository = build_trace_repository(tmp_path / "models")
    files = {"triton": tmp_path / "triton-trace.json", "ours": tmp_path / "our-trace.json"}

    def flags(server: str) -> tuple[str, ...]:
        return tuple(part for flag in (f"triton,file={files[server]}", *TRACE_FLAGS)
                     for part in ("--trace-config", flag))

    pair = start_pair(repository, tmp_path, flags("triton"), flags("ours"), wait_for="/v2/health/ready")
    try:
        send_traced_requests(pair.triton.http, pair.triton.grpc)
        send_traced_requests(pair.ours.http, pair.ours.grpc)
    finally:
        pair.stop()  # both write their trace files out at shutdown (log_frequency 0)
    theirs, ours = trace_shape(read_traces(files["triton"])), trace_shape(read_traces(files["ours"]))
    assert ours == theirs
    assert [entry["events"] for entry in theirs if entry["model"] == "add_sub"] == [sorted(TIMESTAMPS)] * 2
