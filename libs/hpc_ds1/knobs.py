"""Any job's knobs, the constraints between them and the moves over them (pure logic).

A workload declares its knobs as a TOML-like table ``{name: spec}`` (`parse_knobs`):

    block_x = { range = [1, 1024], scale = "pow2" }         # int: 1, 2, 4 ... 1024
    tile = { range = [2, 16], step = 2, default = 8 }       # int: 2, 4 ... 16 (hi inclusive)
    unroll = [1, 2, 4]                                      # a bare list: { values = [...] }
    layout = { values = ["xyz", "zyx"], kind = "ordered" }  # ordered, in the given order
    algo = { values = ["fast", "exact"] }                   # category: strings are unordered
    pad = { kind = "bool" }                                 # bool: false, true

Kinds: "int" (integers, sorted ascending), "ordered" (numbers or strings in the given order;
numbers with a float and no `kind` are sorted ascending), "category" (strings or integers, no
order), "bool". The default is `default`, else the first value.

Constraints are Kernel Tuner's `restrictions`: Python expressions over knob names and the
constants a machine supplies (`cpus`, `gpus`), e.g. ``"block_x * block_y <= 1024"``. Each is
parsed with `ast` against an allowlist (`ACCEPTED`), refused at parse time otherwise, and
compiled once into a function with no builtins; strings may only be compared, and `**` is
bounded. `KnobSpace` enumerates the valid configurations (tuples of values in knob order),
checking each constraint as soon as its last knob is bound, so a hole is cut off at its first
knob, and gives a configuration's neighbours by stable move names.

Enumeration speed (the space of tests/tuning/test_knobs.py's
`test_enumerates_a_kernel_tuner_sized_space`: 8 knobs, 743,424 combinations, 6 constraints,
100,960 valid configurations): `KnobSpace(...).count()` takes 0.13-0.14 s of CPU time
(`time.process_time`, best of 5; 0.17-0.34 s wall beside a CI run) on the 2-CPU development
machine under Python 3.11, against 0.23-0.24 s for the same compiled check over every
combination (`itertools.product`); `neighbours` takes 0.03-0.05 ms a configuration.
"""

from __future__ import annotations

import ast
import copy
import keyword
import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NoReturn

import numpy as np
import numpy.typing as npt

Value = int | float | str | bool
KnobConfig = tuple[Value, ...]  # one configuration: a value per knob, in the space's knob order
KnobKind = Literal["int", "ordered", "category", "bool"]
KINDS: tuple[str, ...] = ("int", "ordered", "category", "bool")
SPEC_KEYS = ("kind", "values", "range", "step", "scale", "default")

MAX_KNOBS = 64
MAX_VALUES = 4096  # values of one knob
MAX_COMBINATIONS = 10_000_000  # (partial) configurations one enumeration may check
MAX_CONSTRAINTS = 256
MAX_CONSTRAINT_CHARS = 1000
MAX_DEPTH = 100  # nesting of a constraint's expression
MAX_EXPONENT = 64  # |b| in a ** b
MAX_POWER_BITS = 4096  # an integer a ** b may have at most this many bits

NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,31}$")  # as a TOML workload's knob name
STRING_VALUE = re.compile(r"^[A-Za-z0-9_.:+\-]{1,64}$")  # goes into command lines, move names
MACHINE_KNOBS = ("ranks", "threads", "gpu")  # supplied by the machine, not by a workload file
PLACEHOLDERS = ("size", "python", "mpiexec", "output")  # a workload command's own placeholders
FUNCTIONS: dict[str, Callable[..., Any]] = {"min": min, "max": max, "abs": abs}
ACCEPTED = (
    "knob and constant names, numbers, strings, true/false (True/False), + - * / // % ** "
    "(on numbers), comparisons (chained too, and `in`/`not in` a tuple or list literal), "
    "and/or/not, `x if condition else y`, min(a, b, ...), max(a, b, ...), abs(x)"
)


class KnobError(ValueError):
    """Knobs or a space that cannot be used; the message names the source, the field and what
    is accepted."""


class ConstraintError(KnobError):
    """A constraint refused at parse time, or one that fails on a configuration."""


class SpaceTooLarge(KnobError):
    """A space with more combinations to check than `MAX_COMBINATIONS`."""


def _fail(source: str, field: str, problem: str, cls: type[KnobError] = KnobError) -> KnobError:
    return cls(f"{source}: {field}: {problem}")


