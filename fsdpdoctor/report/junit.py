"""JUnit XML for CI systems: one test case per rule, failing where a finding is at or above the bar.

Text from the traces (a finding's summary names frames, hosts, files) goes through ``visible_text``:
a control byte is not allowed in XML 1.0 at all, and a CI page shows the message to a person."""

from __future__ import annotations

from xml.etree import ElementTree as ET

from fsdpdoctor.results import Analysis, Finding
from fsdpdoctor.visible_text import visible, visible_lines


def to_junit(a: Analysis, failing: list[Finding], rule_ids: list[str]) -> str:
    suite = ET.Element("testsuite", name="fsdpdoctor", tests=str(len(rule_ids)), failures=str(len(failing)))
    by_rule: dict[str, list[Finding]] = {}
    for f in failing:
        by_rule.setdefault(f.id, []).append(f)
    for rid in rule_ids:
        case = ET.SubElement(suite, "testcase", classname=visible("fsdpdoctor." + a.job.wrapping), name=visible(rid))
        for f in by_rule.get(rid, []):
            fail = ET.SubElement(case, "failure", type=visible(f.severity),
                                 message=visible(f"{f.title} ("
                                                 + ("saving withheld" if f.impact_withheld else
                                                    f"{f.impact_us / 1e3:.1f} ms/step") + ")"))
            fail.text = visible_lines("\n".join([f.summary, *(e.text for e in f.evidence), f"fix: {f.fix}"]))
    return ET.tostring(suite, encoding="unicode")
