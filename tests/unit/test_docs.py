"""The documentation stays true to the code: docs/variables.md is what scripts/variables_reference.py makes of the
roles' argument specs now, every relative link of README.md and docs/*.md reaches a file and heading that exist, and
the README stays a short entry point (its depth lives in docs/)."""

import difflib
import glob
import importlib.util
import os
import re
import urllib.parse

import pytest
from conftest import ROOT, read

REGENERATE = "python scripts/variables_reference.py"
PAGES = ["README.md"] + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))
README_MAX_LINES = 150


def generator():
    spec = importlib.util.spec_from_file_location("variables_reference",
                                                  os.path.join(ROOT, "scripts", "variables_reference.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_variables_reference_is_current():
    path = os.path.join(ROOT, "docs", "variables.md")
    fresh = generator().render(ROOT)
    current = read(path) if os.path.exists(path) else ""
    if current != fresh:
        diff = list(difflib.unified_diff(current.splitlines(), fresh.splitlines(), "docs/variables.md", "generated",
                                         lineterm="", n=1))
        pytest.fail(f"docs/variables.md is not what the argument specs give: run `{REGENERATE}` and commit it.\n"
                    + "\n".join(diff[:40]))


def test_every_role_documents_its_variables_in_an_argument_spec():
    roles = sorted(os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "roles", "*")) if os.path.isdir(p))
    missing = [role for role in roles if not os.path.exists(os.path.join(ROOT, "roles", role, "meta",
                                                                        "argument_specs.yml"))]
    assert not missing, f"roles without meta/argument_specs.yml (the variables reference reads them): {missing}"


# --- links ---

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)
HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"", re.I)


def prose(text):
    """TEXT without fenced code blocks and code spans, where brackets are not links."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slug(heading):
    """GitHub's anchor for a heading: its text lower-cased, punctuation but - and _ dropped, spaces as -."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"[`*]", "", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path):
    """Every anchor a Markdown file has: its headings' (GitHub numbers repeats -1, -2, ...) and <a id> tags."""
    text = FENCE.sub("", read(path))
    seen, found = {}, set()
    for heading in HEADING.findall(text):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found | set(HTML_ANCHOR.findall(text))


def relative_links(page):
    """(target path or '', anchor or '') of every link of PAGE that is not a URL with a scheme."""
    for target in LINK.findall(prose(read(os.path.join(ROOT, page)))):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):
            continue
        path, _, anchor = target.partition("#")
        yield urllib.parse.unquote(path), urllib.parse.unquote(anchor)


@pytest.mark.parametrize("page", PAGES)
def test_every_relative_link_reaches_a_file_and_heading(page):
    broken = []
    for path, anchor in relative_links(page):
        target = os.path.normpath(os.path.join(ROOT, os.path.dirname(page), path)) if path else os.path.join(ROOT,
                                                                                                            page)
        if not os.path.exists(target):
            broken.append(f"{path}: no such file")
        elif anchor and target.endswith(".md") and anchor not in anchors(target):
            broken.append(f"{path}#{anchor}: no such heading in {os.path.relpath(target, ROOT)}")
    assert not broken, f"{page} has broken links: " + "; ".join(broken)


def test_the_link_checker_sees_links_and_anchors():
    # The checker itself: a link in prose counts, one in code does not; anchors follow GitHub's rules.
    assert list(relative_links("docs/README.md")), "docs/README.md links to no page"
    assert slug("`inference_service_port` and C-states: NUMA") == "inference_service_port-and-c-states-numa"
    assert prose("see `[x](missing.md)` and\n```\n[y](missing.md)\n```\n") == "see  and\n\n"


def test_the_readme_stays_short():
    lines = read(os.path.join(ROOT, "README.md")).count("\n")
    assert lines <= README_MAX_LINES, (f"README.md has {lines} lines; it is the entry point (what llmtune does, the two "
                                       f"commands, calling the service, where to read on), at most {README_MAX_LINES}: "
                                       "move depth to a page under docs/")
