"""Applies a unified diff (paths a/... b/..., as `git diff` writes them) to the tree in the current folder, the
same way on every machine, the GPU machine included, which has neither `patch` nor `git` (bench/nv_dev/ab.sh and
queue.sh apply patches with it). Every hunk's context must match exactly, at its stated line or moved from it (an
offset, as after another patch); on any mismatch nothing is written and the exit status is 1.
usage: python3 bench/nv_dev/apply_patch.py PATCH"""
import re
import sys


def find(old, expect, start, pos):
    """Where the hunk's old lines stand in old: at its stated line or the nearest line to it (as `patch` allows an
    offset when an earlier change moved them), never before pos, where the previous hunk ended."""
    for delta in range(len(old) + 1):
        for at in (start + delta, start - delta):
            if pos <= at <= len(old) - len(expect) and old[at:at + len(expect)] == expect:
                return at
    return None


def main(path):
    out, lines, i = {}, open(path).read().split("\n"), 0
    while i < len(lines):
        if not lines[i].startswith("--- "):
            i += 1
            continue
        name = lines[i + 1][4:].split("\t")[0]
        name = name[2:] if name.startswith("b/") else name
        old = out.get(name)
        if old is None:
            try:
                old = open(name).read().split("\n")
            except FileNotFoundError:
                old = []
        new, pos, i = [], 0, i + 2
        while i < len(lines) and lines[i].startswith("@@"):
            start = int(re.match(r"@@ -(\d+)", lines[i]).group(1))
            start = start - 1 if start > 0 else 0
            body, i = [], i + 1
            while i < len(lines) and lines[i][:1] in (" ", "-", "+", "\\") and not lines[i].startswith("--- "):
                body.append((lines[i][:1], lines[i][1:]))
                i += 1
            expect = [text for tag, text in body if tag in " -"]
            at = find(old, expect, start, pos)
            if at is None:
                sys.exit("%s: hunk at line %d does not match" % (name, start + 1))
            new += old[pos:at] + [text for tag, text in body if tag in " +"]
            pos = at + len(expect)
        out[name] = new + old[pos:]
    for name, text in out.items():
        open(name, "w").write("\n".join(text))


if __name__ == "__main__":
    main(sys.argv[1])
