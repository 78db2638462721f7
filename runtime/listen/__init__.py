"""Listeners shared by the protocol adapters: one port serving REST and gRPC together."""
