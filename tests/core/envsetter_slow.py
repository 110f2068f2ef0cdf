"""Imported by tests/core/test_environ.py on a thread: an import that has set a variable and
is not done yet (vLLM's client, imported while an engine starts), until the test says go."""

import os

from envsetter_gate import GO, SET

os.environ["ENVSETTER_SLOW"] = "by the import"
SET.set()
GO.wait(30)