def _key(value: Value) -> tuple[bool, Value]:
    """Equal values of one type: True is not 1 (Python's == says it is)."""
    return (type(value) is bool, value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return _is_int(value) or (isinstance(value, float) and math.isfinite(value))


@dataclass(frozen=True)
class Knob:
    """One knob: its name, kind, values (in order, for the ordered kinds) and default."""

    name: str
    kind: KnobKind
    values: tuple[Value, ...]
    default: Value

    def __post_init__(self) -> None:
        keys = [_key(v) for v in self.values]
        if not keys or len(set(keys)) != len(keys) or _key(self.default) not in keys:
            raise KnobError(
                f"knob {self.name}: needs distinct values and a default among them, not "
                f"values={list(self.values)} default={self.default!r}"
            )
        if self.kind == "int" and list(self.values) != sorted(self.values):  # type: ignore[type-var]
            raise KnobError(f"knob {self.name}: an int knob's values ascend, not {self.values}")

    @property
    def ordered(self) -> bool:
        """Whether its moves step up and down (all kinds but "category")."""
        return self.kind != "category"


def check_name(name: Any, source: str, field: str, reserved: Sequence[str]) -> str:
    """`name` when it may name a knob or a constant, else KnobError saying what is accepted."""
    if (
        not isinstance(name, str)
        or not NAME.match(name)
        or name.startswith("__")
        or keyword.iskeyword(name)
        or keyword.issoftkeyword(name)
        or name in FUNCTIONS
        or name in reserved
    ):
        taken = ", ".join((*FUNCTIONS, *reserved))
        raise _fail(
            source,
            field,
            f"{name!r} is not accepted as a name; accepted: an identifier (a letter or '_', then "
            f"letters, digits, '_'; at most 32; not starting with '__'), not a Python keyword "
            f"and not one of {taken}"
            + ("; the machine supplies ranks, threads and gpu" if name in MACHINE_KNOBS else ""),
        )
    return name


def _int_range(source: str, field: str, spec: Mapping[str, Any]) -> tuple[int, ...]:
    bounds, step, scale = spec["range"], spec.get("step", 1), spec.get("scale", "linear")
    if not (isinstance(bounds, list) and len(bounds) == 2 and all(map(_is_int, bounds))):
        raise _fail(source, f"{field}.range", f"must be [lo, hi], two integers, not {bounds!r}")
    lo, hi = bounds
    if lo > hi:
        raise _fail(source, f"{field}.range", f"{bounds}: lo must be at most hi")
    if scale not in ("linear", "pow2"):
        raise _fail(source, f"{field}.scale", f'{scale!r}; accepted: "linear" or "pow2"')
    if scale == "pow2":
        if "step" in spec:
            raise _fail(source, f"{field}.step", 'is not accepted with scale = "pow2"')
        if lo < 1:
            raise _fail(source, f"{field}.range", f'{bounds}: scale = "pow2" needs lo >= 1')
        values = tuple(1 << p for p in range(hi.bit_length()) if lo <= 1 << p <= hi)
        if not values:
            raise _fail(source, f"{field}.range", f"{bounds} holds no power of two")
        return values
    if not _is_int(step) or step < 1:
        raise _fail(source, f"{field}.step", f"must be an integer >= 1, not {step!r}")
    if (hi - lo) // step + 1 > MAX_VALUES:
        raise _fail(
            source,
            f"{field}.range",
            f"{bounds} with step {step} gives {(hi - lo) // step + 1:,} values; at most "
            f"{MAX_VALUES:,} are accepted",
        )
    return tuple(range(lo, hi + 1, step))


def _values(source: str, field: str, spec: Mapping[str, Any]) -> tuple[KnobKind, tuple[Value, ...]]:
    kind = spec.get("kind")
    if kind is not None and kind not in KINDS:
        raise _fail(source, f"{field}.kind", f"{kind!r}; accepted: {', '.join(KINDS)}")
    if "range" in spec:
        if "values" in spec or kind not in (None, "int"):
            raise _fail(
                source, f"{field}.range", 'gives integers: accepted without values, kind "int"'
            )
        return "int", _int_range(source, field, spec)
    for key in ("step", "scale"):
        if key in spec:
            raise _fail(source, f"{field}.{key}", "is accepted only with range")
    if kind == "bool" and "values" not in spec:
        return "bool", (False, True)
    values = spec.get("values")
    if not isinstance(values, list) or not values:
        raise _fail(
            source,
            f"{field}.values" if "values" in spec else field,
            f"give values = [...], a non-empty list, or range = [lo, hi] (not {values!r}); "
            'or kind = "bool"',
        )
    if len(values) > MAX_VALUES:
        raise _fail(
            source, f"{field}.values", f"{len(values):,} values; at most {MAX_VALUES:,} accepted"
        )
    bad = next((v for v in values if not (_is_number(v) or isinstance(v, str | bool))), None)
    if bad is not None:
        raise _fail(
            source,
            f"{field}.values",
            f"{bad!r} is not accepted; accepted: integers, finite numbers, strings, booleans",
        )
    if len({_key(v) for v in values}) != len(values):
        raise _fail(source, f"{field}.values", f"{values} repeats a value; values are distinct")
    strings = all(isinstance(v, str) for v in values)
    if all(isinstance(v, bool) for v in values):
        accepted: tuple[str, ...] = ("bool",)
    elif all(map(_is_int, values)):
        accepted = ("int", "ordered", "category")
    elif all(map(_is_number, values)):
        accepted = ("ordered",)
    elif strings:
        accepted = ("category", "ordered")
    else:
        raise _fail(
            source,
            f"{field}.values",
            f"{values} mixes types; accepted: all integers, all numbers, all strings or "
            "false and true",
        )
    chosen = kind or accepted[0]
    if chosen not in accepted:
        raise _fail(
            source,
            f"{field}.kind",
            f'"{chosen}" does not take the values {values}; accepted: {", ".join(accepted)}',
        )
    if strings and (bad := next((v for v in values if not STRING_VALUE.match(v)), None)):
        raise _fail(
            source,
            f"{field}.values",
            f"{bad!r} is not accepted; a string value is 1-64 letters, digits, '_', '.', ':', "
            "'+' or '-'",
        )
    if chosen == "bool":  # always false, true; the first listed is the default
        if len(values) != 2:
            raise _fail(source, f"{field}.values", f"{values}; a bool knob takes [false, true]")
        return "bool", (values[0], not values[0])
    if chosen == "int" or (kind is None and chosen == "ordered"):
        values = sorted(values)  # integers, and numbers without a kind: ascending
    return chosen, tuple(values)  # type: ignore[return-value]


def parse_knob(
    name: Any, spec: Any, source: str, reserved: Sequence[str] = (*MACHINE_KNOBS, *PLACEHOLDERS)
) -> Knob:
    """One knob from its TOML-like spec (a table, or a bare list of values)."""
    field = f"knobs.{name}"
    check_name(name, source, field, reserved)
    if isinstance(spec, list):
        spec = {"values": spec}
    if not isinstance(spec, Mapping):
        raise _fail(
            source,
            field,
            f"must be a table ({', '.join(SPEC_KEYS)}) or a list of values, not {spec!r}",
        )
    unknown = sorted(set(spec) - set(SPEC_KEYS))
    if unknown:
        raise _fail(source, field, f"unknown key(s) {unknown}; accepted: {', '.join(SPEC_KEYS)}")
    kind, values = _values(source, field, spec)
    given = spec.get("default", values[0])
    values = (False, True) if kind == "bool" else values
    default = next((v for v in values if _key(v) == _key(given)), None)
    if default is None:
        raise _fail(
            source, f"{field}.default", f"{given!r} is not one of the values {list(values)}"
        )
    return Knob(name, kind, values, default)


def parse_knobs(
    table: Mapping[str, Any],
    source: str,
    reserved: Sequence[str] = (*MACHINE_KNOBS, *PLACEHOLDERS),
) -> list[Knob]:
    """The knobs a TOML-like table `{name: spec}` declares, in its order (KnobError naming
    `source`, the field and what is accepted). `reserved`: names a workload may not take (by
    default the machine's knobs and a command's placeholders)."""
    if not isinstance(table, Mapping):
        raise _fail(
            source, "knobs", f"must be a table of knobs, e.g. [knobs.block_x], not {table!r}"
        )
    if len(table) > MAX_KNOBS:
        raise _fail(source, "knobs", f"declares {len(table)} knobs; at most {MAX_KNOBS} accepted")
    return [parse_knob(name, spec, source, reserved) for name, spec in table.items()]


# --- constraints --------------------------------------------------------------------------

_WORDS = {
    "Attribute": "attribute access",
    "Subscript": "subscript",
    "Lambda": "lambda",
    "ListComp": "comprehension",
    "SetComp": "comprehension",
    "DictComp": "comprehension",
    "GeneratorExp": "comprehension",
    "NamedExpr": "assignment (:=)",
    "JoinedStr": "f-string",
    "Starred": "unpacking",
    "Dict": "dict",
    "Set": "set",
}
_BINOPS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow)
_COMPARE = (ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.In, ast.NotIn)
_POW = "__pow"  # the bounded power; no knob or constant may start with "__"


