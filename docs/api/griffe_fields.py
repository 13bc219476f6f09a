"""griffe extensions for ember's API reference (loaded by mkdocs.yml).

``FieldsAsInit``: the ``__init__`` of ember's Modules and Configs, from their fields.
griffe reads the source without running it, so it cannot see the ``__init__`` that
``Module.__init_subclass__`` generates (a dataclass) or that pydantic gives a ``Config``.
Their docstrings document the fields under ``Args:``, which griffe would report as
parameters missing from the signature. This extension gives each such class the
signature it has at run time: its annotated public fields, the base classes' first.

``SphinxToMarkdown``: ember's docstrings are Google style with the Sphinx roles and the
``Example:`` heading that ``help()`` and doctest read well. mkdocstrings renders Markdown:
a role becomes inline code, and ``Example:`` becomes ``Examples:``, the heading griffe
parses as doctest code (as text, ``[[0, 1]]`` in an output line reads as a Markdown link).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

# The bases whose subclasses take their fields as __init__ arguments.
FIELD_BASES = {"ember.module.module.Module", "ember.config.base.Config"}


class FieldsAsInit(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        if pkg.name == "ember":
            for cls in _classes(pkg):
                _add_init(cls)


def _classes(obj: griffe.Object) -> list[griffe.Class]:
    found = []
    for member in obj.members.values():
        if member.is_alias:
            continue
        if isinstance(member, griffe.Class):
            found.append(member)
        if isinstance(member, griffe.Module | griffe.Class):
            found.extend(_classes(member))
    return found


def _add_init(cls: griffe.Class) -> None:
    try:
        mro = [cls, *cls.mro()]
    except (ValueError, griffe.AliasResolutionError, griffe.CyclicAliasError):
        return  # a base outside what griffe loaded: leave the class as griffe sees it
    if cls.path in FIELD_BASES or not FIELD_BASES & {c.path for c in mro}:
        return
    # a class (below the field base) that writes its own __init__ keeps it
    for base in mro:
        if base.path in FIELD_BASES:
            break
        init = base.members.get("__init__")
        if init is not None and "generated" not in init.labels:
            return
    parameters: dict[str, griffe.Parameter] = {}
    for base in reversed(mro):
        for name, member in base.members.items():
            if (
                member.is_alias
                or not isinstance(member, griffe.Attribute)
                or member.annotation is None
                or name.startswith("_")
                or "property" in member.labels
            ):
                continue
            parameters[name] = griffe.Parameter(
                name,
                annotation=member.annotation,
                kind=griffe.ParameterKind.positional_or_keyword,
                default=member.value,
            )
    init = griffe.Function(
        "__init__",
        lineno=cls.lineno,
        endlineno=cls.lineno,
        parameters=griffe.Parameters(
            griffe.Parameter("self", kind=griffe.ParameterKind.positional_or_keyword),
            *parameters.values(),
        ),
        returns="None",
    )
    init.labels.add("generated")
    cls.set_member("__init__", init)


_ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|exc|obj|const):`(~?)([^`]+)`")
_EXAMPLE_HEADING = re.compile(r"^(\s*)Example:\s*$", re.MULTILINE)


class SphinxToMarkdown(griffe.Extension):
    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            text = _ROLE.sub(_role_as_code, obj.docstring.value)
            obj.docstring.value = _EXAMPLE_HEADING.sub(r"\1Examples:", text)


def _role_as_code(match: re.Match[str]) -> str:
    """``:class:`~a.b.C``` as `` `C` `` (Sphinx's ``~`` shows the last name), else the target."""
    tilde, target = match.groups()
    return f"`{target.rsplit('.', 1)[-1] if tilde else target}`"
