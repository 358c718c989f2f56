#!/usr/bin/env python3
"""Pre-tokenizer splits by Python's `regex`, as llama.cpp's `unicode_regex_split` makes them.

Reads JSON `{"pattern_lists": [[pattern, ...], ...], "texts": [text, ...]}` on stdin and
prints `{"splits": [[[piece, ...] per text] per list]}`. Each pattern of a list splits every
piece the previous ones left into its matches and the stretches between them; an empty match
splits nothing. The patterns are llama.cpp's strings (or, for a trigger of one of its own
matchers, the pattern that matcher was written after), compiled by `regex` unchanged.
"""
import json
import sys

import regex


def split(patterns, text):
    pieces = [text]
    for pattern in patterns:
        out = []
        for piece in pieces:
            last = 0
            for m in pattern.finditer(piece):
                if m.start() == m.end():
                    continue
                if m.start() > last:
                    out.append(piece[last : m.start()])
                out.append(m.group())
                last = m.end()
            if last < len(piece):
                out.append(piece[last:])
        pieces = out
    return pieces


def main():
    request = json.load(sys.stdin)
    texts = request["texts"]
    splits = []
    for patterns in request["pattern_lists"]:
        # `&&` is class intersection (Kimi K2's pattern, written for tiktoken) only in the
        # module's version 1 syntax.
        compiled = [regex.compile(("(?V1)" if "&&" in p else "") + p) for p in patterns]
        splits.append([split(compiled, t) for t in texts])
    json.dump({"splits": splits}, sys.stdout)


if __name__ == "__main__":
    main()