def _pow(base: Any, exponent: Any) -> Any:
    if abs(exponent) > MAX_EXPONENT:
        raise OverflowError(f"exponent {exponent} exceeds {MAX_EXPONENT}")
    if _is_int(base) and _is_int(exponent) and abs(base).bit_length() * exponent > MAX_POWER_BITS:
        raise OverflowError(f"{base} ** {exponent} exceeds {MAX_POWER_BITS} bits")
    return base**exponent


@dataclass(frozen=True)
class Constraint:
    """One constraint: its text, where it was declared, the knob names it reads (in no order)
    and its checked expression with constants folded in."""

    text: str
    field: str
    names: frozenset[str]
    expression: ast.expr


class _Checker:
    """Walks a parsed constraint: refuses what is not accepted, collects the knob names it
    reads, and infers each part's possible types (strings may only be compared)."""

    def __init__(
        self, text: str, types: Mapping[str, set[type]], refuse: Callable[[str], NoReturn]
    ):
        self.text, self.types, self.refuse, self.names = text, types, refuse, set[str]()

    def part(self, node: ast.AST) -> str:
        return ast.get_source_segment(self.text, node) or ast.unparse(node)

    def numeric(self, node: ast.expr, depth: int, what: str) -> set[type]:
        kinds = self.visit(node, depth)
        if str in kinds:
            self.refuse(f"{self.part(node)!r} may be a string, and {what} takes numbers")
        return kinds

    def visit(self, node: ast.expr, depth: int = 0) -> set[type]:
        if depth > MAX_DEPTH:
            self.refuse(f"it nests deeper than {MAX_DEPTH}")
        d = depth + 1
        if isinstance(node, ast.Constant):
            if type(node.value) not in (int, float, str, bool):
                self.refuse(f"{self.part(node)!r} is not accepted; constants: numbers, strings")
            return {type(node.value)}
        if isinstance(node, ast.Name):
            if node.id not in self.types:
                known = ", ".join(sorted(self.types)) or "none"
                self.refuse(f"unknown name {node.id!r}; the knobs and constants are {known}")
            self.names.add(node.id)
            return self.types[node.id]
        if isinstance(node, ast.BinOp) and isinstance(node.op, _BINOPS):
            left = self.numeric(node.left, d, "arithmetic")
            right = self.numeric(node.right, d, "arithmetic")
            return {float} if isinstance(node.op, ast.Div) else (left | right) - {bool} or {int}
        if isinstance(node, ast.UnaryOp):
            if isinstance(node.op, ast.Not):
                self.visit(node.operand, d)
                return {bool}
            if isinstance(node.op, ast.USub | ast.UAdd):
                return self.numeric(node.operand, d, "a sign") - {bool} or {int}
        if isinstance(node, ast.BoolOp):
            return set().union(*(self.visit(v, d) for v in node.values))
        if isinstance(node, ast.IfExp):
            self.visit(node.test, d)
            return self.visit(node.body, d) | self.visit(node.orelse, d)
        if isinstance(node, ast.Compare) and all(isinstance(o, _COMPARE) for o in node.ops):
            self.visit(node.left, d)
            for op, other in zip(node.ops, node.comparators, strict=True):
                if not isinstance(op, ast.In | ast.NotIn):
                    self.visit(other, d)
                elif isinstance(other, ast.Tuple | ast.List):
                    for element in other.elts:
                        self.visit(element, d)
                else:
                    self.refuse(
                        f"{self.part(other)!r} after `in`; accepted: a tuple or list literal, "
                        "e.g. x in (1, 2, 4)"
                    )
            return {bool}
        if isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else None
            if (
                name not in FUNCTIONS
                or node.keywords
                or any(isinstance(a, ast.Starred) for a in node.args)
                or (len(node.args) != 1 if name == "abs" else len(node.args) < 2)
            ):
                self.refuse(
                    f"the call {self.part(node)!r} is not accepted; calls: min(a, b, ...), "
                    "max(a, b, ...), abs(x), with plain arguments"
                )
            if name == "abs":
                return self.numeric(node.args[0], d, "abs()") - {bool} or {int}
            return set().union(*(self.visit(a, d) for a in node.args))
        what = _WORDS.get(type(node).__name__, type(node).__name__)
        self.refuse(f"{self.part(node)!r} ({what}) is not accepted")
        raise AssertionError  # refuse raises


