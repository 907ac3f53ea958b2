"""JUnit XML, the report every CI system reads: one <testsuite> per run, one <testcase> per
rank (`exec`) or generated machine (`sweep --exec`), a <failure> with what failed, why and
the command that replays it. The shape is the one pytest writes for `--junit-xml` (xunit2:
testsuites > testsuite(name, tests, failures, errors, skipped, time) > testcase(classname,
name, time) > failure(message, type)); CI readers accept nothing more exotic.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass

from commsim.util.fileio import write_atomic


@dataclass(frozen=True)
class Case:
    classname: str           # the run: "commsim.exec.rtx4090-8", "commsim.sweep-exec"
    name: str                # the rank / machine
    failure: str | None = None   # one-line message; None: passed
    detail: str = ""         # the failure's text: reason, replay command
    kind: str = "failure"    # the failure's type attribute
    time_s: float = 0.0


def junit_xml(suite: str, cases: list[Case], time_s: float = 0.0) -> str:
    root = ET.Element("testsuites")
    failures = sum(1 for c in cases if c.failure is not None)
    ts = ET.SubElement(root, "testsuite", name=suite, tests=str(len(cases)),
                       failures=str(failures), errors="0", skipped="0", time=f"{time_s:.3f}")
    for c in cases:
        tc = ET.SubElement(ts, "testcase", classname=c.classname, name=c.name,
                           time=f"{c.time_s:.3f}")
        if c.failure is not None:
            f = ET.SubElement(tc, "failure", message=c.failure, type=c.kind)
            f.text = c.detail
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def write_junit(path: str, suite: str, cases: list[Case], time_s: float = 0.0) -> None:
    write_atomic(path, junit_xml(suite, cases, time_s), overwrite=True)
