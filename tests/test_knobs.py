"""Any job's knobs: parsing, constraints, enumeration and moves (hpc_ds1.knobs)."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest

from hpc_ds1 import knobs as knobs_module
from hpc_ds1.knobs import (
    ConstraintError,
    Knob,
    KnobError,
    KnobSpace,
    SpaceTooLarge,
    parse_constraint,
    parse_knobs,
)

SOURCE = "/jobs/heat.toml"
POW2_1024 = [2**p for p in range(11)]


def one(spec: Any, name: str = "k") -> Knob:
    (knob,) = parse_knobs({name: spec}, SOURCE)
    return knob


def space(table: dict[str, Any], *constraints: str, **kwargs: Any) -> KnobSpace:
    return KnobSpace(parse_knobs(table, SOURCE), constraints, source=SOURCE, **kwargs)


# --- knobs ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "kind", "values", "default"),
    [
        ({"values": [4, 1, 2]}, "int", (1, 2, 4), 1),
        ([8, 16, 32], "int", (8, 16, 32), 8),
        ({"values": [4, 1, 2], "default": 2}, "int", (1, 2, 4), 2),
        ({"range": [2, 9], "step": 3}, "int", (2, 5, 8), 2),
        ({"range": [3, 5]}, "int", (3, 4, 5), 3),
        ({"range": [1, 1024], "scale": "pow2"}, "int", tuple(2**p for p in range(11)), 1),
        ({"range": [3, 40], "scale": "pow2", "default": 16}, "int", (4, 8, 16, 32), 16),
        ({"values": [4, 1, 2], "kind": "ordered"}, "ordered", (4, 1, 2), 4),
        ({"values": ["zyx", "xyz"], "kind": "ordered"}, "ordered", ("zyx", "xyz"), "zyx"),
        ({"values": [0.5, 0.25, 1]}, "ordered", (0.25, 0.5, 1), 0.25),
        ({"values": [0.5, 1.0], "default": 1}, "ordered", (0.5, 1.0), 1.0),
        ({"values": ["fast", "exact"]}, "category", ("fast", "exact"), "fast"),
        ({"values": [2, 0, 1], "kind": "category"}, "category", (2, 0, 1), 2),
        ({"kind": "bool"}, "bool", (False, True), False),
        ({"kind": "bool", "default": True}, "bool", (False, True), True),
        ({"values": [True, False]}, "bool", (False, True), True),
    ],
)
def test_each_kind_parses(spec: Any, kind: str, values: tuple, default: Any) -> None:
    knob = one(spec)
    assert (knob.kind, knob.values, knob.default) == (kind, values, default)
    assert knob.ordered == (kind != "category")
    assert type(knob.default) is type(default)  # True is not 1


def test_knobs_keep_their_declared_order() -> None:
    knobs = parse_knobs({"b": [1], "a": {"kind": "bool"}, "c": ["x"]}, SOURCE)
    assert [k.name for k in knobs] == ["b", "a", "c"]


@pytest.mark.parametrize(
    ("table", "field", "accepted"),
    [
        ({"1x": [1]}, "knobs.1x", "an identifier"),
        ({"class": [1]}, "knobs.class", "not a Python keyword"),
        ({"ranks": [1]}, "knobs.ranks", "ranks, threads, gpu"),
        ({"min": [1]}, "knobs.min", "min, max, abs"),
        ({"__x": [1]}, "knobs.__x", "not starting with '__'"),
        ({"bx": {"range": [5, 1]}}, "knobs.bx.range", "lo must be at most hi"),
        ({"bx": {"range": [1]}}, "knobs.bx.range", "[lo, hi], two integers"),
        ({"bx": {"range": [1, 10**6]}}, "knobs.bx.range", "at most 4,096"),
        ({"bx": {"range": [0, 8], "scale": "pow2"}}, "knobs.bx.range", "lo >= 1"),
        ({"bx": {"range": [5, 7], "scale": "pow2"}}, "knobs.bx.range", "no power of two"),
        ({"bx": {"range": [1, 8], "scale": "log"}}, "knobs.bx.scale", '"linear" or "pow2"'),
        ({"bx": {"range": [1, 8], "step": 0}}, "knobs.bx.step", "an integer >= 1"),
        ({"bx": {"range": [1, 8], "values": [1]}}, "knobs.bx.range", "without values"),
        ({"bx": {"values": [1], "step": 2}}, "knobs.bx.step", "only with range"),
        ({"bx": {"values": [1, 1]}}, "knobs.bx.values", "values are distinct"),
        ({"bx": {"values": [1, "a"]}}, "knobs.bx.values", "all integers, all numbers"),
        ({"bx": {"values": [[1]]}}, "knobs.bx.values", "integers, finite numbers, strings"),
        ({"bx": {"values": [float("nan")]}}, "knobs.bx.values", "finite numbers"),
        ({"bx": {"values": ["a b"]}}, "knobs.bx.values", "letters, digits"),
        ({"bx": {"values": []}}, "knobs.bx.values", "a non-empty list"),
        ({"bx": {}}, "knobs.bx", "range = [lo, hi]"),
        ({"bx": {"values": [1, 2], "default": 3}}, "knobs.bx.default", "one of the values"),
        ({"bx": {"values": [0, 1], "default": True}}, "knobs.bx.default", "one of the values"),
        ({"bx": {"values": [1], "color": 1}}, "knobs.bx", "accepted: kind, values, range"),
        ({"bx": {"kind": "float"}}, "knobs.bx.kind", "int, ordered, category, bool"),
        ({"bx": {"values": [0.5, 1.5], "kind": "int"}}, "knobs.bx.kind", "accepted: ordered"),
        ({"bx": {"values": [1, 2], "kind": "bool"}}, "knobs.bx.kind", "int, ordered, category"),
        ({"bx": "fast"}, "knobs.bx", "a table (kind, values"),
        ({f"k{i}": [1] for i in range(65)}, "knobs", "at most 64"),
    ],
)
def test_each_refusal_names_the_file_the_field_and_what_is_accepted(
    table: dict[str, Any], field: str, accepted: str
) -> None:
    with pytest.raises(KnobError) as raised:
        parse_knobs(table, SOURCE)
    message = str(raised.value)
    assert message.startswith(f"{SOURCE}: {field}: "), message
    assert accepted in message, message
    assert isinstance(raised.value, ValueError)


def test_a_knob_built_in_python_is_checked_too() -> None:
    with pytest.raises(KnobError, match="default among them"):
        Knob("ranks", "int", (1, 2), 4)
    with pytest.raises(KnobError, match="ascend"):
        Knob("ranks", "int", (2, 1), 1)
    assert parse_knobs({"ranks": [1, 2]}, SOURCE, reserved=())[0].name == "ranks"


# --- constraints ---------------------------------------------------------------------------

EXPRESSIONS = [
    "block_x * block_y <= 1024",
    "32 <= block_x * block_y <= 256",
    "block_x // block_y >= 1 and block_x % block_y == 0",
    "block_x / block_y < 3.5 or not flag",
    "algo in ('fast', 'exact') or block_x > 8",
    "algo not in ['fast'] and block_y != 2",
    "min(block_x, block_y) >= 4 if flag else True",
    "abs(block_x - block_y) <= max(4, block_y)",
    "block_x ** 2 <= cpus * 64 and -block_y < 0 and +1",
    "block_x * block_y <= cpus * 32 or flag == True",
]


@pytest.mark.parametrize("expression", EXPRESSIONS)
def test_constraints_evaluate_as_python_does(expression: str) -> None:
    table = {
        "block_x": {"range": [1, 64], "scale": "pow2"},
        "block_y": {"range": [1, 64], "scale": "pow2"},
        "algo": ["fast", "exact", "tiled"],
        "flag": {"kind": "bool"},
    }
    s = space(table, expression, constants={"cpus": 4})
    names = [k.name for k in s.knobs]
    expected = [
        c
        for c in itertools.product(*(k.values for k in s.knobs))
        if eval(
            expression,
            {"cpus": 4, "min": min, "max": max, "abs": abs},
            dict(zip(names, c, strict=True)),
        )
    ]
    assert list(s.configs()) == expected
    assert 0 < len(expected) < s.product or expression.endswith("+1")


@pytest.mark.parametrize(
    ("expression", "offending"),
    [
        ("__import__('os').system('true')", "__import__('os').system"),
        ("__import__('os')", "__import__('os')"),
        ("bx.real > 0", "attribute access"),
        ("open('/etc/passwd')", "open('/etc/passwd')"),
        ("[x for x in (1, 2)]", "comprehension"),
        ("any(x > 1 for x in (bx,))", "any("),
        ("(lambda: 1)()", "(lambda: 1)()"),
        ("lambda: 1", "lambda"),
        ("(bx, 2)[0] == 1", "subscript"),
        ("(y := bx) > 1", "assignment (:=)"),
        ("f'{bx}' == '1'", "f-string"),
        ("2 ** 100000 > bx", "2 ** 100000"),
        ("bx ** 1000 > 1", "bx ** 1000"),
        ("2 ** 10 ** 9 > bx", "2 ** 10 ** 9"),
        ("bx ** big > 1", "bx ** big"),
        ("algo * 100000000 == 'x'", "may be a string"),
        ("'%999999999d' % bx == ''", "may be a string"),
        ("(algo or 1) * 3 > 1", "may be a string"),
        ("nope > 1", "unknown name 'nope'"),
        ("bx in cpus", "after `in`"),
        ("min(bx)", "min(bx)"),
        ("max(bx, key=abs)", "max(bx, key=abs)"),
        ("abs(*(bx,))", "abs(*(bx,))"),
        ("bx << 2", "BinOp"),
        ("bx is 1", "Compare"),
        ("None", "None"),
        ("{bx: 1}", "dict"),
        ("bx >", "not a Python expression"),
        ("-" * 200 + "bx", "nests deeper"),
    ],
)
def test_unsafe_or_unknown_expressions_are_refused_at_parse_time(
    expression: str, offending: str
) -> None:
    knobs = parse_knobs({"bx": [1, 2], "algo": ["a", "b"]}, SOURCE)
    with pytest.raises(ConstraintError) as raised:
        KnobSpace(knobs, ["bx > 0", expression], {"cpus": 8, "big": 10**6}, source=SOURCE)
    message = str(raised.value)
    assert message.startswith(f"{SOURCE}: constraints[1]: constraint {expression!r}"), message
    assert offending in message, message
    assert "accepted: knob and constant names" in message, message


@pytest.mark.parametrize("text", ["", "   ", 12, "x" * 1001])
def test_a_constraint_must_be_a_short_string(text: Any) -> None:
    with pytest.raises(ConstraintError, match=f"{SOURCE}: constraints: .*Python expression"):
        parse_constraint(text, [], {}, SOURCE)


def test_constraints_that_fail_on_a_configuration_name_it_and_suggest_a_guard() -> None:
    s = space({"bx": [0, 1, 2], "by": [0, 3]}, "bx % by == 0")
    with pytest.raises(ConstraintError) as raised:
        s.count()
    assert "constraints[0]: constraint 'bx % by == 0' fails at bx=0 by=0" in str(raised.value)
    assert "ZeroDivisionError" in str(raised.value) and "guard it" in str(raised.value)
    guarded = space({"bx": [0, 1, 2], "by": [0, 3]}, "by != 0 and bx % by == 0")
    assert guarded.configs() == ((0, 3),)
    powers = space({"e": [1, 2, 100]}, "2 ** e > 1")
    with pytest.raises(ConstraintError, match="exponent 100 exceeds 64"):
        powers.count()


def test_constants_are_names_constraints_read_and_may_empty_the_space() -> None:
    table = {"ranks": [1, 2, 4, 8], "threads": [1, 2, 4, 8]}
    knobs = parse_knobs(table, SOURCE, reserved=())
    s = KnobSpace(knobs, ["ranks * threads <= cpus"], {"cpus": 8})
    assert s.count() == sum(1 for r, t in itertools.product([1, 2, 4, 8], repeat=2) if r * t <= 8)
    empty = KnobSpace(knobs, ["gpus > 0"], {"gpus": 0}, source=SOURCE)
    assert empty.count() == 0 and not empty.contains((1, 1))
    with pytest.raises(KnobError, match=f"{SOURCE}: constraints: no configuration satisfies"):
        empty.default()
    with pytest.raises(KnobError, match=r"constants\.ranks: .ranks. is not accepted as a name"):
        KnobSpace(knobs, [], {"ranks": 2})


# --- enumeration and moves -----------------------------------------------------------------


def test_enumeration_matches_a_brute_force_filter() -> None:
    s = space(
        {
            "block_x": {"range": [1, 1024], "scale": "pow2"},
            "block_y": {"range": [1, 1024], "scale": "pow2"},
            "tile": {"range": [1, 8]},
        },
        "block_x * block_y <= 1024",
    )
    brute = [
        (x, y, t)
        for x, y, t in itertools.product(POW2_1024, POW2_1024, range(1, 9))
        if x * y <= 1024
    ]
    assert list(s.configs()) == brute and s.count() == len(brute) == 66 * 8
    assert all(s.contains(c) for c in brute) and not s.contains((64, 32, 1))
    assert s.default() == (1, 1, 1)


def test_enumerates_a_kernel_tuner_sized_space() -> None:
    """100,960 valid configurations of 743,424 combinations (8 knobs, 6 constraints): the
    space of the module docstring's figure, against a brute-force filter."""
    s = space(
        {
            "block_x": {"range": [1, 1024], "scale": "pow2"},
            "block_y": {"range": [1, 1024], "scale": "pow2"},
            "tile_x": {"range": [1, 16]},
            "tile_y": {"range": [1, 16]},
            "unroll": {"kind": "bool"},
            "read_only": {"kind": "bool"},
            "padding": {"kind": "bool"},
            "algo": ["a", "b", "c"],
        },
        "32 <= block_x * block_y <= 1024",
        "block_x * tile_x <= 1024",
        "block_y * tile_y <= 512",
        "not unroll or tile_x % 2 == 0",
        "not padding or block_x >= 16",
        "algo != 'c' or not read_only",
    )
    brute = [
        (bx, by, tx, ty, unroll, read_only, padding, algo)
        for bx, by, tx, ty, unroll, read_only, padding, algo in itertools.product(
            POW2_1024, POW2_1024, range(1, 17), range(1, 17), *[(False, True)] * 3, "abc"
        )
        if 32 <= bx * by <= 1024
        and bx * tx <= 1024
        and by * ty <= 512
        and (not unroll or tx % 2 == 0)
        and (not padding or bx >= 16)
        and (algo != "c" or not read_only)
    ]
    assert s.product == 743_424 and s.count() == len(brute) == 100_960
    assert list(s.configs()) == brute


