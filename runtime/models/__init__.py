"""Models and their lifecycle: configs, the repository, versions, loading, control, watching, warm-up."""
