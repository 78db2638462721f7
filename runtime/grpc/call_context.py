"""What the servicer uses of a call's context, for the front ends that run it away from grpc.aio: the call's
metadata, and ``abort``, which raises :class:`CallEnded` for the front end to turn into the call's status."""

from __future__ import annotations

from runtime.grpc.status_codes import StatusCode


class CallEnded(Exception):
    """The call ends with this status (what ``context.abort`` raises here)."""

    def __init__(self, code: StatusCode, message: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class ServicerCallContext:
    """The part of ``grpc.aio.ServicerContext`` the servicer uses: ``invocation_metadata`` and ``abort``."""

    def __init__(self, metadata) -> None:
        self.metadata = tuple(metadata or ())

    def invocation_metadata(self) -> tuple:
        return self.metadata

    async def abort(self, code: StatusCode, message: str = "") -> None:
        raise CallEnded(code, message)
