"""Front-end processes: more cores for the protocol work, one copy of every model.

The server process owns the models (the core, schedulers and handlers). With ``frontend_processes`` above 1 it
starts that many minus one front-end processes (:mod:`runtime.frontends.process`) that accept connections on
the same HTTP and gRPC ports, run the same protocol adapters, and hand each decoded request to the owner over a
Unix socket (:mod:`runtime.frontends.wire`); :class:`~runtime.frontends.remote.RemoteService` stands in for the
core there and :class:`~runtime.frontends.endpoint.OwnerEndpoint` answers for it in the owner.
"""
