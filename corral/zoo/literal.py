"""A restricted literal parser for rl-zoo's ``policy_kwargs`` and ``normalize`` strings, and its
schedule values (``lin_0.001``): nothing is ever ``eval``-ed (:mod:`corral.zoo`)."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any

from corral.errors import UserError


@dataclass(frozen=True)
class Name:
    """A whitelisted name in a parsed expression (``nn.ReLU``), kept as text: it maps to a
    corral setting (activation: relu) or is refused with a reason; it is never imported."""

    name: str

    def __repr__(self) -> str:
        return self.name


# Written forms -> the canonical name. Activations, plus the optimizer rl-zoo's A2C Atari entry names.
_ACTIVATIONS = ("ReLU", "Tanh", "ELU", "SiLU", "GELU", "LeakyReLU", "Sigmoid", "Softplus", "Mish", "Identity")
ALLOWED_NAMES: dict[str, str] = {}
for _act in _ACTIVATIONS:
    for _prefix in ("nn.", "th.nn.", "torch.nn."):
        ALLOWED_NAMES[_prefix + _act] = "nn." + _act
for _opt in ("Adam", "AdamW", "RMSprop", "SGD"):
    for _prefix in ("th.optim.", "torch.optim.", "optim."):
        ALLOWED_NAMES[_prefix + _opt] = "optim." + _opt
ALLOWED_NAMES["RMSpropTFLike"] = "RMSpropTFLike"


def parse_literal(text: str, what: str = "policy_kwargs") -> Any:
    """Parse ``text`` as a literal: numbers, strings, True/False/None, lists and tuples (as
    lists), ``{...}`` and ``dict(key=value, ...)``, and the names in ``ALLOWED_NAMES`` (as
    :class:`Name`). Anything else (calls other than ``dict``, attribute access outside the
    whitelist, operators, comprehensions, ``__import__('os')``) raises a ``UserError``."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as e:
        raise UserError(f"{what}: {text!r} is not a Python expression ({e.msg})") from None
    return _literal(tree.body, what, text)


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _literal(node: ast.AST, what: str, text: str) -> Any:
    def refuse(part: str) -> UserError:
        return UserError(f"{what}: {part} is not allowed in {text!r}; corral reads only literals, dict(...), "
                         "lists and the names nn.ReLU, nn.Tanh, nn.ELU, nn.SiLU, ... (nothing is evaluated)")

    if isinstance(node, ast.Constant):
        if isinstance(node.value, (int, float, str, bool)) or node.value is None:
            return node.value
        raise refuse(repr(node.value))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)) \
            and isinstance(node.operand, ast.Constant) and isinstance(node.operand.value, (int, float)) \
            and not isinstance(node.operand.value, bool):
        return -node.operand.value if isinstance(node.op, ast.USub) else node.operand.value
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_literal(e, what, text) for e in node.elts]
    if isinstance(node, ast.Dict):
        out = {}
        for k, v in zip(node.keys, node.values):
            if k is None:
                raise refuse("'**' unpacking")
            key = _literal(k, what, text)
            if not isinstance(key, str):
                raise refuse(f"the key {key!r}")
            out[key] = _literal(v, what, text)
        return out
    if isinstance(node, ast.Call):
        if not (isinstance(node.func, ast.Name) and node.func.id == "dict"):
            raise refuse(f"the call {ast.unparse(node.func)}(...)")
        if node.args or any(kw.arg is None for kw in node.keywords):
            raise refuse("dict(...) with positional or '**' arguments")
        return {kw.arg: _literal(kw.value, what, text) for kw in node.keywords}
    if isinstance(node, (ast.Name, ast.Attribute)):
        name = _dotted(node)
        if name in ("True", "False", "None"):  # pragma: no cover (Constants since Python 3.8)
            return {"True": True, "False": False, "None": None}[name]
        if name is not None and name in ALLOWED_NAMES:
            return Name(ALLOWED_NAMES[name])
        raise refuse(f"the name {ast.unparse(node)}")
    raise refuse(f"the expression {ast.unparse(node)!r}")


def parse_schedule(value: Any, key: str) -> tuple[str, float]:
    """rl-zoo's schedule values: a number (constant) or ``lin_X`` (linear from X to 0 over
    the run, rl-zoo's ``SimpleLinearSchedule``). Returns ``("constant" | "linear", X)``."""
    if isinstance(value, bool):
        raise UserError(f"{key}: expected a number or 'lin_X', got {value!r}")
    if isinstance(value, (int, float)):
        return "constant", float(value)
    if isinstance(value, str):
        kind, sep, number = value.partition("_")
        if kind == "lin" and sep:
            try:
                return "linear", float(number)
            except ValueError:
                pass
        try:
            return "constant", float(value)  # "1e-3" written as a string
        except ValueError:
            pass
    raise UserError(f"{key}: {value!r} is not a schedule corral knows; write a number or 'lin_X' "
                    "(linear from X to 0 over the run)")
