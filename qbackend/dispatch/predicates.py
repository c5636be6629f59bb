"""The conditions of the rule table as small objects that evaluate and render themselves, so a
row's text and its logic cannot drift apart.

    m, k, n = Var("m"), Var("k"), Var("n")
    cond = (m <= 64) & (k * n <= Num(768 * 3072, "768*3072"))
    cond({"m": 8, "k": 768, "n": 768})     # True
    cond.text                               # "m <= 64 and k*n <= 768*3072"

`text` is a Python expression over the fact names (ALWAYS renders as "any shape"), so a test can
evaluate it on its own and compare. Facts are the op instance's shape keys with the derived ones
`facts` adds (see its docstring); a missing flag reads as 0.
"""
from __future__ import annotations

import functools
import math
import operator
from dataclasses import dataclass
from typing import Any, Mapping

_FLAGS = ("gelu", "int8_residual", "bf16_products_pay")


def facts(op: str, shape: Mapping) -> dict:
    """The names a rule condition reads, from an op instance's shape keys.

    linear: m (rows of x), k, n, gelu (0/1). conv2d: n (batch), c_in, c_out, h, w, kernel (a pair)
    and its kh, kw, groups, int8_residual (0/1), stride (the first of the pair), and oh = ceil(h / stride),
    ow = ceil(w / stride): the output size of a same-padded conv, which is what the rows mean (the
    rules ignore the padding). attention: bf16_products_pay (0/1, the CPU's measured rates).
    embedding_bag: rows, dim, bits, fp16_qparams, padding_idx. Flags missing from a shape (records
    saved before they existed) read as 0."""
    out = dict(shape)
    for flag in _FLAGS:
        out[flag] = int(out.get(flag, 0) or 0)
    if op == "conv2d":
        stride = out.get("stride", 1)
        out["stride"] = stride if isinstance(stride, int) else int(tuple(stride)[0])
        out["kernel"] = tuple(int(v) for v in out["kernel"])
        out["kh"], out["kw"] = out["kernel"]
        out["oh"] = -(-int(out["h"]) // out["stride"])
        out["ow"] = -(-int(out["w"]) // out["stride"])
    return out


class Predicate:
    """A condition over facts: callable, with its text; & | ~ combine. `compiled` is the same
    condition as one Python function (its `source` compiled once): what the rule table evaluates,
    about 10x faster than walking the tree, which stays the reference."""

    text: str

    def __call__(self, f: Mapping) -> bool:
        raise NotImplementedError

    @property
    def source(self) -> str:
        """A fully parenthesised Python expression over the facts mapping `f`, true where the
        predicate holds."""
        raise NotImplementedError

    @functools.cached_property
    def compiled(self):
        """`lambda f: <source>` (made once per predicate)."""
        return eval(f"lambda f: bool({self.source})", {"_prod": math.prod})  # noqa: S307  (our own source)

    def __and__(self, other: "Predicate") -> "Predicate":
        return All((self, other))

    def __or__(self, other: "Predicate") -> "Predicate":
        return AnyOf((self, other))

    def __invert__(self) -> "Predicate":
        return Not(self)

    def __repr__(self) -> str:
        return f"<{self.text}>"


@dataclass(frozen=True, repr=False)
class Always(Predicate):
    """The condition that always holds (a rule table's catch-all row)."""

    def __call__(self, f: Mapping) -> bool:
        return True

    @property
    def source(self) -> str:
        return "True"

    @property
    def text(self) -> str:
        return "any shape"


ALWAYS = Always()


@dataclass(frozen=True, repr=False)
class All(Predicate):
    """All of its parts hold (rendered joined by "and")."""

    parts: tuple[Predicate, ...]

    def __call__(self, f: Mapping) -> bool:
        return all(p(f) for p in self.parts)

    @property
    def source(self) -> str:
        return "(" + " and ".join(p.source for p in self.parts) + ")"

    @property
    def text(self) -> str:
        return " and ".join(f"({p.text})" if isinstance(p, AnyOf) else p.text for p in self._flat())

    def _flat(self):
        for p in self.parts:
            yield from (p._flat() if isinstance(p, All) else (p,))


@dataclass(frozen=True, repr=False)
class AnyOf(Predicate):
    """One of its parts holds (rendered joined by "or")."""

    parts: tuple[Predicate, ...]

    def __call__(self, f: Mapping) -> bool:
        return any(p(f) for p in self.parts)

    @property
    def source(self) -> str:
        return "(" + " or ".join(p.source for p in self.parts) + ")"

    @property
    def text(self) -> str:
        return " or ".join(p.text for p in self.parts)


@dataclass(frozen=True, repr=False)
class Not(Predicate):
    """Its part does not hold."""

    part: Predicate

    def __call__(self, f: Mapping) -> bool:
        return not self.part(f)

    @property
    def source(self) -> str:
        return f"(not {self.part.source})"

    @property
    def text(self) -> str:
        inner = self.part.text
        return f"not ({inner})" if " " in inner else f"not {inner}"


# ---- quantities --------------------------------------------------------------------------------

_CMP = {"<=": operator.le, "<": operator.lt, ">=": operator.ge, ">": operator.gt, "==": operator.eq,
        "!=": operator.ne}


class Quantity:
    """A number (or tuple) computed from the facts, with its text (and `source`: the value as a
    fully parenthesised Python expression over the facts mapping `f`); comparisons make predicates."""

    text: str
    source: str

    def value(self, f: Mapping) -> Any:
        raise NotImplementedError

    def _cmp(self, op: str, other) -> "Compare":
        return Compare(self, op, other if isinstance(other, Quantity) else Num(other))

    def __le__(self, other):
        return self._cmp("<=", other)

    def __lt__(self, other):
        return self._cmp("<", other)

    def __ge__(self, other):
        return self._cmp(">=", other)

    def __gt__(self, other):
        return self._cmp(">", other)

    def __eq__(self, other):  # noqa: D105  (a predicate, not identity)
        return self._cmp("==", other)

    def __ne__(self, other):
        return self._cmp("!=", other)

    def __hash__(self):
        return hash(self.text)

    def __mul__(self, other) -> "Product":
        return Product((self, other if isinstance(other, Quantity) else Num(other)))

    def __floordiv__(self, other) -> "Quotient":
        return Quotient(self, other if isinstance(other, Quantity) else Num(other))

    def __mod__(self, other) -> "Remainder":
        return Remainder(self, other if isinstance(other, Quantity) else Num(other))


class Var(Quantity):
    """A fact by name."""

    def __init__(self, name: str):
        self.name = name
        self.text = name
        self.source = f"f[{name!r}]"

    def value(self, f: Mapping):
        return f[self.name]


class Num(Quantity):
    """A constant, rendered as given (e.g. Num(768 * 3072, "768*3072")) or as Python writes it."""

    def __init__(self, value, text: str | None = None):
        self.constant = value
        self.text = text if text is not None else (f"{value:_}" if isinstance(value, int) and abs(value) >= 10_000
                                                   else repr(value))
        self.source = f"({value!r})"
        try:
            same = eval(self.source, {"__builtins__": {}}) == value  # noqa: S307  (our own constant's repr)
        except Exception:  # noqa: BLE001
            same = False
        if not same:  # a constant the source cannot write (nan, an object): refused
            raise ValueError(f"Num({value!r}): no Python literal gives this constant")

    def value(self, f: Mapping):
        return self.constant


class Product(Quantity):
    """The product of quantities (rendered "a*b")."""

    def __init__(self, factors: tuple):
        flat = []
        for q in factors:
            flat.extend(q.factors if isinstance(q, Product) else (q,))
        self.factors = tuple(flat)
        self.text = "*".join(q.text for q in self.factors)
        self.source = "_prod((" + ", ".join(q.source for q in self.factors) + ",))"

    def value(self, f: Mapping):
        return math.prod(q.value(f) for q in self.factors)


class Quotient(Quantity):
    """The integer quotient of two quantities (rendered "a//b")."""

    def __init__(self, num: Quantity, den: Quantity):
        self.num, self.den = num, den
        self.text = f"{num.text}//{den.text}"
        self.source = f"({num.source} // {den.source})"

    def value(self, f: Mapping):
        return self.num.value(f) // self.den.value(f)


class Remainder(Quantity):
    """The remainder of the integer division of two quantities (rendered "a%b")."""

    def __init__(self, num: Quantity, den: Quantity):
        self.num, self.den = num, den
        self.text = f"{num.text}%{den.text}"
        self.source = f"({num.source} % {den.source})"

    def value(self, f: Mapping):
        return self.num.value(f) % self.den.value(f)


@dataclass(frozen=True, repr=False, eq=False)
class Compare(Predicate):
    """A comparison of two quantities (<=, <, >=, >, ==, !=)."""

    left: Quantity
    op: str
    right: Quantity

    def __call__(self, f: Mapping) -> bool:
        return bool(_CMP[self.op](self.left.value(f), self.right.value(f)))

    @property
    def source(self) -> str:
        if self.op not in _CMP:
            raise ValueError(f"unknown comparison {self.op!r}")
        return f"({self.left.source} {self.op} {self.right.source})"

    @property
    def text(self) -> str:
        return f"{self.left.text} {self.op} {self.right.text}"


@dataclass(frozen=True, repr=False)
class Flag(Predicate):
    """A 0/1 fact that holds (rendered as the bare name)."""

    name: str

    def __call__(self, f: Mapping) -> bool:
        return bool(f.get(self.name, 0))

    @property
    def source(self) -> str:
        return f"bool(f.get({self.name!r}, 0))"

    @property
    def text(self) -> str:
        return self.name
