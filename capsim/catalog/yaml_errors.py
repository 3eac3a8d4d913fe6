"""Where in a YAML or JSON file a problem is: parser errors as one line with the line and
column, and a schema error's field traced back to the line that holds it (issue 47: "file:
line: field: problem", never the parser's multi-line '<unicode string>' report)."""

from __future__ import annotations

from collections.abc import Callable

MAX_LOCATED_CHARS = 2**20
"""Longest text whose nodes are composed again to find a field's line (libyaml: about 0.1 s
a MB); a longer file's schema errors are reported without lines."""


def one_line_yaml_error(exc: Exception) -> str:
    """A PyYAML error as one line: 'line L, column C: problem (while CONTEXT from line L0)'.
    Lines and columns count from 1, as editors do."""
    if hasattr(exc, "reason") and hasattr(exc, "position"):  # the reader: a bad character
        char = exc.character
        code = char if isinstance(char, int) else ord(char) if char else 0
        return f"character {exc.position + 1} (U+{code:04X}): {exc.reason}"
    problem = getattr(exc, "problem", None)
    mark = getattr(exc, "problem_mark", None)
    if problem is None or mark is None:
        return " ".join(str(exc).split()).replace('in "<unicode string>", ', "")
    where = f"line {mark.line + 1}, column {mark.column + 1}: {problem}"
    context, context_mark = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if context:
        since = f" from line {context_mark.line + 1}" if context_mark is not None else ""
        where += f" ({context}{since})"
    return where


def field_lines(text: str | None) -> Callable[[tuple], int | None]:
    """A function giving the 1-based line of the value at a pydantic error location (keys
    and list indices) in the YAML or JSON ``text``; for a key that is missing, the line of
    the mapping that lacks it. The text is composed once, however many fields are placed;
    the function gives None everywhere when there is no text or it cannot be composed (or
    is too long to)."""
    root = _compose(text) if text is not None and len(text) <= MAX_LOCATED_CHARS else None
    if root is None:
        return lambda loc: None
    import yaml

    def line_of(loc: tuple) -> int:
        node, line = root, root.start_mark.line + 1
        for part in loc:
            child = None
            if isinstance(node, yaml.MappingNode):
                for key, value in node.value:
                    if str(getattr(key, "value", None)) == str(part):
                        child = value
                        line = key.start_mark.line + 1
                        break
            elif (
                isinstance(node, yaml.SequenceNode)
                and isinstance(part, int)
                and 0 <= part < len(node.value)
            ):
                child = node.value[part]
                line = child.start_mark.line + 1
            if child is None:
                return line
            node = child
        return line

    return line_of


def _compose(text: str):
    """The YAML node tree of ``text`` (libyaml's where PyYAML has it), or None."""
    import yaml

    try:
        return yaml.compose(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except (yaml.YAMLError, ValueError, RecursionError):
        return None
