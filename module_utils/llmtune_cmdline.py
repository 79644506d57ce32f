# -*- coding: utf-8 -*-
"""Kernel command line parsing and safe editing of grub defaults files (``/etc/default/grub``).

Two grammars meet here:

* the kernel's: parameters separated by blanks, ``name`` or ``name=value``, double quotes group blanks
  into a value, ``--`` ends the kernel's part (the rest goes to init). Source: ``lib/cmdline.c``
  (``next_arg``), Documentation/admin-guide/kernel-parameters.rst; dashes and underscores in a name are
  equivalent (``kernel/params.c`` ``parameq``);
* POSIX sh, because grub-mkconfig *sources* ``/etc/default/grub`` and then ``/etc/default/grub.d/*.cfg``
  (Debian's ``grub-mkconfig``) and uses ``GRUB_CMDLINE_LINUX`` for every entry and
  ``GRUB_CMDLINE_LINUX_DEFAULT`` for non-recovery entries only (``/etc/grub.d/10_linux``).

Only what can be edited without running a shell is edited: lines that assign the variable with
literal (quoted or unquoted) text, a later one possibly expanding the variable itself. Repeated
assignments are merged into the last one, whose value is what the shell ends with. Anything else raises
:class:`CmdlineError` naming the line.
"""

from __future__ import annotations

import re

GRUB_VARIABLES = ("GRUB_CMDLINE_LINUX", "GRUB_CMDLINE_LINUX_DEFAULT")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Characters that end an unquoted shell word (sh(1) "Token Recognition"): blanks and operators.
_WORD_END = " \t;&|<>()"


class CmdlineError(ValueError):
    """A defaults file or a parameter that cannot be handled safely; the message names the line."""


class ShellWord:
    """One shell word: literal text and ``$NAME`` expansions in order.

    ``parts`` is a list of ``str`` (literal) and ``("var", NAME)`` tuples; ``quote`` is ``'`` or ``"``
    when the whole word is one quoted string, else ``""``; ``end`` is the index after the word;
    ``command`` is True when the word holds a command or arithmetic substitution (``$(..)``, backquotes).
    """

    def __init__(self, parts, quote, end, command):
        self.parts = parts
        self.quote = quote
        self.end = end
        self.command = command

    @property
    def variables(self):
        """Names of the variables this word expands (list of str)."""
        return [part[1] for part in self.parts if isinstance(part, tuple)]

    def expand(self, env):
        """Return the word's value with ``$NAME`` replaced from ``env`` (dict; unset expands to "")."""
        return "".join(env.get(part[1], "") if isinstance(part, tuple) else part for part in self.parts)


def _read_expansion(text, pos, parts):
    """Parse the ``$`` at ``text[pos]``; append to ``parts``; return (new position, is_command)."""
    nxt = text[pos + 1:pos + 2]
    if nxt == "(":
        return pos + 1, True
    if nxt == "{":
        close = text.find("}", pos)
        name = text[pos + 2:close] if close > 0 else ""
        if not _NAME.fullmatch(name):
            raise CmdlineError("unsupported parameter expansion %r" % text[pos:close + 1 or None])
        parts.append(("var", name))
        return close + 1, False
    match = _NAME.match(text, pos + 1)
    if match:
        parts.append(("var", match.group(0)))
        return match.end(), False
    parts.append("$")
    return pos + 1, False


def parse_shell_word(text, pos=0):
    """Parse the POSIX sh word starting at ``text[pos]`` (one line, no newline).

    Handles single quotes, double quotes (where ``\\`` escapes only ``$ ` " \\``), backslash outside
    quotes, ``$NAME``/``${NAME}`` and detects command substitution. Returns a :class:`ShellWord`.
    Raises :class:`CmdlineError` on an unbalanced quote or an expansion other than ``${NAME}``.
    Source: POSIX.1-2017 XCU 2.2 "Quoting" and 2.6 "Word Expansions".
    """
    parts, command, start, i = [], False, pos, pos
    while i < len(text) and text[i] not in _WORD_END:
        char = text[i]
        if char == "'":
            close = text.find("'", i + 1)
            if close < 0:
                raise CmdlineError("unbalanced single quote")
            parts.append(text[i + 1:close])
            i = close + 1
        elif char == '"':
            i += 1
            while True:
                if i >= len(text):
                    raise CmdlineError("unbalanced double quote")
                char = text[i]
                if char == '"':
                    i += 1
                    break
                if char == "\\" and text[i + 1:i + 2] in ("$", "`", '"', "\\"):
                    parts.append(text[i + 1])
                    i += 2
                elif char == "$":
                    i, is_command = _read_expansion(text, i, parts)
                    command = command or is_command
                elif char == "`":
                    command = True
                    i += 1
                else:
                    parts.append(char)
                    i += 1
        elif char == "\\":
            parts.append(text[i + 1:i + 2])
            i += 2
        elif char == "$":
            i, is_command = _read_expansion(text, i, parts)
            command = command or is_command
        elif char == "`":
            command, i = True, i + 1
        else:
            parts.append(char)
            i += 1
    raw = text[start:i]
    quote = raw[0] if len(raw) >= 2 and raw[0] in "'\"" and raw[-1] == raw[0] and raw.count(raw[0]) == 2 else ""
    return ShellWord(parts, quote, i, command)


