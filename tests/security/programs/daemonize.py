"""Rank 0 leaves a daemon behind (setsid + double fork, as a service would) and a child in a
session of its own (a JIT compiler started with start_new_session), then exits 0; with
--hang it waits instead, for a launcher to time out or be killed. Pids go to $PIDS_FILE."""

import os
import subprocess
import sys
import time

if os.environ.get("RANK") == "0":
    r, w = os.pipe()
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.write(w, f"{os.getpid()}\n".encode())
            os.close(w)
            while True:
                time.sleep(1)
        os._exit(0)
    os.close(w)
    daemon = int(os.read(r, 64))
    jit = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                           start_new_session=True)
    with open(os.environ["PIDS_FILE"], "a") as f:
        f.write(f"{daemon}\n{jit.pid}\n{os.getpid()}\n")
if "--hang" in sys.argv:
    print("ready", flush=True)
    time.sleep(600)
