"""A small word-piece vocabulary for synthetic token streams, most frequent pieces first.

Pieces look like a BPE tokenizer's: whole words with their leading space, bare sub-word
pieces, punctuation and newlines, numbers, and some multi-byte UTF-8 (accents, typographic
punctuation, CJK, emoji) so that byte and character counts differ as they do in real text.
"""

from __future__ import annotations

from typing import Final

_WORDS: Final = (
    "the of and to a in is that for it as with was on be by this are or at from an have not "
    "which but they you can more will one all their has been if would there we about so were "
    "what when other into some also only time new any these may than its use then two first "
    "model data each how like where most used over such should between could through many "
    "after well because very those same both while before number however during without "
    "example system value result output input token layer attention request latency server "
    "client stream response batch memory compute network serialization throughput protocol "
    "inference training weight gradient vector matrix tensor embedding sequence context "
    "function return string integer float bytes buffer message schema field version "
    "answer question explain reason step think therefore simple important different large "
    "small high low fast slow better worse measure test case point order level form part "
    "people world year day way thing man woman life child work school home water city"
).split()
_SUBWORDS: Final = (
    "ing ed er ly tion s es al ment ness able ic ous ive ize ful less est ity ence ance "
    "pre un re dis in im con com ex de inter trans sub super ation ations ically"
).split()
_PUNCTUATION: Final = (".", ",", ":", ";", "?", "!", "(", ")", '"', "'", "-", "\n", "\n\n",
                       " -", " (", "...", " =", " +", "`", "```")
_NUMBERS: Final = tuple(str(n) for n in range(10)) + (" 1", " 2", " 10", " 100", " 2024")
_MULTIBYTE: Final = (" café", "é", " naïve", "’s", " —", "“", "”", " résumé", " 東京",
                     "中文", " 😊", "→", " µs", "°C", " Zürich", "ß", " Ω")


def pieces() -> tuple[str, ...]:
    """The vocabulary, roughly in order of decreasing frequency."""
    words = [" " + w for w in _WORDS]
    out: list[str] = []
    # Interleave so that punctuation and sub-words are frequent too, as in real text.
    for i, word in enumerate(words):
        out.append(word)
        if i < len(_PUNCTUATION):
            out.append(_PUNCTUATION[i])
        if i < len(_SUBWORDS):
            out.append(_SUBWORDS[i])
    out += [w.capitalize().lstrip() for w in _WORDS[:60]]
    out += _NUMBERS
    out += _MULTIBYTE
    return tuple(out)
