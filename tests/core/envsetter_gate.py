"""The two events tests/core/envsetter_slow.py's import waits on and sets."""

import threading

SET, GO = threading.Event(), threading.Event()
