"""Queues and batching: the dynamic batcher, priority levels, the rate limiter, sequences, ensembles, and the
statistics they keep."""
