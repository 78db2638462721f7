"""End-to-end suites: each starts real servers (ours, moto's S3, nginx, a container build) and talks to them
over loopback with real clients."""
