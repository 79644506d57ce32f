#!/usr/bin/env python3
"""Write docs/variables.md, the variables reference, from every roles/*/meta/argument_specs.yml.

The argument specs are the one place each variable is documented (ansible-core checks them when a role runs);
this page is generated from them and tests/unit/test_docs.py fails when it is not current.
  python scripts/variables_reference.py           write docs/variables.md
  python scripts/variables_reference.py --check   exit 1 when docs/variables.md differs from a fresh generation
"""

import argparse
import glob
import os
import re
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUTPUT = os.path.join("docs", "variables.md")
COMMAND = "python scripts/variables_reference.py"
# Keys of an option this page renders; another key fails the generation instead of being dropped.
OPTION_KEYS = {"type", "elements", "default", "choices", "required", "no_log", "description", "options", "aliases",
               "version_added"}
# Ansible's documentation markup (ansible-doc): C(code), I(italic / option), O(option), V(value), RV(return value),
# B(bold), M(module), E(environment variable), P(plugin), U(url), L(text, url), HORIZONTALLINE.
MARKUP = re.compile(r"(?<![\w])(?:(RV|[CIOVBMEPU])\(([^)]*)\)|L\(([^,)]*),\s*([^)]*)\)|HORIZONTALLINE)")
PLAIN_SPECIAL = re.compile(r"([\\`*\[\]<]|(?<!\w)_|_(?!\w))")


def load_specs(root):
    """[(role, {entry point: spec})] for every role with an argument spec, sorted by role name."""
    specs = []
    for path in sorted(glob.glob(os.path.join(root, "roles", "*", "meta", "argument_specs.yml"))):
        with open(path, encoding="utf-8") as handle:
            data = yaml.safe_load(handle) or {}
        role = os.path.basename(os.path.dirname(os.path.dirname(path)))
        entry_points = data.get("argument_specs") or {}
        if "main" not in entry_points:
            raise ValueError(f"{path}: no main entry point")
        specs.append((role, entry_points))
    return specs


def ordered_entry_points(entry_points):
    """main first, then the others in the file's order."""
    return ["main"] + [name for name in entry_points if name != "main"]


def paragraphs(description):
    """A description (string or list of strings) as a list of paragraphs, whitespace collapsed."""
    items = description if isinstance(description, list) else [description or ""]
    return [" ".join(str(item).split()) for item in items if str(item).strip()]


def plain(text, known, current):
    """Markdown for text outside markup: special characters escaped, variable names linked."""
    out = []
    for word in re.split(r"(\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b)", text):
        if word in known and word != current:
            out.append(f"[`{word}`](#{word})")
        elif word == current:
            out.append(f"`{word}`")
        else:
            out.append(PLAIN_SPECIAL.sub(r"\\\1", word))
    return "".join(out)


def code(text):
    """An inline code span holding TEXT (longer fences when it holds backticks)."""
    fence = "``" if "`" in text else "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def variable_link(text, known, current):
    """TEXT as a link to the variable it names (name, name=value or name.key), or None."""
    name = re.split(r"[=.\s]", text, maxsplit=1)[0]
    if name in known and name != current:
        return f"[{code(text)}](#{name})"
    return None


def markdown(text, known, current=None):
    """Ansible markup in TEXT rendered as Markdown; names of variables in KNOWN link to their entries."""
    out, last = [], 0
    for match in MARKUP.finditer(text):
        out.append(plain(text[last:match.start()], known, current))
        last = match.end()
        kind, value, label, url = match.groups()
        if match.group(0) == "HORIZONTALLINE":
            out.append("\n\n---\n\n")
        elif label is not None:
            out.append(f"[{plain(label, set(), None)}]({url.strip()})")
        elif kind == "U":
            out.append(f"<{value}>")
        elif kind in ("I", "O"):
            out.append(variable_link(value, known, current) or
                       (code(value) if kind == "O" else f"*{plain(value, set(), None)}*"))
        elif kind == "B":
            out.append(f"**{plain(value, set(), None)}**")
        else:  # C, V, RV, M, E, P: code, a link when C() names a variable
            out.append((kind == "C" and variable_link(value, known, current)) or code(value))
    out.append(plain(text[last:], known, current))
    result = "".join(out)
    # A paragraph that would start a list, heading or quote stays a paragraph.
    return re.sub(r"^([-+#>]|\d+[.)])(?=\s)", r"\\\1", result)


