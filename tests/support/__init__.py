"""Helpers the test folders share (tests/ is on pytest's pythonpath)."""
