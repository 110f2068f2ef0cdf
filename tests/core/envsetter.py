"""Imported by tests/core/test_environ.py: an import that sets variables, as torch's and
vLLM's do (TORCHINDUCTOR_CACHE_DIR, LD_LIBRARY_PATH, …)."""

import os

os.environ["ENVSETTER_CHANGED"] = "by the import"
os.environ["ENVSETTER_ADDED"] = "by the import"
