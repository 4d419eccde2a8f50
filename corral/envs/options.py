"""Option records given as a dict (``env.pixels``, ``env.atari_wrappers``): one reader, so an
unknown key is refused the same way everywhere, with the nearest option or the list of them."""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any

from corral.errors import UserError


def options_from_dict(cls: Any, value: dict, what: str) -> Any:
    """``cls(**value)`` for a dataclass ``cls``, refusing a key it has no field for: ``unknown
    {what} 'key'; did you mean ...?`` (or the options' names when none is close)."""
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = [k for k in value if k not in names]
    if unknown:
        close = difflib.get_close_matches(unknown[0], names, n=1)
        hint = f"; did you mean {close[0]}?" if close else f"; options: {', '.join(names)}"
        raise UserError(f"unknown {what} {unknown[0]!r}{hint}")
    return cls(**value)