def quote_shell(value, style='"'):
    """Quote ``value`` (str) for sh, in ``style`` (``'`` or ``"``) when the value allows it."""
    if style == "'" and "'" not in value:
        return "'%s'" % value
    return '"%s"' % re.sub(r'([\\"$`])', r"\\\1", value)


def _assignment_pattern(variable):
    # The "=" right after the exact name keeps GRUB_CMDLINE_LINUX from matching GRUB_CMDLINE_LINUX_DEFAULT.
    return re.compile(r"^(?P<lead>[ \t]*(?:export[ \t]+)?)%s(?P<op>\+?=)" % re.escape(variable))


# A plain assignment line of any variable: ``[export ]NAME=``.
_ANY_ASSIGNMENT = re.compile(r"^[ \t]*(?:export[ \t]+)?[A-Za-z_][A-Za-z0-9_]*=")


class Assignment:
    """One line assigning the edited variable: ``index`` (0-based line), ``start`` (index of the value in
    the line), ``word`` (:class:`ShellWord`), ``where`` (``path:line``) and ``line`` (text, no newline)."""

    def __init__(self, index, start, word, where, line):
        self.index = index
        self.start = start
        self.word = word
        self.where = where
        self.line = line


def _check_assignment(line, where, match, word, variable, first):
    """Raise :class:`CmdlineError` unless the assignment can be evaluated without running a shell.

    Only the first assignment must be literal; a later one may expand the variable itself (the value
    it had), as ``GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX nosmt"`` does.
    """
    prefix = "%s: %s" % (where, line)
    if match.group("op") == "+=":
        raise CmdlineError("%s: '+=' is not plain sh; write one plain assignment" % prefix)
    if word.command:
        raise CmdlineError("%s: the value uses command substitution, it cannot be edited safely" % prefix)
    foreign = [name for name in word.variables if first or name != variable]
    if foreign:
        raise CmdlineError("%s: the value expands $%s, it cannot be edited safely" % (prefix, ", $".join(foreign)))
    rest = line[word.end:].strip()
    if rest and not rest.startswith("#"):
        raise CmdlineError("%s: another command follows the assignment" % prefix)


def _check_between(lines, hits, variable, source):
    """Refuse a merge that would change what the lines between the assignments see.

    ``hits`` are the 0-based indexes of the assignments of ``variable``. Every other line between the
    first and the last must be blank, a comment, or a plain assignment that does not expand
    ``variable``: then the assignments run one after the other at the same level (no
    ``if``/``case``/function in between) and only the next assignment reads an earlier value.
    """
    uses = re.compile(r"\$\{?%s(?![A-Za-z0-9_])" % re.escape(variable))
    for index in range(hits[0] + 1, hits[-1]):
        if index in hits:
            continue
        line = lines[index].rstrip("\r\n")
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        match = _ANY_ASSIGNMENT.match(line)
        plain = False
        if match:
            try:
                word = parse_shell_word(line, match.end())
                rest = line[word.end:].strip()
                plain = not rest or rest.startswith("#")
            except CmdlineError:
                pass
        where = "%s:%d: %s" % (source, index + 1, line)
        if not plain:
            raise CmdlineError("%s: not a plain assignment, between two assignments of %s; merge them by hand"
                               % (where, variable))
        if uses.search(line):
            raise CmdlineError("%s: reads $%s between two of its assignments; merge them by hand" % (where, variable))


def find_assignments(text, variable, source):
    """Locate every assignment of ``variable`` in a defaults file and check they can be merged.

    ``text`` is the whole file (str), ``source`` its path for messages. Returns ``(assignments, value)``:
    the list of :class:`Assignment` in file order (empty when the variable is not assigned) and the value
    the shell ends with (str): each assignment replaces the value, a later one may expand the earlier
    value. Raises :class:`CmdlineError` (message ``source:line: text: reason``) for an assignment that is
    appended to (``+=``), has an unbalanced quote, a command substitution or another variable's expansion,
    or is followed by another command; and for a line between two assignments that is not a plain
    assignment or reads the variable (merging would change what it sees).
    """
    lines = text.splitlines(True)
    pattern = _assignment_pattern(variable)
    found, value = [], ""
    for index, raw in enumerate(lines):
        match = pattern.match(raw)
        if not match:
            continue
        line = raw.rstrip("\r\n")
        where = "%s:%d" % (source, index + 1)
        try:
            word = parse_shell_word(line, match.end())
        except CmdlineError as exc:
            raise CmdlineError("%s: %s: %s" % (where, line, exc))
        _check_assignment(line, where, match, word, variable, not found)
        value = word.expand({variable: value})
        found.append(Assignment(index, match.end(), word, where, line))
    if len(found) > 1:
        _check_between(lines, [assignment.index for assignment in found], variable, source)
    return found, value