def value(data, nested=False):
    """A default or choice as it would be written in YAML's flow style."""
    if data is None:
        return "null"
    if isinstance(data, bool):
        return "true" if data else "false"
    if isinstance(data, (int, float)):
        return str(data)
    if isinstance(data, list):
        return "[" + ", ".join(value(item, True) for item in data) + "]"
    if isinstance(data, dict):
        return "{" + ", ".join(f"{value(key, True)}: {value(item, True)}" for key, item in data.items()) + "}"
    text = str(data)
    if text == "" or (nested and not re.fullmatch(r"[\w./@%+=-][\w./@%+=:-]*", text)):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


def role_defaults(root, role):
    """The variables set in roles/ROLE/defaults/main.yml (their values are often templates)."""
    path = os.path.join(root, "roles", role, "defaults", "main.yml")
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as handle:
        return yaml.safe_load(handle) or {}


def facts(name, spec, role, defaults):
    """The line under an option's heading: type, default, choices, required, no_log. DEFAULTS: the variables the
    role's defaults/main.yml sets, where a default the spec leaves out is computed."""
    kind = spec.get("type", "str")
    if spec.get("elements"):
        kind = f"{kind} of {spec['elements']}"
    parts = [f"type: `{kind}`"]
    if spec.get("required"):
        parts.append("**required**")
    if "default" in spec:
        parts.append(f"default: {code(value(spec['default']))}")
    elif name in defaults:
        parts.append(f"default: computed in [roles/{role}/defaults/main.yml](../roles/{role}/defaults/main.yml)")
    else:
        parts.append("default: none")
    if spec.get("choices") is not None:
        parts.append("choices: " + ", ".join(code(value(choice, True)) for choice in spec["choices"]))
    if spec.get("aliases"):
        parts.append("aliases: " + ", ".join(code(alias) for alias in spec["aliases"]))
    if spec.get("no_log"):
        parts.append("secret: never logged (`no_log`)")
    if spec.get("version_added"):
        parts.append(f"added in {spec['version_added']}")
    return " · ".join(parts)


def option_lines(name, spec, known, role, defaults, where, level="###"):
    """The Markdown of one option: heading, facts, description (and suboptions)."""
    unknown = set(spec) - OPTION_KEYS
    if unknown:
        raise ValueError(f"{where}: option {name} has keys this page does not render: {sorted(unknown)}")
    texts = paragraphs(spec.get("description"))
    if not texts:
        raise ValueError(f"{where}: option {name} has no description")
    lines = [f"{level} {name}", "", facts(name, spec, role, defaults), ""]
    for text in texts:
        lines += [markdown(text, known, name), ""]
    for sub_name, sub_spec in (spec.get("options") or {}).items():
        sub_texts = paragraphs(sub_spec.get("description"))
        if not sub_texts:
            raise ValueError(f"{where}: suboption {name}.{sub_name} has no description")
        lines.append(f"- `{sub_name}` ({facts(sub_name, sub_spec, role, ())}): " + " ".join(markdown(t, known, name) for t in sub_texts))
    if spec.get("options"):
        lines.append("")
    return lines