class _Fold(ast.NodeTransformer):
    """Constants in place of their names, and `a ** b` through the bounded power."""

    def __init__(self, constants: Mapping[str, Value]):
        self.constants = constants

    def visit_Name(self, node: ast.Name) -> ast.expr:
        if node.id in self.constants:
            return ast.copy_location(ast.Constant(self.constants[node.id]), node)
        return node

    def visit_BinOp(self, node: ast.BinOp) -> ast.expr:
        self.generic_visit(node)
        if isinstance(node.op, ast.Pow):
            call = ast.Call(ast.Name(_POW, ast.Load()), [node.left, node.right], [])
            return ast.copy_location(call, node)
        return node


def parse_constraint(
    text: Any,
    knobs: Sequence[Knob],
    constants: Mapping[str, Value],
    source: str,
    field: str = "constraints",
) -> Constraint:
    """A constraint checked against the allowlist (ConstraintError naming `source`, `field`,
    the constraint, the offending part and what is accepted)."""

    def refuse(problem: str) -> NoReturn:
        raise _fail(
            source,
            field,
            f"constraint {text!r}: {problem}; accepted: {ACCEPTED}",
            ConstraintError,
        )

    if not isinstance(text, str) or not text.strip() or len(text) > MAX_CONSTRAINT_CHARS:
        raise _fail(
            source,
            field,
            f"{text!r}: a constraint is a Python expression in a string of 1-"
            f'{MAX_CONSTRAINT_CHARS} characters, e.g. "block_x * block_y <= 1024"',
            ConstraintError,
        )
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as error:
        refuse(f"not a Python expression ({getattr(error, 'msg', error)})")
    types = {k.name: {type(v) for v in k.values} for k in knobs}
    types |= {name: {type(v)} for name, v in constants.items()}
    checker = _Checker(text.strip(), types, refuse)
    checker.visit(tree.body)
    for node in ast.walk(tree.body):  # a power of constants is worked out now: refused now
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
            for part in (node.right, node):
                folded = _Fold(constants).visit(copy.deepcopy(part))
                if _constant(folded):
                    try:
                        value = _compile([ast.fix_missing_locations(folded)], {})(())
                        if part is node.right:
                            _pow(1, value)  # the exponent's bound
                    except Exception as error:
                        refuse(f"{checker.part(part)!r}: {error}")
    folded = ast.fix_missing_locations(_Fold(constants).visit(tree.body))
    names = frozenset(checker.names) - set(constants)
    return Constraint(text.strip(), field, names, folded)


