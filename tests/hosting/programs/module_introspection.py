"""How libraries probe the modules commsim hosts: `importlib.util.find_spec` before and after
the import, `__spec__`, `__file__`. One RESULT line; run plainly too (RANK unset: rank 0), so
a test compares a hosted rank's answers with a plain interpreter's."""

import importlib
import importlib.util
import json
import os

# The pre-13 cuda-python names, the modules commsim replaces, and ones it patches in place.
NAMES = ("cuda.cudart", "cuda.cuda", "cuda.nvrtc", "cuda.bindings.runtime",
         "cuda.bindings.driver", "pynvml", "torch.cuda", "torch.distributed")


def probe(name: str) -> dict:
    try:
        before = importlib.util.find_spec(name)
    except (ImportError, ValueError) as e:
        return {"before": f"{type(e).__name__}: {e}"}
    fact = {"before": None if before is None else before.origin}
    if before is None:
        return fact
    module = importlib.import_module(name)
    try:
        after = importlib.util.find_spec(name)
        fact["after"] = None if after is None else after.origin
    except ValueError as e:          # a module in sys.modules whose __spec__ is None
        fact["after"] = f"ValueError: {e}"
    fact["file"] = getattr(module, "__file__", None)
    return fact


print("RESULT " + json.dumps({"rank": int(os.environ.get("RANK", 0)),
                              "modules": {n: probe(n) for n in NAMES}}))
