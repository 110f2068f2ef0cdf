"""A stand-in for a server module in tests/servers/test_launcher.py: not a fake vLLM (the
launcher forks whatever module it is given; the vLLM starts through it are tested on real
engines). `python -m launchee OUT [EXIT_CODE | serve]` writes what a started server sees (argv,
environment, working folder, process group) as JSON to OUT, then exits with EXIT_CODE or
sleeps until it is stopped."""

import json
import os
import sys
import time

if __name__ == "__main__":
    out, what = sys.argv[1], sys.argv[2]
    seen = {"argv": sys.argv, "env": dict(os.environ), "cwd": os.getcwd(), "pid": os.getpid(),
            "pgid": os.getpgid(0), "sid": os.getsid(0), "main": __name__}
    with open(out + ".tmp", "w") as f:
        json.dump(seen, f)
    os.replace(out + ".tmp", out)
    print("launchee: written", flush=True)
    if what == "serve":
        while True:
            time.sleep(1)
    sys.exit(int(what))
