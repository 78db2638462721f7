"""A model's declared shape, read from config.pbtxt (``pbtxt.py``) into a :class:`~runtime.config.spec.ModelSpec`
with its ensemble steps and sequence settings: the vocabulary every layer above shares, depending on nothing of
theirs (only datatypes, errors and the protocol's messages)."""
