"""HTTP/REST adapter (KServe V2 / Triton) over the inference core."""
