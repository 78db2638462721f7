"""Writes the lane request fuzzer's seeds (tests/fuzz/lane_request_fuzzer.cc): a model byte, then a
ModelInferRequest as tritonclient sends one, plain and not, for each of the fuzzer's three models, and a pickle of
the worker's answer. Run once; the seeds are kept in tests/fuzz/corpus/lane_request."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import numpy as np
from tritonclient.grpc import service_pb2 as pb

CORPUS = Path(__file__).parent / "corpus" / "lane_request"


def _request(model: str, inputs: list[tuple[str, str, list[int], bytes]], outputs: tuple[str, ...] = (),
             request_id: str = "") -> bytes:
    message = pb.ModelInferRequest(model_name=model, id=request_id)
    for name, datatype, shape, raw in inputs:
        message.inputs.add(name=name, datatype=datatype, shape=shape)
        message.raw_input_contents.append(raw)
    for name in outputs:
        message.outputs.add(name=name)
    return message.SerializeToString()


def seeds() -> dict[str, bytes]:
    floats = np.arange(8, dtype=np.float32).tobytes()
    longs = np.arange(6, dtype=np.int64).tobytes()
    return {
        "batched": b"\x00" + _request("batched", [("IN", "FP32", [2, 1], floats)], ("OUT",), "call-7"),
        "batched-large": b"\x00" + _request("batched", [("IN", "FP32", [1, 5000], bytes(20000))]),
        "batched-bad-id": b"\x00" + _request("batched", [("IN", "FP32", [2, 1], floats)]) + b"\x1a\x02\xff\xfe",
        "batched-wrong-size": b"\x00" + _request("batched", [("IN", "FP32", [1, 3], floats)]),
        "flat": b"\x01" + _request("flat", [("IN", "INT64", [2, 3], longs), ("MASK", "BOOL", [3], b"\x01\x00\x01")],
                                   ("SAME", "OUT")),
        "flat-wrapping": b"\x01" + _request("flat", [("IN", "INT64", [1 << 40, 1 << 24], b""),
                                                     ("MASK", "BOOL", [3], b"\x00\x00\x00")]),
        "empty": b"\x02" + _request("empty", [], ("PID",)),
        "answer": b"\x80" + pickle.dumps(("results", 7, [("ok", [("OUT", "FP32", (2,), -1, 0, 8, floats[:8])], "{}")]),
                                         pickle.HIGHEST_PROTOCOL),
    }


def main() -> int:
    CORPUS.mkdir(parents=True, exist_ok=True)
    for name, data in seeds().items():
        (CORPUS / name).write_bytes(data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
