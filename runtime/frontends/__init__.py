"""Front-end processes: more cores for the protocol work, one copy of every model.

The server process owns the models (the core, schedulers, handlers and their workers). With
``frontend_processes`` N above 0 it starts N front-end processes (:mod:`runtime.frontends.process`, managed by
:mod:`runtime.frontends.pool`) that listen on the HTTP and gRPC ports with SO_REUSEPORT, run the same protocol
adapters, and hand each decoded request to the owner over a Unix socket (:mod:`runtime.frontends.wire`);
:class:`~runtime.frontends.remote.RemoteService` stands in for the core there and
:class:`~runtime.frontends.endpoint.OwnerEndpoint` answers for it in the owner, which serves only metrics itself.
"""
