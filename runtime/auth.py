"""Token authentication shared by the HTTP and gRPC adapters."""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from runtime.errors import Unauthenticated

HEALTH_PATHS = frozenset({"/v2/health/live", "/v2/health/ready"})


@dataclass(frozen=True)
class TokenAuth:
    """Accepts ``<token>`` or ``Bearer <token>``, compared in constant time."""

    token: str

    def check(self, authorization: str | None) -> None:
        """Raise Unauthenticated unless ``authorization`` carries the token."""
        if not authorization:
            raise Unauthenticated("missing authorization: send 'Authorization: Bearer <token>'")
        presented = authorization.strip()
        scheme, _, rest = presented.partition(" ")
        if scheme.lower() == "bearer" and rest:
            presented = rest.strip()
        if not hmac.compare_digest(presented.encode("utf-8"), self.token.encode("utf-8")):
            raise Unauthenticated("invalid authorization token")