def test_a_space_past_the_cap_is_refused_when_counted_and_still_walks_lazily(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert knobs_module.MAX_COMBINATIONS == 10_000_000
    monkeypatch.setattr(knobs_module, "MAX_COMBINATIONS", 100_000)  # the same, 100 x sooner
    s = space({f"k{i}": {"range": [1, 10]} for i in range(6)}, "k0 + k5 > 2")
    assert s.product == 10**6
    assert s.default() == (1,) * 5 + (2,)  # the defaults are invalid: the first valid one
    with pytest.raises(
        SpaceTooLarge,
        match=f"{SOURCE}: knobs: the space has more than 100,000 combinations to check "
        r"\(1,000,000 before constraints\); accepted: fewer values, or constraints",
    ):
        s.count()
    cut = space({f"k{i}": {"range": [1, 10]} for i in range(6)}, "k0 + k1 <= 2")
    assert cut.count() == 10**4  # pruned at k1: 10,000 checks, not a million


def test_default_is_the_defaults_when_valid() -> None:
    table = {"bx": {"values": [1, 2, 4], "default": 4}, "by": {"values": [1, 2], "default": 2}}
    assert space(table).default() == (4, 2)
    assert space(table, "bx * by <= 4").default() == (1, 1)


def test_moves_skip_invalid_values_and_stay_in_the_space() -> None:
    s = space(
        {"bx": {"range": [1, 8]}, "algo": ["fast", "exact", "tiled"], "pad": {"kind": "bool"}},
        "bx not in (3, 4, 6)",
        "algo != 'exact' or bx <= 2",
        "not pad or bx % 2 == 0",
    )
    moves = s.neighbours((2, "fast", False))
    assert moves == {
        "bx+": (5, "fast", False),  # over 3 and 4
        "bx-": (1, "fast", False),
        "algo=exact": (2, "exact", False),
        "algo=tiled": (2, "tiled", False),
        "pad+": (2, "fast", True),
    }
    assert s.neighbours((5, "fast", False))["bx-"] == (2, "fast", False)
    assert s.neighbours((8, "fast", True)) == {
        "bx-": (2, "fast", True),  # over 7 (odd), 6, 5 (odd), 4, 3
        "algo=tiled": (8, "tiled", True),
        "algo=exact": (2, "exact", True),  # exact needs bx <= 2: bx goes along (repaired)
        "pad-": (8, "fast", False),
    }
    assert s.apply((2, "fast", False), "bx+") == (5, "fast", False)
    assert s.apply((8, "fast", True), "bx+") is None
    with pytest.raises(KnobError, match="unknown move 'bx\\^'; moves: bx\\+, bx-, algo=fast"):
        s.apply((2, "fast", False), "bx^")
    # an invalid configuration (a job's current one) moves back into the space
    assert not s.contains((3, "fast", False))
    assert s.neighbours((3, "fast", False))["bx+"] == (5, "fast", False)
    assert s.move_names() == (
        "bx+", "bx-", "algo=fast", "algo=exact", "algo=tiled", "pad+", "pad-",
    )  # fmt: skip


def test_the_trade_keeps_the_product() -> None:
    knobs = parse_knobs(
        {
            "ranks": {"range": [1, 16], "scale": "pow2"},
            "threads": {"range": [1, 16], "scale": "pow2"},
        },
        SOURCE,
        reserved=(),
    )
    s = KnobSpace(knobs, ["ranks * threads <= cpus"], {"cpus": 16}, [("ranks", "threads")])
    moves = s.neighbours((4, 4))
    assert moves["trade:ranks>threads"] == (2, 8)
    assert moves["trade:threads>ranks"] == (8, 2)
    assert s.neighbours((1, 16)).get("trade:ranks>threads") is None
    for config in s.configs():
        for move, (r, t) in s.neighbours(config).items():
            if move.startswith("trade:"):
                assert int(r) * int(t) == int(config[0]) * int(config[1]) and s.contains((r, t))
    skipping = KnobSpace(knobs, ["threads != 8"], {}, [("ranks", "threads")])
    assert skipping.neighbours((4, 4))["trade:ranks>threads"] == (1, 16)
    for bad in [("ranks", "ranks"), ("ranks", "cores")]:
        with pytest.raises(KnobError, match="a trade names two different knobs"):
            KnobSpace(knobs, trades=[bad])
    with pytest.raises(KnobError, match="a trade takes positive integers"):
        KnobSpace([*knobs, Knob("algo", "category", ("a", "b"), "a")], trades=[("ranks", "algo")])


def test_configurations_convert_to_and_from_mappings() -> None:
    s = space({"bx": [1, 2], "algo": ["fast", "exact"]}, "bx > 1 or algo == 'fast'")
    assert s.as_dict((2, "exact")) == {"bx": 2, "algo": "exact"}
    assert s.config({"algo": "exact", "bx": 2}) == (2, "exact")
    assert s.contains({"bx": 1, "algo": "fast"}) and not s.contains({"bx": 1, "algo": "exact"})
    assert not s.contains({"bx": 1}) and not s.contains((1,))
    with pytest.raises(KnobError, match=r"missing \['algo'\], unknown \['by'\]; the knobs are bx"):
        s.config({"bx": 1, "by": 2})
    assert s.problem((3, "fast")) == "bx=3 is not accepted; bx must be one of [1, 2]"
    assert s.problem((1, "exact")) == "bx=1 algo=exact violates \"bx > 1 or algo == 'fast'\""
    assert s.label((2, "fast")) == "bx=2 algo=fast"


def _random_space(rng: random.Random) -> KnobSpace:
    table: dict[str, Any] = {}
    for i in range(rng.randint(1, 4)):
        kind = rng.choice(["int", "range", "pow2", "ordered", "category", "bool"])
        if kind == "int":
            table[f"k{i}"] = rng.sample(range(1, 10), rng.randint(1, 4))
        elif kind == "range":
            lo = rng.randint(0, 4)
            table[f"k{i}"] = {"range": [lo, lo + rng.randint(0, 8)], "step": rng.randint(1, 3)}
        elif kind == "pow2":
            table[f"k{i}"] = {"range": [1, 2 ** rng.randint(0, 5)], "scale": "pow2"}
        elif kind == "ordered":
            table[f"k{i}"] = {"values": rng.sample(range(1, 10), 3), "kind": "ordered"}
        elif kind == "category":
            table[f"k{i}"] = rng.sample(["a", "b", "c", "d"], rng.randint(1, 4))
        else:
            table[f"k{i}"] = {"kind": "bool"}
    names = list(table)
    numeric = [n for n in names if not isinstance(table[n], list) or isinstance(table[n][0], int)]
    templates = ["{a} * {b} <= 12", "({a} + {b}) % 3 != 0", "{a} != {b} or {a} > 2", "{a} >= 1"]
    constraints = [
        rng.choice(templates).format(a=rng.choice(numeric), b=rng.choice(numeric))
        for _ in range(rng.randint(0, 2) if numeric else 0)
    ]
    return space(table, *constraints)


@pytest.mark.parametrize("seed", range(60))
def test_random_spaces_neighbours_are_valid_and_contains_agrees_with_enumeration(
    seed: int,
) -> None:
    s = _random_space(random.Random(seed))
    valid = set(s.configs())
    assert len(valid) == s.count()
    for combination in itertools.product(*(k.values for k in s.knobs)):
        assert s.contains(combination) == (combination in valid)
        moves = s.neighbours(combination)
        assert set(moves) <= set(s.move_names())
        for move, neighbour in moves.items():
            assert neighbour in valid and neighbour != combination
            assert s.apply(combination, move) == neighbour
            changed = [
                i for i, (a, b) in enumerate(zip(combination, neighbour, strict=True)) if a != b
            ]
            if move.startswith("trade:"):
                continue
            knob = s.names.index(move.rstrip("+-").split("=")[0])
            assert knob in changed
            if len(changed) > 1:  # repaired: no value of the knob alone was valid that way
                alone = [
                    c
                    for c in valid
                    if c[knob] != combination[knob]
                    and all(c[j] == combination[j] for j in range(len(c)) if j != knob)
                    and (
                        move.endswith("=" + str(neighbour[knob]))
                        or _same_way(s, knob, combination, c, move)
                    )
                ]
                assert not alone, (move, combination, neighbour, alone)
                fewer = [
                    c
                    for c in valid
                    if c[knob] == neighbour[knob]
                    and sum(a != b for a, b in zip(c, combination, strict=True)) < len(changed)
                ]
                assert not fewer, (move, combination, neighbour, fewer)
    if valid:
        assert s.default() in valid


def _same_way(s: KnobSpace, knob: int, start: tuple, other: tuple, move: str) -> bool:
    """Whether `other`'s value of `knob` lies in the direction of `move` from `start`'s."""
    values = s.knobs[knob].values
    step = values.index(other[knob]) - values.index(start[knob])
    return step > 0 if move.endswith("+") else step < 0 if move.endswith("-") else False
