#!/usr/bin/env python3
"""Import circles between the module files of one Rust crate (stdlib only).

  python3 scripts/module-cycles.py CRATE/src [--allow MODULE]...

Builds a graph with one node per module file (`lib.rs` is `crate`, `copy/mod.rs` is `copy`,
`copy/walk.rs` is `copy::walk`) and an edge A -> B when A's code names an item that B
defines: `use crate::…`, `use super::…`, `use child::…` and the same paths written inline.
A path is followed through re-exports (`pub use`, and the private `use` a child reaches
through `super::`) to the file that defines the item, so `crate::Error` is an edge to
`error`, not to `crate`. A re-export by itself is not an edge (a facade that names its
children is not a circle), nor is a `mod` declaration; `#[cfg(test)] mod … { }` blocks
are left out. Paths into other crates are ignored.

Prints each circle (a strongly connected component of more than one file) with its files
and the edges inside it. Exits 1 when a circle has a file outside every allowed module: with
`--allow copy`, a circle made only of `copy` and `copy::*` files is allowed (and at most one
such circle may exist per allowed module).
"""
import argparse
import os
import re
import sys
from collections import defaultdict


def strip_comments_and_strings(text):
    """The code with comments and string literals blanked (newlines kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif (m := re.match(r'b?r(#*)"', text[i:i + 12])) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            end = '"' + m.group(1)
            j = text.find(end, i + m.end())
            j = n if j < 0 else j + len(end)
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j + 1
        elif c == "'" and (m := re.match(r"'(\\.[^']*|[^\\'])'", text[i:i + 12])):
            out.append("' '")
            i += m.end()
        else:
            out.append(c)
            i += 1
    return "".join(out)


def strip_test_blocks(code):
    """`#[cfg(test)] mod name { … }` removed (brace-matched)."""
    while m := re.search(r"#\[cfg\(test\)\]\s*(pub(\([^)]*\))?\s+)?mod\s+\w+\s*\{", code):
        depth, j = 1, m.end()
        while j < len(code) and depth:
            depth += {"{": 1, "}": -1}.get(code[j], 0)
            j += 1
        code = code[:m.start()] + code[j:]
    return code


def split_top(s, sep=","):
    parts, depth, cur = [], 0, []
    for ch in s:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def expand_use_tree(tree, prefix=()):
    """`a::{b, c::d as e, self}` -> [(path, name)]; a glob has name '*'."""
    tree = tree.strip()
    if "{" in tree:
        head, rest = tree.split("{", 1)
        head = tuple(s for s in head.strip().rstrip(":").split("::") if s)
        inner = rest[: rest.rfind("}")]
        out = []
        for part in split_top(inner):
            out += expand_use_tree(part, prefix + head)
        return out
    alias = None
    if " as " in tree:
        tree, alias = [s.strip() for s in tree.split(" as ", 1)]
    segs = tuple(s.strip() for s in tree.split("::") if s.strip())
    if segs and segs[-1] == "self":
        segs = segs[:-1]
    path = prefix + segs
    if not path:
        return []
    return [(path, alias or path[-1])]


class Crate:
    def __init__(self, src):
        self.files = {}  # module path (tuple) -> file
        for root, _, names in os.walk(src):
            for name in names:
                if not name.endswith(".rs"):
                    continue
                rel = os.path.relpath(os.path.join(root, name), src)
                parts = rel[:-3].split(os.sep)
                if parts[-1] in ("mod", "lib", "main") and (len(parts) > 1 or parts[-1] != "mod"):
                    parts = parts[:-1]
                if parts and parts[0] == "bin":
                    continue
                if rel == "main.rs" and os.path.exists(os.path.join(src, "lib.rs")):
                    # A binary beside a library is a crate of its own (it names the library
                    # by the crate's name, not `crate::`).
                    continue
                self.files[tuple(parts)] = rel
        self.code = {}
        self.imports = {}  # module -> {name: (absolute path or None, is_pub)}
        self.uses = {}  # module -> [(path, is_pub)]
        for mod, rel in self.files.items():
            with open(os.path.join(src, rel), encoding="utf-8") as f:
                code = strip_test_blocks(strip_comments_and_strings(f.read()))
            uses = []
            for m in re.finditer(r"(?<![\w:])(pub(\s*\([^)]*\))?\s+)?use\s+([^;]+);", code):
                for path, name in expand_use_tree(m.group(3)):
                    uses.append((path, name, bool(m.group(1))))
            self.uses[mod] = uses
            self.code[mod] = re.sub(r"(?<![\w:])(pub(\s*\([^)]*\))?\s+)?use\s+[^;]+;", "", code)
            self.imports[mod] = {name: (path, pub) for path, name, pub in uses if name != "*"}

    def start(self, mod, first):
        """The module a path's first segment names, from inside `mod` (None: another crate)."""
        if first == "crate":
            return ()
        if first == "super":
            return mod[:-1]
        if first == "self":
            return mod
        if mod + (first,) in self.files:
            return mod + (first,)
        return None

    def resolve(self, mod, path, seen=None):
        """The module file that defines what `path` (written in `mod`) names, or None."""
        seen = seen or set()
        if (mod, path) in seen:
            return None
        seen.add((mod, path))
        cur = self.start(mod, path[0])
        rest = path[1:]
        if cur is None:
            imp = self.imports[mod].get(path[0]) if mod in self.imports else None
            if imp is None or imp[0] == path[:1]:
                return None
            return self.resolve(mod, imp[0] + path[1:], seen)
        while path[0] == "super" and rest and rest[0] == "super":
            cur, rest = cur[:-1], rest[1:]
        for i, seg in enumerate(rest):
            if cur + (seg,) in self.files:
                cur = cur + (seg,)
                continue
            imp = self.imports.get(cur, {}).get(seg)
            if imp is not None:
                # What `cur` takes from another crate is, to this one, `cur`'s.
                return self.resolve(cur, imp[0] + rest[i + 1:], seen) or cur
            return cur
        return cur

    def graph(self):
        edges = defaultdict(set)
        for mod in self.files:
            paths = [p for p, _name, pub in self.uses[mod] if not pub]
            heads = {"crate", "super", "self"} | {c[-1] for c in self.files if c[:-1] == mod and c}
            heads |= {n for n in self.imports[mod]}
            for m in re.finditer(r"(?<![\w:])([A-Za-z_]\w*)((?:\s*::\s*[A-Za-z_]\w*)+)", self.code[mod]):
                if m.group(1) in heads:
                    paths.append((m.group(1),) + tuple(s.strip() for s in m.group(2).split("::") if s.strip()))
            for path in paths:
                target = self.resolve(mod, path)
                if target is not None and target != mod and target in self.files:
                    edges[mod].add(target)
        return edges


def sccs(nodes, edges):
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return [c for c in out if len(c) > 1]


def name(mod):
    return "::".join(mod) or "crate"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("src", help="a crate's src directory, e.g. engine/src")
    ap.add_argument("--allow", action="append", default=[], metavar="MODULE",
                    help="one circle made only of this module and its children is allowed")
    args = ap.parse_args()
    crate = Crate(args.src)
    edges = crate.graph()
    cycles = sccs(crate.files, edges)
    allowed_used = defaultdict(int)
    bad = 0
    for comp in sorted(cycles, key=lambda c: (-len(c), c)):
        inside = set(comp)
        owner = next((a for a in args.allow
                      if all(name(m) == a or name(m).startswith(a + "::") for m in comp)), None)
        if owner is not None:
            allowed_used[owner] += 1
        ok = owner is not None and allowed_used[owner] == 1
        bad += not ok
        print(f"{'allowed' if ok else 'CYCLE'}: {len(comp)} files: {', '.join(name(m) for m in comp)}")
        for m in comp:
            out = sorted(name(t) for t in edges[m] if t in inside)
            print(f"    {name(m)} -> {', '.join(out)}")
    print(f"{args.src}: {len(crate.files)} module files, {len(cycles)} circle(s), {bad} not allowed")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
