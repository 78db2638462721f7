"""Cold-start bootstrap: reads function.yaml, prepares the repository, runs the servers."""
