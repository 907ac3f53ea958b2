"""The device check's report: summary.md, rows.tsv and figures.json in the results folder.

Reads what scripts/device_check.sh's steps left there: device_check.json (commsim.devicecheck),
e2e.log (the communicator end to end), conformance.xml (pytest's JUnit XML of tests/conformance
under COMMSIM_DEVICE=cuda) and steps.txt (each step's exit code), and names the machine
(GPU, driver version, CUDA version) from NVML and the driver. Every conformance row is listed
as agree / disagree / not checked (with the reason pytest gave), so the UNCONFIRMED table in
docs/device.md can be updated from rows.tsv alone.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import xml.etree.ElementTree as ET
from typing import Any

ROW = re.compile(r"\[([A-Z]+\d+[a-z]?)")


def machine() -> dict[str, str]:
    """GPU name, driver version and the driver's CUDA version; 'unknown' where not readable."""
    info = {"gpu": "unknown", "driver": "unknown", "cuda": "unknown"}
    try:
        import pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        name = pynvml.nvmlDeviceGetName(h)
        info["gpu"] = name.decode() if isinstance(name, bytes) else str(name)
        drv = pynvml.nvmlSystemGetDriverVersion()
        info["driver"] = drv.decode() if isinstance(drv, bytes) else str(drv)
    except Exception as e:  # no NVML: the report still lists what ran
        info["gpu"] = f"unknown ({type(e).__name__})"
    try:
        from cuda.bindings import driver as cu
        err, v = cu.cuDriverGetVersion()
        if int(err) == 0:
            info["cuda"] = f"{v // 1000}.{(v % 1000) // 10}"
    except Exception:
        pass
    return info


def conformance_rows(path: str) -> list[dict[str, str]]:
    """One dict per test case of the JUnit XML: row, test, outcome, detail."""
    if not os.path.exists(path):
        return []
    rows = []
    for tc in ET.parse(path).getroot().iter("testcase"):
        name = tc.get("name", "")
        m = ROW.search(name)
        outcome, detail = "agree", ""
        for tag, label in (("failure", "disagree"), ("error", "disagree"), ("skipped", "not checked")):
            el = tc.find(tag)
            if el is not None:
                outcome = label
                detail = (el.get("message") or el.text or "").strip().splitlines()[0][:300] if (el.get("message") or el.text) else ""
                break
        rows.append({"row": m.group(1) if m else "-", "test": name, "outcome": outcome, "detail": detail})
    return rows


def figures(results: list[dict[str, Any]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for r in results:
        for k, v in (r.get("figures") or {}).items():
            out[f"{r['name']}: {k}"] = v
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="the device check's results folder")
    p.add_argument("--seconds", type=int, default=0, help="the whole check's wall time, for the summary")
    a = p.parse_args(argv)
    if not os.path.isdir(a.out):
        print(f"device report: --out {a.out}: no such folder", file=sys.stderr)
        return 2
    checks: list[dict[str, Any]] = []
    jpath = os.path.join(a.out, "device_check.json")
    if os.path.exists(jpath):
        with open(jpath) as f:
            checks = json.load(f)
    rows = conformance_rows(os.path.join(a.out, "conformance.xml"))
    steps = {}
    spath = os.path.join(a.out, "steps.txt")
    if os.path.exists(spath):
        for line in open(spath):
            if line.strip():
                k, v = line.split()
                steps[k] = int(v)
    e2e_tail = ""
    lpath = os.path.join(a.out, "e2e.log")
    if os.path.exists(lpath):
        e2e_tail = "".join(open(lpath).readlines()[-15:])
    m = machine()
    figs = figures(checks)

    with open(os.path.join(a.out, "rows.tsv"), "w") as f:
        f.write("row\toutcome\ttest\tdetail\n")
        for r in rows:
            f.write(f"{r['row']}\t{r['outcome']}\t{r['test']}\t{r['detail']}\n")
    with open(os.path.join(a.out, "figures.json"), "w") as f:
        json.dump({"machine": m, "figures": figs}, f, indent=1)

    count = {k: sum(1 for r in rows if r["outcome"] == k) for k in ("agree", "disagree", "not checked")}
    lines = [f"# Device check: {m['gpu']}, driver {m['driver']}, CUDA {m['cuda']}", "",
             f"Wall time {a.seconds} s. Step exit codes: "
             + ", ".join(f"{k} {v}" for k, v in steps.items()), "",
             "## Device check (hardware against the simulator)", ""]
    lines += [f"- {'ok' if c['ok'] else 'FAIL'} {c['name']}: {c.get('detail', '')}" for c in checks] or ["- (no results)"]
    lines += ["", "## Conformance rows on the real driver", "",
              f"{count['agree']} agree, {count['disagree']} disagree, {count['not checked']} not checked "
              "on one GPU (rows.tsv has each with its reason).", ""]
    lines += [f"- {r['row']} {r['outcome']}: {r['test']} {r['detail']}" for r in rows if r["outcome"] == "disagree"]
    lines += ["", "## Figures", ""] + [f"- {k}: {v}" for k, v in figs.items()]
    lines += ["", "## End to end (tail)", "", "```", e2e_tail.rstrip(), "```", ""]
    with open(os.path.join(a.out, "summary.md"), "w") as f:
        f.write("\n".join(lines))
    print(f"device report: {os.path.join(a.out, 'summary.md')}: {len(checks)} checks, {len(rows)} conformance "
          f"rows ({count['agree']} agree, {count['disagree']} disagree, {count['not checked']} not checked)")
    return 1 if count["disagree"] or any(not c["ok"] for c in checks) else 0


if __name__ == "__main__":
    sys.exit(main())
