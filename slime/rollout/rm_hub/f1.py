"""Token-level F1 between a response and a reference answer, after normalisation."""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize_text(text: str) -> str:
    """Lower case, no punctuation, no articles, single spaces."""
    text = text.lower().translate(_PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def f1_score(prediction: str, reference: str) -> float:
    """Harmonic mean of token precision and recall (tokens counted with multiplicity)."""
    pred, ref = normalize_text(prediction).split(), normalize_text(reference).split()
    if not pred or not ref:
        # Two empty answers agree; one empty answer shares nothing.
        return float(pred == ref)
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def grade_f1(response: str, label: str | Sequence[str]) -> float:
    """Best F1 of `response` against the label, or against any of several labels."""
    labels = [label] if isinstance(label, str) else list(label)
    if not labels:
        raise ValueError("f1 needs at least one reference answer")
    return max(f1_score(response, ref) for ref in labels)