def replace_assignment(text, variable, value, source):
    """Return ``text`` with ``variable`` assigned ``value`` (str) on one line.

    The last assignment gets the value, in its quote style when possible; earlier assignments of the
    variable are removed (the last one is what the shell sees). Every other byte is kept. A missing
    assignment is appended as a new line. Raises :class:`CmdlineError` as :func:`find_assignments`.
    """
    found, _ = find_assignments(text, variable, source)
    if not found:
        newline = "" if not text or text.endswith("\n") else "\n"
        return "%s%s%s=%s\n" % (text, newline, variable, quote_shell(value))
    last = found[-1]
    lines = text.splitlines(True)
    line = lines[last.index]
    lines[last.index] = line[:last.start] + quote_shell(value, last.word.quote or '"') + line[last.word.end:]
    for earlier in found[:-1]:
        lines[earlier.index] = ""
    return "".join(lines)


def read_assignment(text, variable, source):
    """Return the value (str) ``variable`` ends with in a defaults file, ``""`` when not assigned."""
    return find_assignments(text, variable, source)[1]


def evaluate_dropins(values, dropins):
    """Apply the assignments of drop-ins to ``values`` as grub-mkconfig's sourcing would.

    ``values`` maps each of :data:`GRUB_VARIABLES` to its value from the main defaults file;
    ``dropins`` is a list of ``(path, text)`` in glob order (``/etc/default/grub.d/*.cfg``). Only plain
    assignments at the start of a line are followed; ``$GRUB_CMDLINE_LINUX``-style expansions use the
    values so far. Returns ``(values, assigned_by)``: the new dict and, per variable, the last drop-in
    that assigned it. A value that needs a command substitution becomes ``None`` (unknown).
    """
    values = dict(values)
    assigned_by = {}
    for path, text in dropins:
        for line in text.splitlines():
            for variable in GRUB_VARIABLES:
                match = _assignment_pattern(variable).match(line)
                if not match:
                    continue
                try:
                    word = parse_shell_word(line, match.end())
                except CmdlineError:
                    word = None
                known = word is not None and not word.command and None not in [
                    values.get(name, "") for name in word.variables]
                value = word.expand(values) if known else None
                if known and match.group("op") == "+=":
                    value = (values.get(variable) or "") + value
                values[variable] = value
                assigned_by[variable] = path
    return values, assigned_by


class Param:
    """One kernel parameter: ``name``, ``value`` (str, quotes removed; ``None`` for a bare flag), ``raw``."""

    def __init__(self, name, value, raw):
        self.name = name
        self.value = value
        self.raw = raw

    @property
    def key(self):
        """Name as the kernel compares it: ``-`` and ``_`` are the same (kernel/params.c parameq)."""
        return param_key(self.name)

    def __repr__(self):
        return "Param(%r)" % self.raw


def param_key(name):
    """Return a parameter name (str) normalised for comparison (``-`` -> ``_``)."""
    return name.replace("-", "_")


def split_kernel_params(text):
    """Split a kernel command line (str) into :class:`Param` objects, as ``lib/cmdline.c`` next_arg does.

    Blanks separate parameters except inside double quotes; the first ``=`` outside quotes splits name
    and value; the quotes around a value are dropped from ``value`` but kept in ``raw``. Parsing stops
    at ``--`` (what follows is for init). Raises :class:`CmdlineError` on an unbalanced double quote.
    """
    params = []
    i, text = 0, text or ""
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            return params
        start, in_quote, equals = i, False, -1
        while i < len(text) and (in_quote or not text[i].isspace()):
            if text[i] == '"':
                in_quote = not in_quote
            elif text[i] == "=" and equals < 0 and not in_quote:
                equals = i
            i += 1
        if in_quote:
            raise CmdlineError("unbalanced double quote in kernel parameters: %s" % text[start:])
        raw = text[start:i]
        if raw == "--":
            return params
        if equals < 0:
            params.append(Param(raw.replace('"', ""), None, raw))
        else:
            value = text[equals + 1:i]
            if len(value) >= 2 and value[0] == value[-1] == '"':
                value = value[1:-1]
            params.append(Param(text[start:equals].replace('"', ""), value, raw))


