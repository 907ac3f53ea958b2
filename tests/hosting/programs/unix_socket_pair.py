"""Two ranks talk over an AF_UNIX stream socket, as FlashInfer's fd exchange does: rank 0
listens on a path both derive from the launcher's MASTER_PORT, rank 1 connects and sends
its rank. Before that, every rank finds a free TCP port the way vLLM's get_open_port does
(bind to port 0, read it, close). One RESULT line per rank."""

import json
import os
import socket
import tempfile
import time

rank = int(os.environ["RANK"])
with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
path = os.path.join(tempfile.gettempdir(), f"commsim-test-pair-{os.environ['MASTER_PORT']}.sock")
if rank == 0:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(path)
        server.listen(1)
        conn, _ = server.accept()
        got = conn.recv(1)[0]
        conn.close()
    os.unlink(path)
else:
    got = None
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        for _ in range(3000):
            try:
                client.connect(path)
                break
            except (FileNotFoundError, ConnectionRefusedError):
                time.sleep(0.01)
        client.sendall(bytes([rank]))
print("RESULT " + json.dumps({"rank": rank, "got": got, "port_found": port > 0}))
