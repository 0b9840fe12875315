"""The field listing of a config's docstring, written from each field's `help` (its one documentation)."""

from __future__ import annotations

import dataclasses
import sys
import textwrap
from typing import Literal, get_args, get_origin


def _type_text(cls: type, annotation: str) -> str:
    """The annotation as written, a `Literal` alias shown as its choices (`"truncate" | "drop"`)."""
    module = vars(sys.modules[cls.__module__])
    parts = []
    for part in annotation.split(" | "):
        alias = module.get(part)
        parts += [repr(c) for c in get_args(alias)] if get_origin(alias) is Literal else [part]
    return " | ".join(parts)


def document_fields(cls: type) -> type:
    """Append to `cls.__doc__` one entry per field the class declares (or redeclares), in the order of the dataclass
    (and of `--help`): `name (`type`, defaults to `value`): help`. Decorates a dataclass; changes nothing else."""
    declared = vars(cls).get("__annotations__", {})
    entries = []
    for f in dataclasses.fields(cls):
        if f.name not in declared:
            continue
        default = "a factory" if f.default is dataclasses.MISSING else f"`{f.default!r}`"
        text = f"{f.name} (`{_type_text(cls, declared[f.name])}`, defaults to {default}): "
        text += f.metadata["help"].replace("%%", "%")  # argparse's escape
        entries.append(
            textwrap.fill(text, width=116, initial_indent=" " * 8, subsequent_indent=" " * 12, break_on_hyphens=False)
        )
    heading = "    Fields (each one's `help`, which `--help` shows):"
    cls.__doc__ = (cls.__doc__ or "").rstrip() + "\n\n" + heading + "\n\n" + "\n".join(entries) + "\n"
    return cls
