"""Ledger sources: what the pipeline tails (``base.py``: the protocol and its capabilities)."""
