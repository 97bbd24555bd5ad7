#!/usr/bin/env python3
"""Generates the corpus's emoji-heavy types, `emoji-only` and `emoji-heavy-chat`, into
`text/fit/` and `text/held/` (see README.md).

Synthetic, as `emoji-chat` is: no real chat log is on the machine. Unlike `emoji-chat`
(mostly common faces, hands and hearts), emoji are drawn from everywhere people use them:
a third common ones, the rest from anywhere in the emoji and symbol blocks (Unicode 14),
with skin tones, ZWJ sequences, flags, keycaps and variation selectors. Each half has its
own seeds and its own base text (the man pages of its own half of `man-en`), so the
held-out files share no line with the fitted ones. Deterministic: run it again and the
files are the same.

    python3 elision/tests/corpus/emoji.py
"""

import glob
import os
import random
import unicodedata

HERE = os.path.dirname(os.path.abspath(__file__))
LIMIT = 8 * 1024

COMMON = [chr(c) for c in range(0x1F600, 0x1F64F + 1)] + [
    "\U0001F44D", "\u2764\ufe0f", "\U0001F525", "\U0001F389", "\u2705", "\U0001F680",
    "\U0001F440", "\U0001F64F", "\U0001F44F", "\U0001F4AF", "\u2728", "\U0001F914",
    "\U0001F923", "\U0001F970", "\U0001F60D", "\U0001F622", "\U0001F605", "\U0001F44B",
    "\U0001F49C", "\U0001F499", "\U0001F49A", "\U0001F49B", "\U0001F5A4", "\u2b50",
    "\U0001F31F", "\U0001F4AA", "\U0001F91D", "\U0001F937", "\U0001F926", "\U0001F973",
    "\U0001F92F", "\U0001F97A", "\U0001F631", "\U0001F60E", "\U0001F913", "\u26a1",
    "\u2600\ufe0f", "\U0001F308", "\U0001F355", "\U0001F37A", "\u2615", "\U0001F4A9",
]
ANYWHERE = [
    chr(c)
    for lo, hi in [(0x1F300, 0x1FAFF), (0x2600, 0x27BF), (0x1F000, 0x1F2FF), (0x2B00, 0x2BFF)]
    for c in range(lo, hi + 1)
    if unicodedata.name(chr(c), "") and unicodedata.category(chr(c)) == "So"
]
PEOPLE = [chr(c) for c in [0x1F466, 0x1F467, 0x1F468, 0x1F469, 0x1F474, 0x1F475, 0x1F46E,
                           0x1F477, 0x1F9D1, 0x1F44B, 0x1F44D, 0x1F44E, 0x1F44C, 0x1F64C,
                           0x1F64B, 0x1F645, 0x1F646, 0x1F647, 0x1F483, 0x1F57A, 0x1F3C3]]
JOBS = [chr(c) for c in [0x1F4BB, 0x1F52C, 0x1F680, 0x1F692, 0x1F373, 0x1F33E, 0x1F3A8,
                         0x1F3EB, 0x1F3ED, 0x1F4BC, 0x1F527, 0x2695, 0x2696, 0x2708]]
SKIN = [chr(c) for c in range(0x1F3FB, 0x1F3FF + 1)]
COUNTRIES = ["US", "GB", "DE", "FR", "JP", "CN", "IN", "BR", "UA", "PL", "ES", "IT", "NL",
             "SE", "NO", "FI", "KR", "MX", "AR", "CA", "AU", "NZ", "ZA", "NG", "EG", "TR",
             "IL", "PT", "GR", "IE", "CH", "AT", "BE", "DK", "CZ", "VN", "TH", "ID", "PH"]


def flag(code):
    return "".join(chr(0x1F1E6 + ord(ch) - ord("A")) for ch in code)


def sequence(r):
    x = r.random()
    if x < 0.3:
        return r.choice(PEOPLE) + r.choice(SKIN)
    if x < 0.55:
        person = r.choice([chr(0x1F468), chr(0x1F469), chr(0x1F9D1)])
        tone = r.choice(SKIN) if r.random() < 0.4 else ""
        return person + tone + "\u200d" + r.choice(JOBS) + ("\ufe0f" if r.random() < 0.3 else "")
    if x < 0.7:
        members = [r.choice([chr(0x1F468), chr(0x1F469)]) for _ in range(2)]
        members += [r.choice([chr(0x1F466), chr(0x1F467)]) for _ in range(r.randrange(1, 3))]
        return "\u200d".join(members)
    if x < 0.9:
        return flag(r.choice(COUNTRIES))
    return r.choice("0123456789#*") + "\ufe0f\u20e3"


def one(r):
    x = r.random()
    if x < 0.35:
        return r.choice(COMMON)
    if x < 0.8:
        ch = r.choice(ANYWHERE)
        return ch + "\ufe0f" if ord(ch) < 0x3000 and r.random() < 0.5 else ch
    return sequence(r)


def cut(text):
    if len(text.encode()) <= LIMIT:
        return text
    out, size = [], 0
    for line in text.splitlines(keepends=True):
        n = len(line.encode())
        if size + n > LIMIT:
            break
        out.append(line)
        size += n
    return "".join(out)


def emoji_only(r):
    lines = []
    for _ in range(2000):
        sep = " " if r.random() < 0.5 else ""
        lines.append(sep.join(one(r) for _ in range(r.randrange(1, 21))))
    return cut("\n".join(lines) + "\n")


def heavy_chat(r, source):
    words = open(source, encoding="utf-8").read().split()
    names = ["ana", "ben", "chidi", "dmitri", "eun-ji", "farah", "gus", "hana"]
    lines = []
    at = 0
    for j in range(2000):
        out = []
        for _ in range(r.randrange(2, 10)):
            if r.random() < 0.45:
                out.append("".join(one(r) for _ in range(r.choice([1, 1, 2, 3, 5]))))
            else:
                out.append(words[at % len(words)])
                at += 1
        lines.append(f"[{9 + j // 60:02}:{j % 60:02}] {r.choice(names)}: {' '.join(out)}")
    return cut("\n".join(lines) + "\n")


def main():
    for half, seed in [("fit", 1000), ("held", 2000)]:
        sources = sorted(glob.glob(os.path.join(HERE, "text", half, "man-en", "*.txt")))
        for kind, make in [("emoji-only", None), ("emoji-heavy-chat", None)]:
            os.makedirs(os.path.join(HERE, "text", half, kind), exist_ok=True)
        for i, source in enumerate(sources[:2]):
            name = os.path.basename(source)
            r = random.Random(seed + i)
            with open(os.path.join(HERE, "text", half, "emoji-only", f"set{i}.txt"), "w", encoding="utf-8") as f:
                f.write(emoji_only(r))
            with open(os.path.join(HERE, "text", half, "emoji-heavy-chat", name), "w", encoding="utf-8") as f:
                f.write(heavy_chat(r, source))


if __name__ == "__main__":
    main()
