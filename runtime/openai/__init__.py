"""OpenAI-compatible endpoints (``/v1/models``, ``/v1/completions``, ``/v1/chat/completions``, ``/v1/embeddings``)
over any model whose config maps a prompt input and a text output: an adapter over the core's infer calls, as the
REST and gRPC adapters are. ``llm_model.py`` reads the mapping, template and tokenizer from the model's folder;
``chat.py`` renders chat prompts and parses tool calls; ``generation.py`` turns OpenAI requests into inference
requests and responses back; ``routes.py`` serves them."""
