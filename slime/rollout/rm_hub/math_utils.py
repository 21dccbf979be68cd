"""Math answers: pull the final `\\boxed{}` out of a response, normalise it, compare it to a label.

Comparison runs in three steps, cheapest first: normalised strings, numbers,
then symbolic equivalence through sympy under a time limit (a model can write
an expression that takes sympy minutes to simplify).
"""

from __future__ import annotations

import math
import re

from slime.rollout.rm_hub.time_limit import TimeLimitExceeded, call_with_time_limit

_BOX_MACROS = ("\\boxed", "\\fbox")


def _matching_brace(text: str, open_at: int) -> int | None:
    """Index of the `}` closing the `{` at `open_at`; escaped braces (`\\{`) do not count."""
    depth = 0
    i = open_at
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (else the last `\\fbox{...}`); None when absent or unterminated."""
    for macro in _BOX_MACROS:
        start = text.rfind(macro)
        if start < 0:
            continue
        i = start + len(macro)
        spaced = i < len(text) and text[i] == " "
        while i < len(text) and text[i] == " ":
            i += 1
        if i < len(text) and text[i] == "{":
            close = _matching_brace(text, i)
            # An unterminated box is a truncated response: no answer, never a guess.
            return None if close is None else text[i + 1 : close].strip()
        if spaced:
            # `\boxed 5$`: the argument is the next token.
            token = re.match(r"[^\s$]+", text[i:])
            return token.group(0) if token else None
        return None
    return None


_UNIT_WORDS = (
    "degrees", "degree", "centimeters", "centimeter", "meters", "meter", "kilometers",
    "inches", "inch", "feet", "foot", "units", "unit", "dollars", "dollar", "cents",
    "hours", "hour", "minutes", "minute", "seconds", "second", "square", "sq", "cm",
    "mm", "km", "kg", "grams", "gram", "pounds", "miles", "mile", "mph", "students",
    "people", "days", "day", "years", "year",
)
_UNIT_RE = re.compile(r"(?:\s*\b(?:" + "|".join(_UNIT_WORDS) + r")\b\.?)+\s*$")
_TEXT_RE = re.compile(r"\\(?:text|textbf|mbox|mathrm|textrm)\s*\{([^{}]*)\}")
_SPACING = ("\\!", "\\,", "\\;", "\\:", "\\ ", "\\quad", "\\qquad", "~")
_DROP = ("^{\\circ}", "^\\circ", "\\circ", "\\%", "%", "\\$", "$", "\\displaystyle")


def _unwrap_text(match: re.Match[str]) -> str:
    inner = match.group(1).strip()
    return "" if _UNIT_RE.fullmatch(" " + inner) else inner


def _brace_short_args(s: str) -> str:
    # `\frac12` and `\frac1{2}` mean `\frac{1}{2}`; `\sqrt2` means `\sqrt{2}`.
    s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\frac(\d)\{", r"\\frac{\1}{", s)
    s = re.sub(r"\\frac\{([^{}]*)\}(\d)", r"\\frac{\1}{\2}", s)
    return re.sub(r"\\sqrt(\d)", r"\\sqrt{\1}", s)


def normalize_answer(answer: str) -> str:
    """Canonical text of a final answer: no units, spacing macros, `\\left`/`\\right`, `$`, trailing `.`."""
    s = answer.strip()
    s = _TEXT_RE.sub(_unwrap_text, s)
    s = s.replace("\\left", "").replace("\\right", "")
    for token in _SPACING:
        s = s.replace(token, " ")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    for token in _DROP:
        s = s.replace(token, "")
    s = _UNIT_RE.sub("", s)
    s = s.replace(" ", "").rstrip(".").strip()
    # `x = 5` answers the question "x"; keep only the value.
    eq = re.fullmatch(r"[a-zA-Z]\w{0,2}=(.+)", s)
    if eq and "=" not in eq.group(1):
        s = eq.group(1)
    s = _brace_short_args(s)
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")
    if s.startswith("."):
        s = "0" + s
    if s.startswith("-."):
        s = "-0" + s[1:]
    return s


def _replace_macro(s: str, macro: str, nargs: int, fmt: str) -> str:
    """Rewrite `\\macro{a}{b}` into `fmt.format(a, b)`, innermost arguments first."""
    while True:
        start = s.find(macro + "{")
        if start < 0:
            return s
        args: list[str] = []
        i = start + len(macro)
        for _ in range(nargs):
            if i >= len(s) or s[i] != "{":
                return s
            close = _matching_brace(s, i)
            if close is None:
                return s
            args.append(_replace_macro(s[i + 1 : close], macro, nargs, fmt))
            i = close + 1
        s = s[:start] + fmt.format(*args) + s[i:]


_SAFE_EXPR = re.compile(r"[0-9a-zA-Z+\-*/().,_ ]+")
_NAMES = {
    "\\cdot": "*", "\\times": "*", "\\div": "/", "\\pi": "pi", "\\infty": "oo",
    "\\ln": "log", "\\log": "log", "\\sin": "sin", "\\cos": "cos", "\\tan": "tan",
    "\\exp": "exp",
}


def latex_to_sympy_text(latex: str) -> str | None:
    """Sympy-parsable text for a normalised LaTeX answer; None when it holds anything else."""
    s = latex
    s = re.sub(r"\\sqrt\[([^\]]+)\]\{", r"\\nthroot{\1}{", s)
    s = _replace_macro(s, "\\nthroot", 2, "(({1})**(1/({0})))")
    s = _replace_macro(s, "\\frac", 2, "(({0})/({1}))")
    s = _replace_macro(s, "\\sqrt", 1, "sqrt({0})")
    for macro, text in sorted(_NAMES.items(), key=lambda kv: -len(kv[0])):
        s = s.replace(macro, f" {text} ")
    if "\\" in s:
        # Leftover macros (Greek letters, \mathrm{...}): let pylatexenc spell them out.
        from pylatexenc.latex2text import LatexNodes2Text

        s = LatexNodes2Text().latex_to_text(s)
    s = s.replace("{", "(").replace("}", ")").replace("^", "**")
    if not s.strip() or not _SAFE_EXPR.fullmatch(s.replace("**", "*")) or "__" in s:
        return None
    # Huge exponents run in C where no time limit can interrupt them.
    if re.search(r"\*\*\s*\(*\s*\d{4,}", s) or len(s) > 300:
        return None
    return s


def _parse(text: str):  # type: ignore[no-untyped-def]
    from sympy.parsing.sympy_parser import (
        convert_xor,
        implicit_multiplication_application,
        parse_expr,
        standard_transformations,
    )

    transformations = (*standard_transformations, implicit_multiplication_application, convert_xor)
    return parse_expr(text, transformations=transformations, evaluate=True)


def _sympy_equal(a: str, b: str) -> bool:
    import sympy

    ea, eb = _parse(a), _parse(b)
    if ea == eb:
        return True
    diff = sympy.simplify(ea - eb)
    return bool(diff == 0)


def _as_number(s: str) -> float | None:
    try:
        return float(s)
    except ValueError:
        return None


def _split_top_level(s: str) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in s:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return parts


_OUTER = (("(", ")"), ("[", "]"), ("\\{", "\\}"))


def _strip_outer(s: str) -> str:
    # A set's braces are two characters each (`\{1,2\}`): compared as first + last
    # character they never matched, and sets were compared only as whole strings.
    for left, right in _OUTER:
        if (len(s) >= len(left) + len(right) and s.startswith(left) and s.endswith(right)
                and _matching_pair(s[len(left) - 1:])):
            return s[len(left):-len(right)]
    return s


def _matching_pair(s: str) -> bool:
    depth = 0
    for i, ch in enumerate(s):
        depth += ch in "([{"
        depth -= ch in ")]}"
        if depth == 0 and i < len(s) - 1:
            return False
    return True


def _equivalent(a: str, b: str, timeout: float) -> bool:
    if a == b:
        return True
    na, nb = _as_number(a), _as_number(b)
    if na is not None and nb is not None:
        return math.isclose(na, nb, rel_tol=1e-6, abs_tol=1e-9)
    ta, tb = latex_to_sympy_text(a), latex_to_sympy_text(b)
    if ta is None or tb is None:
        return False
    # Imported before the clock starts: sympy's first import takes seconds on a loaded
    # machine, and the limit is for the comparison, not for loading the library.
    import sympy.parsing.sympy_parser  # noqa: F401
    try:
        return call_with_time_limit(_sympy_equal, timeout, ta, tb)
    except TimeLimitExceeded:
        return False
    except Exception:  # sympy raises many types on malformed input; unparsable is "not equal"
        return False


def answers_match(predicted: str | None, label: str, *, timeout: float = 5.0) -> bool:
    """True when a predicted final answer equals the label as text, as a number or symbolically."""
    if predicted is None:
        return False
    a, b = normalize_answer(predicted), normalize_answer(label)
    if _equivalent(a, b, timeout):
        return True
    # Tuples, intervals and lists: compare element-wise when both have the same shape.
    ia, ib = _strip_outer(a), _strip_outer(b)
    pa, pb = _split_top_level(ia), _split_top_level(ib)
    if len(pa) > 1 and len(pa) == len(pb) and (a[:1] + a[-1:]) == (b[:1] + b[-1:]):
        return all(_equivalent(x, y, timeout) for x, y in zip(pa, pb, strict=True))
    return False


def grade_math(response: str, label: str, *, timeout: float = 5.0) -> float:
    """1.0 when the last boxed answer of `response` matches `label`, else 0.0."""
    boxed_label = last_boxed(label)
    reference = boxed_label if boxed_label is not None else label
    return 1.0 if answers_match(last_boxed(response), reference, timeout=timeout) else 0.0
