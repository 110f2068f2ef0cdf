"""A stand-in for a server module in tests/servers/test_launcher.py: not a fake vLLM (the
launcher forks whatever module it is given; the vLLM starts through it are tested on real
engines). `python -m launchee OUT [EXIT_CODE | serve | listen-fork --port N]` writes what a started
server sees (argv, environment, working folder, process group) as JSON to OUT, then exits with
EXIT_CODE, or sleeps until it is stopped (listen-fork: listening on N, with a forked child, as
vLLM's API server and its engine core)."""

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
    if what == "listen-fork":  # as vLLM's API server: listen, then fork its engine core
        import socket

        # bound, then the fork, then listen: the order of vLLM's API server
        listener = socket.socket()
        listener.bind(("127.0.0.1", int(sys.argv[sys.argv.index("--port") + 1])))
        child = os.fork()
        if child:
            listener.listen()
        if child == 0:
            while True:
                time.sleep(1)
        # by a rename, whole: the test polls for the name (written in place, it was once read
        # empty on two busy cores)
        with open(out + ".child.tmp", "w") as f:
            f.write(str(child))
        os.replace(out + ".child.tmp", out + ".child")
        what = "serve"
    if what == "serve":
        while True:
            time.sleep(1)
    sys.exit(int(what))
