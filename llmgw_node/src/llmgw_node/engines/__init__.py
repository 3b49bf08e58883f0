"""Engines on a node: release index, download, safe unpack, proof, and the manager that converges."""
