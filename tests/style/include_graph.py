#!/usr/bin/env python3
"""The include graph between traind's modules, checked: no cycle between modules, and every
include points down the layers (base under the engine, the engine under the service, the service
under the API, all of them under the programs and clients).

A module is a source folder (trainer/gpu/cuda counts as trainer/gpu, whose backend it is). Run
from anywhere: python3 tests/style/include_graph.py [--dot FILE] [--quiet]. Prints the modules
with their files and lines, the arrows between them, and each problem; exits 1 on a problem.
Written by hand: a hundred lines of Python, where a tool such as cinclude2dot would draw the
graph but not check our layering rules."""
import argparse
import os
import re
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
# Layers, lowest first: a module may include its own layer's modules (without a cycle) and
# lower layers', never a higher layer's. A folder is in the first layer whose prefix it has.
LAYERS = [
    ("base", ["base"]),
    ("engine", ["trainer"]),
    ("service", ["service"]),
    ("api", ["api"]),
    ("programs", ["programs", "clients", "bench", "tests"]),
]
# where "x/y.h" is looked up besides the including file's folder (the targets' include dirs)
SEARCH = ["", "trainer", "base"]
SOURCES = (".c", ".h", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def tracked_files():
    out = subprocess.run(["git", "-C", ROOT, "ls-files"], capture_output=True, text=True,
                         check=True).stdout.split()
    return [f for f in out if f.endswith(SOURCES) and "node_modules/" not in f]


def module_of(path):
    folder = os.path.dirname(path)
    if folder.startswith("trainer/gpu/"):
        return "trainer/gpu"
    return folder


def layer_of(module):
    for i, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or module.startswith(p + "/") for p in prefixes):
            return i
    return len(LAYERS) - 1


def resolve(including, name, files):
    here = os.path.dirname(including)
    for base in [here] + SEARCH:
        cand = os.path.normpath(os.path.join(base, name))
        if cand in files:
            return cand
    return None  # a generated header (the protobuf's) or a system one in quotes


def sccs(nodes, edges):
    """Tarjan's strongly connected components: the cycles, as sets of modules."""
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
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dot", help="also write the module graph for Graphviz here")
    ap.add_argument("--quiet", action="store_true", help="print problems only")
    args = ap.parse_args()
    files = set(tracked_files())
    edges, why, sizes = {}, {}, {}
    for f in sorted(files):
        with open(os.path.join(ROOT, f), encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        m = module_of(f)
        n, lines = sizes.get(m, (0, 0))
        sizes[m] = (n + 1, lines + text.count("\n"))
        for name in INCLUDE.findall(text):
            target = resolve(f, name, files)
            if not target:
                continue
            t = module_of(target)
            if t != m:
                edges.setdefault(m, set()).add(t)
                why.setdefault((m, t), "%s includes %s" % (f, target))
    problems = []
    for (a, b), example in sorted(why.items()):
        if layer_of(b) > layer_of(a):
            problems.append("upward include: %s (%s) -> %s (%s): %s"
                            % (a, LAYERS[layer_of(a)][0], b, LAYERS[layer_of(b)][0], example))
    for comp in sccs(set(sizes), edges):
        arrows = ["%s -> %s (%s)" % (a, b, why[(a, b)]) for a in sorted(comp)
                  for b in sorted(edges.get(a, ())) if b in comp]
        problems.append("cycle between %s:\n    %s" % (", ".join(sorted(comp)),
                                                      "\n    ".join(arrows)))
    if not args.quiet:
        print("modules (layer, files, lines):")
        for m in sorted(sizes, key=lambda m: (layer_of(m), m)):
            print("  %-22s %-9s %4d %6d" % (m, LAYERS[layer_of(m)][0], *sizes[m]))
        print("arrows:")
        for a in sorted(edges, key=lambda m: (layer_of(m), m)):
            print("  %s -> %s" % (a, ", ".join(sorted(edges[a]))))
    if args.dot:
        with open(args.dot, "w") as fh:
            fh.write("digraph traind {\n  rankdir=BT;\n")
            for a in sorted(edges):
                for b in sorted(edges[a]):
                    fh.write('  "%s" -> "%s";\n' % (a, b))
            fh.write("}\n")
    for p in problems:
        print("include_graph: " + p)
    if problems:
        print("include_graph: %d problem%s" % (len(problems), "" if len(problems) == 1 else "s"))
        return 1
    if not args.quiet:
        print("include_graph: no cycle between modules, no upward include")
    return 0


if __name__ == "__main__":
    sys.exit(main())
