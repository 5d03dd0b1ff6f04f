"""A griffe extension for the API reference, which changes how docstrings
are shown, not the docstrings:
- doctest examples (`>>>` lines and their expected output, up to the next
  blank line) become Python console code blocks, not Markdown (where
  `['loss']` would be a reference link);
- a "Call arguments:" section (the layers' docstrings, as Keras writes
  them) becomes a list of its entries, not one run-on paragraph."""

import re

import griffe

_PROMPT = re.compile(r"^(\s*)>>> ")


def fence_doctests(text):
    """`text` with each run of doctest lines inside a ```pycon fence."""
    lines, out, index = text.splitlines(), [], 0
    in_fence = False
    while index < len(lines):
        line = lines[index]
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
        match = None if in_fence else _PROMPT.match(line)
        if not match:
            out.append(line)
            index += 1
            continue
        indent = match[1]
        out.append(f"{indent}```pycon")
        while index < len(lines) and lines[index].strip():
            out.append(lines[index])
            index += 1
        out.append(f"{indent}```")
    return "\n".join(out)


_ENTRY = re.compile(r"^(\s*)(\*{0,2}[A-Za-z_][\w, *]*):(\s|$)")


def list_call_arguments(text):
    """`text` with each entry of its "Call arguments:" section a list item."""
    out, section_indent = [], None
    for line in text.splitlines():
        indent = len(line) - len(line.lstrip())
        if line.strip() == "Call arguments:":
            section_indent, entry_indent = indent, None
            out += [line.replace("Call arguments:", "**Call arguments:**"), ""]
            continue
        if section_indent is not None and line.strip() and indent <= section_indent:
            section_indent = None
        if section_indent is not None and line.strip():
            match = _ENTRY.match(line)
            if entry_indent is None and match:
                entry_indent = indent
            if match and indent == entry_indent:
                line = f"- `{match[2]}`:{line[match.end(2) + 1:]}"
            else:
                line = "  " + line.lstrip()
        elif section_indent is not None:
            line = ""
        out.append(line)
    return "\n".join(out)


class DoctestBlocks(griffe.Extension):
    def on_object(self, *, obj, **kwargs):
        if obj.docstring is None:
            return
        text = obj.docstring.value
        if ">>> " in text:
            text = fence_doctests(text)
        if "Call arguments:" in text:
            text = list_call_arguments(text)
        obj.docstring.value = text
