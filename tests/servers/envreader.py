"""Imported by tests/servers/test_launcher.py's recording check: lookups and walks."""

import os

os.environ.get("TUNEBOOK_NEVER_SET")
_items = [k for k, _ in os.environ.items()]  # a walk: every variable, none of them looked up
_copy = dict(os.environ)  # another, in this frame: its reads are not lookups either
looked_up = os.environ["TUNEBOOK_LOOKED_UP"]  # but this one is, after the walk
os.environ["TUNEBOOK_LOOKED_UP"] = "after"