def role_section(role, entry_points, known, defaults):
    """The Markdown of one role: its description, a table of its variables, one entry per variable, other entry
    points."""
    where = f"roles/{role}/meta/argument_specs.yml"
    main = entry_points["main"] or {}
    main_options = main.get("options") or {}
    others = [name for name in ordered_entry_points(entry_points) if name != "main"]
    lines = [f"## {role}", ""]
    if main.get("short_description"):
        lines += [f"**{markdown(main['short_description'].strip(), known)}**", ""]
    for text in paragraphs(main.get("description")):
        lines += [markdown(text, known), ""]
    source = f"Source: [{where}](../{where})"
    if others:
        source += "; entry points besides `main`: " + ", ".join(
            f"[`{name}`](#{role}-tasks_from-{name})" for name in others)
    lines += [source, ""]
    if main_options:
        lines += ["| variable | type | default |", "|---|---|---|"]
        for name, spec in main_options.items():
            kind = spec.get("type", "str") + (f" of {spec['elements']}" if spec.get("elements") else "")
            default = code(value(spec["default"])) if "default" in spec else (
                "computed" if name in defaults else "")
            lines.append(f"| [{name}](#{name}) | {kind} | {default.replace('|', chr(92) + '|')} |")
        lines.append("")
    else:
        lines += ["The `main` entry point takes no variables.", ""]
    for name, spec in main_options.items():
        lines += option_lines(name, spec or {}, known, role, defaults, where)
    for entry in others:
        spec = entry_points[entry] or {}
        lines += [f"### {role}: tasks_from {entry}", ""]
        lines += [f"`include_role: {{name: {role}, tasks_from: {entry}}}`", ""]
        if spec.get("short_description"):
            lines += [markdown(spec["short_description"].strip(), known), ""]
        for text in paragraphs(spec.get("description")):
            lines += [markdown(text, known), ""]
        options = spec.get("options") or {}
        if not options:
            lines += ["Takes no variables.", ""]
        elif options == main_options:
            lines += ["Takes the same variables as `main`, above.", ""]
        else:
            shared = [name for name, item in options.items() if main_options.get(name) == item]
            if shared:
                lines += ["Takes " + ", ".join(f"[`{name}`](#{name})" for name in shared) + " as `main` does.", ""]
            for name, item in options.items():
                if name not in shared:
                    lines += option_lines(name, item or {}, known, role, defaults, f"{where} ({entry})", level="####")
    return lines


def render(root=ROOT):
    """The text of docs/variables.md for the argument specs under ROOT."""
    specs = load_specs(root)
    known = {name for _, entry_points in specs for spec in entry_points.values()
             for name in ((spec or {}).get("options") or {})}
    lines = [
        "# Variables reference",
        "",
        f"<!-- Generated by `{COMMAND}` from roles/*/meta/argument_specs.yml: edit those, then run it again. -->",
        "",
        "Every variable of every role, from the roles' argument specs (`roles/<role>/meta/argument_specs.yml`),",
        "the one place each is documented. ansible-core checks a role's variables against its spec when the role",
        "runs, and `site.yml` checks every host's variables before it changes anything (`playbooks/preflight.yml`).",
        f"This page is generated: edit the spec, then run `{COMMAND}`; the unit tests fail while it is not current.",
        "",
        "Set variables in the inventory (`group_vars/`, `host_vars/`) or with `-e` on the command line.",
        "`site.yml`'s own switches (`llmtune_serial`, `llmtune_max_fail_percentage`, `llmtune_on_failure`,",
        "`llmtune_autotune`) belong to no role: see [Fleet rollouts](fleets.md#play-variables).",
        "",
        f"{len(known)} variables in {len(specs)} roles:",
        "",
    ]
    for role, entry_points in specs:
        short = (entry_points["main"] or {}).get("short_description", "").strip()
        lines.append(f"- [{role}](#{role}): {markdown(short, known)}")
    lines.append("")
    for role, entry_points in specs:
        lines += role_section(role, entry_points, known, role_defaults(root, role))
    while lines and lines[-1] == "":
        lines.pop()
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help=f"exit 1 when {OUTPUT} is not current")
    args = parser.parse_args(argv)
    text = render(ROOT)
    path = os.path.join(ROOT, OUTPUT)
    if args.check:
        try:
            with open(path, encoding="utf-8") as handle:
                current = handle.read() == text
        except FileNotFoundError:
            current = False
        if not current:
            print(f"{OUTPUT} is not current: run `{COMMAND}`", file=sys.stderr)
            return 1
        return 0
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
    print(f"wrote {OUTPUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
