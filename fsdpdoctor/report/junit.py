"""JUnit XML for CI systems: one test case per rule, failing where a finding is at or above the bar."""

from __future__ import annotations

from xml.etree import ElementTree as ET

from fsdpdoctor.results import Analysis, Finding


def to_junit(a: Analysis, failing: list[Finding], rule_ids: list[str]) -> str:
    suite = ET.Element("testsuite", name="fsdpdoctor", tests=str(len(rule_ids)), failures=str(len(failing)))
    by_rule: dict[str, list[Finding]] = {}
    for f in failing:
        by_rule.setdefault(f.id, []).append(f)
    for rid in rule_ids:
        case = ET.SubElement(suite, "testcase", classname="fsdpdoctor." + a.job.wrapping, name=rid)
        for f in by_rule.get(rid, []):
            fail = ET.SubElement(case, "failure", type=f.severity,
                                 message=f"{f.title} ({f.impact_us / 1e3:.1f} ms/step)")
            fail.text = "\n".join([f.summary, *(e.text for e in f.evidence), f"fix: {f.fix}"])
    return ET.tostring(suite, encoding="unicode")
