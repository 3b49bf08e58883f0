"""The transport: every listener's connection loop (hypercorn's HTTP/1.1 protocol driven by a loop of
our own), its limits, TLS, and the ASGI types the apps above it speak."""
