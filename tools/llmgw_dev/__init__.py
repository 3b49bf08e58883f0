"""Developer tools for llmgw: a real llama-server build, a tiny model, a fake engine, process helpers.

Not shipped with the daemons; tests import it through pytest's ``pythonpath = ["tools", ...]``.
"""