def _constant(node: ast.expr) -> bool:
    """Whether `node` reads no knob (only constants and the bounded power)."""
    return not any(isinstance(n, ast.Name) and n.id != _POW for n in ast.walk(node))


# --- the space ----------------------------------------------------------------------------


class _Index(ast.NodeTransformer):
    """Knob names read from the configuration tuple `c`."""

    def __init__(self, positions: Mapping[str, int]):
        self.positions = positions

    def visit_Name(self, node: ast.Name) -> ast.expr:
        if node.id in self.positions:
            c = ast.Name("c", ast.Load())
            sub = ast.Subscript(c, ast.Constant(self.positions[node.id]), ast.Load())
            return ast.copy_location(sub, node)
        return node


_GLOBALS: dict[str, Any] = {"__builtins__": {}, **FUNCTIONS, _POW: _pow}


def _compile(expressions: Sequence[ast.expr], positions: Mapping[str, int]) -> Callable[..., Any]:
    """`lambda c: e1 and e2 ...` over a configuration tuple `c`, with no builtins."""
    body = [_Index(positions).visit(copy.deepcopy(e)) for e in expressions]
    joined = body[0] if len(body) == 1 else ast.BoolOp(ast.And(), body)
    args = ast.arguments([], [ast.arg("c")], None, [], [], None, [])
    tree = ast.fix_missing_locations(ast.Expression(ast.Lambda(args, joined)))
    function: Callable[..., Any] = eval(compile(tree, "<constraints>", "eval"), dict(_GLOBALS))
    return function


