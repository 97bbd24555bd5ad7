"""Text forms a tool is embedded as."""
import re
from collections import Counter

from common import split_words

_sent = re.compile(r"(?<=[.!?])\s+")


def name_spaced(t):
    return " ".join(split_words(t["name"]))


def desc(t):
    return " ".join((t.get("description") or "").split())


def sentences(text):
    return [s for s in _sent.split(text) if s.strip()]


def boilerplate(tools, min_count=20):
    """Sentences that recur across >= min_count tools (e.g. twilio's 'This is the public
    Twilio REST API.'): catalogue-wide noise, found from the catalogue, not per server."""
    c = Counter()
    for _, t in tools:
        c.update(set(sentences(desc(t))))
    return {s for s, n in c.items() if n >= min_count}


def make_forms(tools):
    bp = boilerplate(tools)

    def clean(t):
        return " ".join(s for s in sentences(desc(t)) if s not in bp)

    def first(t):
        ss = sentences(clean(t))
        return ss[0] if ss else ""

    return {
        "A server+name: desc": lambda s, t: f"{s} {name_spaced(t)}: {desc(t)}",
        "B name. first sentence": lambda s, t: f"{name_spaced(t)}. {first(t)}",
        "C name: desc": lambda s, t: f"{name_spaced(t)}: {desc(t)}",
        "D name only": lambda s, t: name_spaced(t),
        "E server+name: first sentence": lambda s, t: f"{s} {name_spaced(t)}: {first(t)}",
        "F server+name: clean desc": lambda s, t: f"{s} {name_spaced(t)}: {clean(t)}",
        "G server+name: clean desc[:300]": lambda s, t: f"{s} {name_spaced(t)}: {clean(t)[:300]}",
    }
