"""A griffe extension for the API reference, which changes how docstrings
and signatures are shown, not the code:
- doctest examples (`>>>` lines and their expected output, up to the next
  blank line) become Python console code blocks, not Markdown (where
  `['loss']` would be a reference link);
- a "Call arguments:" section (the layers' docstrings, as Keras writes
  them) becomes a list of its entries, not one run-on paragraph;
- a config field declared with the package's own `field(default, check)`
  (the models' configs, keras_attn.models._config) or `field(default,
  description=...)` (the zoo's recipe sections, keras_attn.zoo.schema) shows
  its default as a value: `BertConfig(vocabulary_size=30522, ...)`, not
  `vocabulary_size=field(30522, positive_int)`;
- a default that names a module constant holding a literal or a tuple of
  literals (the builders' `config=DEFAULT_PRESET`) shows the literal:
  `build_bert(config="bert_base")`."""

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


# The field helpers whose first argument (or `default=`) is the default.
_FIELD_HELPERS = ("keras_attn.models._config.field", "keras_attn.zoo.schema.field")


def field_default(value, module):
    """The default that `value`, a griffe expression in `module`, declares
    when it is a call of one of the package's field helpers
    (`_FIELD_HELPERS`); None when it is not one (or declares no default).
    The helper is found from the module's imports, not resolved: the
    modules are still being read."""
    if not isinstance(value, griffe.ExprCall) or not isinstance(value.function, griffe.ExprName):
        return None
    name = value.function.name
    path = module.imports.get(name) or f"{module.path}.{name}"
    if path not in _FIELD_HELPERS:
        return None
    for argument in value.arguments:
        if isinstance(argument, griffe.ExprKeyword):
            if argument.name == "default":
                return argument.value
        else:
            return argument  # the first positional argument
    return None


def _functions(obj, seen=None):
    """The functions and methods defined in the modules and classes under
    `obj` (aliases, such as re-exports, are skipped: their targets are
    visited where they are defined)."""
    seen = set() if seen is None else seen
    if obj.path in seen:
        return
    seen.add(obj.path)
    for member in obj.members.values():
        if member.is_alias:
            continue
        if member.is_function:
            yield member
        elif member.is_module or member.is_class:
            yield from _functions(member, seen)


def _constant_literal(default, pkg):
    """The literal (a string, a number or a tuple of them) that `default`
    names when it is the name of a module constant of the package; else
    None."""
    if not isinstance(default, griffe.ExprName):
        return None
    try:
        target = pkg.modules_collection.get_member(default.canonical_path)
        while target.is_alias:
            target = target.final_target
    except Exception:  # noqa: BLE001  (an unresolvable name: shown as written)
        return None
    if not target.is_attribute:
        return None
    value = target.value
    if isinstance(value, griffe.ExprTuple):  # a tuple of literals: ("query", "value")
        elements = [_literal(element) for element in value.elements]
        if not elements or None in elements:
            return None
        return f"({', '.join(elements)}{',' if len(elements) == 1 else ''})"
    return _literal(value)


def _literal(value):
    """`value` (griffe's text of an expression) when it is a string or number
    literal, a string in double quotes (as the rest of a signature shows
    them); else None."""
    if not isinstance(value, str):
        return None
    if value[:1] == "'" and value[-1:] == "'" and '"' not in value:
        value = f'"{value[1:-1]}"'
    if value[:1] in "\"'" or value.replace(".", "", 1).lstrip("-").isdigit():
        return value
    return None


class DoctestBlocks(griffe.Extension):
    def on_attribute_instance(self, *, attr, **kwargs):
        # Runs as each attribute is read, before griffe's dataclasses
        # extension makes `__init__` from the fields (on the whole package):
        # the signature then takes the plain default.
        default = field_default(attr.value, attr.module)
        if default is not None:
            attr.value = default

    def on_package(self, *, pkg, **kwargs):
        # Once every module is read, so that names resolve.
        for function in _functions(pkg):
            for parameter in function.parameters:
                literal = _constant_literal(parameter.default, pkg)
                if literal is not None:
                    parameter.default = literal

    def on_object(self, *, obj, **kwargs):
        if obj.docstring is None:
            return
        text = obj.docstring.value
        if ">>> " in text:
            text = fence_doctests(text)
        if "Call arguments:" in text:
            text = list_call_arguments(text)
        obj.docstring.value = text
