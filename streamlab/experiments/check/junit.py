"""The check report as JUnit XML: one testcase per check, a failing check's
evidence as the failure message, an n/a check as skipped with why; CI systems
(GitLab, Jenkins, GitHub's test reporters) read it as they read pytest's."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from streamlab.experiments.check.verdict import evidence, fix, verdict
from streamlab.experiments.report import Report


def junit_xml(report: Report) -> str:
    cases = report.parts
    suite = ET.Element("testsuite", {
        "name": f"streamlab check {report.variant}".strip(),
        "tests": str(len(cases)),
        "failures": str(sum(verdict(p) == "fail" for p in cases)),
        "errors": str(sum(verdict(p) == "error" for p in cases)),
        "skipped": str(sum(verdict(p) == "n/a" for p in cases)),
    })
    for part in cases:
        case = ET.SubElement(suite, "testcase", {"classname": "streamlab.check",
                                                 "name": part.variant})
        shown = verdict(part)
        if shown == "fail":
            failure = ET.SubElement(case, "failure", {"message": evidence(part)})
            failure.text = "\n".join(filter(None, [evidence(part), fix(part),
                                                   f"figures: {part.figures}"]))
        elif shown == "error":
            ET.SubElement(case, "error", {"message": part.reason})
        elif shown == "n/a":
            ET.SubElement(case, "skipped", {"message": part.reason})
        if part.figures:
            ET.SubElement(case, "system-out").text = "\n".join(
                f"{name} = {value}" for name, value in part.figures.items())
    root = ET.Element("testsuites")
    root.append(suite)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"
