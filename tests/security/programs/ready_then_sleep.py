"""Says it is ready, sleeps the seconds given (default: 0.3), then exits 0."""

import sys
import time

print("ready", flush=True)
time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 0.3)
