"""Queues and batching (the dynamic batcher's request queue by priority level)."""