def format_param(name, value):
    """Format one parameter; ``value`` None gives a bare flag, a value with blanks is double-quoted.

    Raises :class:`CmdlineError` for a name or value the kernel cannot parse back (blanks or ``=`` in the
    name, a double quote or newline anywhere, a YAML boolean instead of a string).
    """
    if not name or re.search(r'[\s="]', name) or name == "--":
        raise CmdlineError("invalid kernel parameter name %r" % (name,))
    if value is None:
        return name
    if isinstance(value, bool):
        raise CmdlineError("value of %s is a boolean (YAML reads on/off/yes/no as booleans); quote it, "
                           "e.g. \"off\"" % name)
    value = str(value)
    if '"' in value or "\n" in value:
        raise CmdlineError("value of %s contains a double quote or newline: %r" % (name, value))
    if re.search(r"\s", value):
        return '%s="%s"' % (name, value)
    return "%s=%s" % (name, value)


def edit_params(params, wanted, remove):
    """Return a new list of :class:`Param` with ``wanted`` set and ``remove`` dropped.

    ``wanted`` maps name -> value (str, int, or None for a bare flag); ``remove`` is a list of names.
    A parameter already present keeps its place (and its exact text when its value is already right);
    its later duplicates are dropped; new parameters are appended in ``wanted`` order. Raises
    :class:`CmdlineError` when a name is both set and removed, or from :func:`format_param`.
    """
    wanted_raw = {param_key(name): format_param(name, value) for name, value in wanted.items()}
    drop = {param_key(name) for name in remove}
    both = drop.intersection(wanted_raw)
    if both:
        raise CmdlineError("parameters both set and removed: %s" % ", ".join(sorted(both)))
    result, seen = [], set()
    for param in params:
        if param.key in drop or param.key in seen:
            continue
        if param.key in wanted_raw:
            seen.add(param.key)
            new = split_kernel_params(wanted_raw[param.key])[0]
            if (new.name, new.value) != (param.name, param.value):
                param = new
        result.append(param)
    result.extend(split_kernel_params(raw)[0] for key, raw in wanted_raw.items() if key not in seen)
    return result


def missing_params(cmdline, wanted, remove):
    """List what a kernel command line (str, e.g. /proc/cmdline) lacks to match ``wanted``/``remove``.

    Returns formatted parameters (``name=value`` or ``name``) that are absent or whose last occurrence has
    another value (the kernel applies each occurrence in turn, so the last one wins), then ``-name`` for
    each name in ``remove`` that is still present. Otherwise the order of ``cmdline`` does not matter.
    """
    present = {param.key: param.value for param in split_kernel_params(cmdline)}
    result = []
    for name, value in wanted.items():
        param = split_kernel_params(format_param(name, value))[0]
        if param.key not in present or present[param.key] != param.value:
            result.append(param.raw)
    result.extend("-%s" % name for name in remove if param_key(name) in present)
    return result


def join_params(params):
    """Join :class:`Param` objects back into one command line string."""
    return " ".join(param.raw for param in params)


# Core parameters with a file of their own: transparent_hugepage= sets the boot default of THP
# "enabled" (Documentation/admin-guide/mm/transhuge.rst).
EFFECT_FILES = {"transparent_hugepage": "/sys/kernel/mm/transparent_hugepage/enabled"}
# kstrtobool words (lib/kstrtox.c) that a bool module parameter accepts; sysfs shows it as Y or N.
_BOOL_WORDS = {"y": "Y", "yes": "Y", "1": "Y", "on": "Y", "n": "N", "no": "N", "0": "N", "off": "N"}


def effect_path(name):
    """Return the file where the kernel reports the value in force of boot parameter ``name``, or None.

    ``module.param`` gives ``/sys/module/<module>/parameters/<param>``: for a built-in module the kernel
    creates it at boot from the command line, whatever the hardware (kernel/params.c
    ``param_sysfs_builtin``; Documentation/ABI/stable/sysfs-module), for a loadable one when it loads.
    A few core parameters have a file of their own (:data:`EFFECT_FILES`). Any other parameter shows only
    in ``/proc/cmdline``: None.
    """
    key = param_key(name)
    if key in EFFECT_FILES:
        return EFFECT_FILES[key]
    module, dot, param = key.partition(".")
    if dot and module and param and "/" not in key:
        return "/sys/module/%s/parameters/%s" % (module, param)
    return None


def same_effect(actual, value):
    """Whether a value read from an effect file (str, bracketed word already taken) is ``value``.

    ``value`` is the parameter's value (str; None for a bare flag, which sets a bool parameter). A bool
    module parameter reads ``Y``/``N`` whatever word set it (kernel/params.c ``param_get_bool``).
    """
    if actual in ("Y", "N"):
        return _BOOL_WORDS.get("1" if value is None else value.lower()) == actual
    return actual == value