class KnobSpace:
    """The valid configurations of `knobs` under `constraints` (strings or parsed
    `Constraint`s; `constants` such as cpus and gpus are names they may read), and their moves.

    A configuration is a tuple of values in knob order (hashable; `as_dict` and `config`
    convert). Moves, named stably:
    - `name+` / `name-`: an ordered knob (int, ordered, bool) to the next value up / down;
    - `name=value`: a category knob to each other value;
    - `trade:a>b` / `trade:b>a` for each `trades` pair: `a` down and `b` up (or the reverse) at
      the same `a * b`, to the nearest such split (the rank<->thread trade at a fixed core
      count, ranks down and threads up with `trade:ranks>threads`).
    A move jumps over invalid values to the nearest valid one in its direction: a constraint
    such as `x % y == 0` or `block_x * block_y <= 1024` leaves holes inside a knob's values,
    and a move that stopped at a hole would cut the space into pieces one-change walks cannot
    cross; the jump still changes that one knob only. Where no value in the direction is valid
    with the other knobs as they are (`p * q == ranks` locks ranks, p and q alone), the move
    takes the nearest value that is valid with the fewest other knobs changed (`_repaired`).
    A move with no valid value in its direction at all is not a neighbour."""

    def __init__(
        self,
        knobs: Sequence[Knob],
        constraints: Sequence[str | Constraint] = (),
        constants: Mapping[str, Value] | None = None,
        trades: Sequence[tuple[str, str]] = (),
        source: str = "<space>",
    ) -> None:
        self.knobs, self.source = tuple(knobs), source
        self.constants = dict(constants or {})
        self.names = tuple(k.name for k in self.knobs)
        if len(self.knobs) > MAX_KNOBS:
            raise _fail(source, "knobs", f"{len(self.knobs)} knobs; at most {MAX_KNOBS} accepted")
        if len(set(self.names)) != len(self.names):
            raise _fail(source, "knobs", f"{list(self.names)} repeats a name")
        for name, value in self.constants.items():
            check_name(name, source, f"constants.{name}", self.names)
            if not (_is_number(value) or isinstance(value, str | bool)):
                raise _fail(source, f"constants.{name}", f"{value!r}; accepted: a number, string")
        if len(constraints) > MAX_CONSTRAINTS:
            raise _fail(
                source,
                "constraints",
                f"{len(constraints)} constraints; at most {MAX_CONSTRAINTS} accepted",
            )
        self.constraints = tuple(
            c
            if isinstance(c, Constraint)
            else parse_constraint(c, self.knobs, self.constants, source, f"constraints[{i}]")
            for i, c in enumerate(constraints)
        )
        self._positions = {name: i for i, name in enumerate(self.names)}
        self._keys = [{_key(v): j for j, v in enumerate(k.values)} for k in self.knobs]
        self.trades = tuple(self._trade(pair) for pair in trades)
        self.product = math.prod(len(k.values) for k in self.knobs)
        # each constraint checked at the knob that binds its last name (level 0: constants only)
        levels: list[list[Constraint]] = [[] for _ in range(len(self.knobs) + 1)]
        for c in self.constraints:
            unknown = c.names - set(self.names)
            if unknown:
                raise _fail(source, c.field, f"reads {sorted(unknown)}, which are not knobs here")
            levels[1 + max((self._positions[n] for n in c.names), default=-1)].append(c)
        self._each = [_compile([c.expression], self._positions) for c in self.constraints]
        self._at: list[Callable[[KnobConfig], Any] | None] = [None] * len(self.knobs)
        self._at_constraints = levels[1:]
        self._satisfiable = True
        for level, cs in enumerate(levels):
            if cs:
                function = _compile([c.expression for c in cs], self._positions)
                if level == 0:
                    self._satisfiable = bool(self._run(function, cs, ()))
                else:
                    self._at[level - 1] = function
        self._all = (
            _compile([c.expression for c in self.constraints], self._positions)
            if self.constraints
            else None
        )
        self._configs: tuple[KnobConfig, ...] | None = None
        self._index: dict[int, dict[int, tuple[list[KnobConfig], npt.NDArray[np.int64]]]] | None = (
            None
        )

    def _trade(self, pair: tuple[str, str]) -> tuple[int, int]:
        field = f"trades.{'>'.join(map(str, pair))}"
        if len(pair) != 2 or pair[0] == pair[1] or not set(pair) <= set(self.names):
            raise _fail(
                self.source,
                field,
                f"a trade names two different knobs of {list(self.names)}, not {pair!r}",
            )
        i, j = (self._positions[n] for n in pair)
        for k in (self.knobs[i], self.knobs[j]):
            if k.kind != "int" or min(k.values) < 1:  # type: ignore[operator]
                raise _fail(self.source, field, f"knob {k.name}: a trade takes positive integers")
        return i, j

    def _run(self, function: Callable[[KnobConfig], Any], cs: list[Constraint], c: tuple) -> Any:
        """`function(c)`, or the ConstraintError naming the constraint that failed on `c`."""
        try:
            return function(c)
        except Exception as error:  # division by zero, a bounded power ...
            for constraint in cs:
                try:
                    self._each[self.constraints.index(constraint)](c)
                except Exception as own:
                    bound = " ".join(
                        f"{n}={c[self._positions[n]]!r}" for n in sorted(constraint.names)
                    )
                    raise _fail(
                        self.source,
                        constraint.field,
                        f"constraint {constraint.text!r} fails at {bound or 'the constants'}: "
                        f"{type(own).__name__}: {own}; guard it, e.g. `y != 0 and x % y == 0`",
                        ConstraintError,
                    ) from None
            raise error

    # configurations

    def iter_configs(self) -> Iterator[KnobConfig]:
        """Every valid configuration, lazily, in knob order then value order (SpaceTooLarge
        after checking `MAX_COMBINATIONS` partial configurations)."""
        if not self._satisfiable:
            return
        if not self.knobs:
            yield ()
            return
        values = [k.values for k in self.knobs]
        last, budget = len(values) - 1, [MAX_COMBINATIONS]

        def level(prefix: KnobConfig, i: int) -> Iterator[KnobConfig]:
            budget[0] -= len(values[i])
            if budget[0] < 0:
                raise _fail(
                    self.source,
                    "knobs",
                    f"the space has more than {MAX_COMBINATIONS:,} combinations to check "
                    f"({self.product:,} before constraints); accepted: fewer values, or "
                    "constraints over the first knobs, which cut the space early",
                    SpaceTooLarge,
                )
            candidates = [(*prefix, v) for v in values[i]]
            check = self._at[i]
            if check is not None:
                try:
                    candidates = [c for c in candidates if check(c)]
                except Exception:
                    cs = self._at_constraints[i]
                    candidates = [c for c in candidates if self._run(check, cs, c)]
            if i == last:
                yield from candidates
            else:
                for c in candidates:
                    yield from level(c, i + 1)

        yield from level((), 0)

    def configs(self) -> tuple[KnobConfig, ...]:
        """Every valid configuration (worked out once)."""
        if self._configs is None:
            self._configs = tuple(self.iter_configs())
        return self._configs

    def count(self) -> int:
        return len(self.configs())

    def problem(self, config: KnobConfig) -> str | None:
        """Why `config` is not in this space, in words; None when it is."""
        if len(config) != len(self.knobs):
            return f"{len(config)} values for the {len(self.knobs)} knobs {', '.join(self.names)}"
        for knob, keys, value in zip(self.knobs, self._keys, config, strict=True):
            if _key(value) not in keys:
                return (
                    f"{knob.name}={value!r} is not accepted; {knob.name} must be one of "
                    f"{list(knob.values)}"
                )
        if not self._satisfiable or (self._all is not None and not self._run_all(config)):
            broken = [
                c.text for c, f in zip(self.constraints, self._each, strict=True) if not f(config)
            ]
            return f"{self.label(config)} violates {', '.join(map(repr, broken))}"
        return None

    def _run_all(self, config: KnobConfig) -> bool:
        assert self._all is not None
        return bool(self._run(self._all, list(self.constraints), config))

    def contains(self, config: KnobConfig | Mapping[str, Value]) -> bool:
        if isinstance(config, Mapping):
            try:
                config = self.config(config)
            except KnobError:
                return False
        return self.problem(config) is None

    def _valid(self, config: KnobConfig) -> bool:
        """Valid, for a configuration built from the knobs' values."""
        return self._satisfiable and (self._all is None or self._run_all(config))

    def default(self) -> KnobConfig:
        """The knobs' defaults when they are valid, else the first valid configuration."""
        defaults = tuple(k.default for k in self.knobs)
        if self._valid(defaults):
            return defaults
        first = next(self.iter_configs(), None)
        if first is None:
            texts = ", ".join(repr(c.text) for c in self.constraints)
            raise _fail(self.source, "constraints", f"no configuration satisfies {texts}")
        return first

    def as_dict(self, config: KnobConfig) -> dict[str, Value]:
        return dict(zip(self.names, config, strict=True))

    def config(self, values: Mapping[str, Value]) -> KnobConfig:
        """The configuration a mapping of every knob's value gives (KnobError otherwise)."""
        missing = [n for n in self.names if n not in values]
        unknown = sorted(set(values) - set(self.names))
        if missing or unknown:
            raise _fail(
                self.source,
                "configuration",
                f"missing {missing}, unknown {unknown}; the knobs are {', '.join(self.names)}",
            )
        return tuple(values[n] for n in self.names)

    def label(self, config: KnobConfig) -> str:
        return " ".join(f"{n}={v}" for n, v in zip(self.names, config, strict=True))

    # moves

    def move_names(self) -> tuple[str, ...]:
        """Every move this space has, in a stable order (any configuration's neighbours are
        keyed by some of them)."""
        out: list[str] = []
        for k in self.knobs:
            out += (
                [f"{k.name}+", f"{k.name}-"] if k.ordered else [f"{k.name}={v}" for v in k.values]
            )
        for i, j in self.trades:
            a, b = self.names[i], self.names[j]
            out += [f"trade:{a}>{b}", f"trade:{b}>{a}"]
        return tuple(out)

    def neighbours(self, config: KnobConfig) -> dict[str, KnobConfig]:
        """Every valid configuration one move away, keyed by move name (see the class). The
        configuration itself may be invalid (a job's current one): its moves lead back in."""
        if len(config) != len(self.knobs):
            raise _fail(self.source, "configuration", self.problem(config) or "")
        positions = []
        for knob, keys, value in zip(self.knobs, self._keys, config, strict=True):
            position = keys.get(_key(value))
            if position is None:
                raise _fail(
                    self.source,
                    f"configuration.{knob.name}",
                    f"{value!r} is not accepted; one of {list(knob.values)}",
                )
            positions.append(position)
        out: dict[str, KnobConfig] = {}
        for i, (knob, at) in enumerate(zip(self.knobs, positions, strict=True)):
            steps: dict[str, Sequence[int]] = (
                {f"{knob.name}+": range(at + 1, len(knob.values)), f"{knob.name}-": range(at)[::-1]}
                if knob.ordered
                else {f"{knob.name}={v}": (j,) for j, v in enumerate(knob.values) if j != at}
            )
            for move, indices in steps.items():
                for j in indices:  # the nearest valid value in the move's direction
                    candidate = (*config[:i], knob.values[j], *config[i + 1 :])
                    if self._valid(candidate):
                        out[move] = candidate
                        break
                else:
                    repaired = self._repaired(config, positions, i, indices)
                    if repaired is not None:
                        out[move] = repaired
        for i, j in self.trades:
            for a, b in ((i, j), (j, i)):
                traded = self._traded(config, a, b, positions[a])
                if traded is not None:
                    out[f"trade:{self.names[a]}>{self.names[b]}"] = traded
        return out

    def _repaired(
        self, config: KnobConfig, positions: Sequence[int], i: int, indices: Sequence[int]
    ) -> KnobConfig | None:
        """Where no value of knob i in the move's direction is valid with every other knob as
        it is (a constraint that ties knobs, such as `p * q == ranks`, locks each of them
        alone), the move goes to the nearest such value that is valid with the fewest other
        knobs changed, and the smallest steps among those: more ranks, with the process grid
        that fits them. None when no value in the direction is valid at all."""
        by_value = self._by_value(i)
        for j in indices:
            found = by_value.get(j)
            if found is not None:
                configs, at = found
                # a scan of every valid configuration per locked move: vectorised, as a
                # recorded GPU space has thousands (the same choice as min() over the list:
                # fewest knobs changed, then fewest steps, then the first in order)
                away = at != np.asarray(positions)
                changed = away.sum(axis=1)
                steps = np.abs(at - np.asarray(positions)).sum(axis=1)
                return configs[int(np.argmin(changed * (steps.max() + 1) + steps))]
        return None

    def _by_value(self, i: int) -> dict[int, tuple[list[KnobConfig], npt.NDArray[np.int64]]]:
        """The valid configurations by the position of knob i's value, with every knob's
        position in each (worked out once)."""
        if self._index is None:
            self._index = {}
        found = self._index.get(i)
        if found is None:
            grouped: dict[int, list[KnobConfig]] = {}
            for c in self.configs():
                grouped.setdefault(self._keys[i][_key(c[i])], []).append(c)
            found = {
                j: (
                    configs,
                    np.array(
                        [
                            [keys[_key(v)] for keys, v in zip(self._keys, c, strict=True)]
                            for c in configs
                        ],
                        dtype=np.int64,
                    ).reshape(len(configs), len(self.knobs)),
                )
                for j, configs in grouped.items()
            }
            self._index[i] = found
        return found

    def _traded(self, config: KnobConfig, down: int, up: int, at: int) -> KnobConfig | None:
        """Knob `down` (at position `at`) to its nearest smaller value that splits
        config[down] * config[up] exactly into a value of knob `up`, valid; None if none."""
        product = int(config[down]) * int(config[up])
        for value in self.knobs[down].values[:at][::-1]:  # int knobs ascend
            assert isinstance(value, int)
            other = product // value
            if product % value or (False, other) not in self._keys[up]:
                continue
            candidate = list(config)
            candidate[down], candidate[up] = value, other
            if self._valid(tuple(candidate)):
                return tuple(candidate)
        return None

    def apply(self, config: KnobConfig, move: str) -> KnobConfig | None:
        """The configuration one `move` away, None when the move leaves the space."""
        if move not in self.move_names():
            raise _fail(
                self.source, "move", f"unknown move {move!r}; moves: {', '.join(self.move_names())}"
            )
        return self.neighbours(config).get(move)
