#!/usr/bin/env python3
"""Calls between the files of one module, checked: no cycle, so that each module of the service
reads bottom-up (its private header lists its files lowest first) and a file can be understood
with only the ones below it. include_graph.py checks the modules; this checks inside them.

A call is a file naming, followed by "(", a function another file of the same module defines
with external linkage (Universal Ctags' view; static functions, comments and strings are left
out). Scope: base, service/* and api, the layers a request goes through. The engine is left
out: its transports dispatch both ways by design (td_comm.c and td_comm_shm.c).

Run from anywhere: python3 tests/style/call_graph.py [--quiet]. Prints each module's files and
arrows, and each cycle with one call per arrow; exits 1 on a cycle. Written by hand for the
same reason as include_graph.py, whose component finder it reuses."""
import argparse
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import include_graph  # noqa: E402 (the folder is put on the path first)

ROOT = include_graph.ROOT
SCOPE = ("base", "service/", "api")
COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*|\"(?:\\.|[^\"\\])*\"", re.S)


def ctags_program():
    for name in ("ctags-universal", "ctags"):
        for folder in os.environ.get("PATH", "").split(os.pathsep):
            if os.access(os.path.join(folder, name), os.X_OK):
                return name
    sys.exit("call_graph: ctags (Debian's universal-ctags) is not installed")


def definitions(ctags, files):
    """Each function with external linkage: its file."""
    out = subprocess.run([ctags, "--kinds-C=f", "--fields=+S", "--language-force=C", "-o", "-"]
                         + [os.path.join(ROOT, f) for f in files],
                         capture_output=True, text=True, check=True).stdout
    defined = {}
    for line in out.splitlines():
        fields = line.split("\t")
        if any(f.startswith("file:") for f in fields[3:]):
            continue  # static
        defined[fields[0]] = os.path.relpath(fields[1], ROOT)
    return defined


def module_graph(ctags, files):
    defined = definitions(ctags, files)
    edges, why = {}, {}
    for f in files:
        with open(os.path.join(ROOT, f), encoding="utf-8", errors="replace") as fh:
            text = COMMENT.sub(" ", fh.read())
        for name in set(re.findall(r"\b([A-Za-z_]\w*)\s*\(", text)):
            target = defined.get(name)
            if target and target != f:
                edges.setdefault(f, set()).add(target)
                why.setdefault((f, target), name)
    return edges, why


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quiet", action="store_true", help="print problems only")
    args = ap.parse_args()
    ctags = ctags_program()
    modules = {}
    for f in include_graph.tracked_files():
        m = include_graph.module_of(f)
        if f.endswith(".c") and (m == "api" or m.startswith(SCOPE)):
            modules.setdefault(m, []).append(f)
    problems = []
    for m in sorted(modules):
        files = sorted(modules[m])
        edges, why = module_graph(ctags, files)
        if not args.quiet:
            print("%s: %d files, %d arrows" % (m, len(files), sum(map(len, edges.values()))))
        for comp in include_graph.sccs(set(files), edges):
            arrows = ["%s -> %s (calls %s)" % (a, b, why[(a, b)]) for a in sorted(comp)
                      for b in sorted(edges.get(a, ())) if b in comp]
            problems.append("cycle of calls in %s:\n    %s" % (m, "\n    ".join(arrows)))
    for p in problems:
        print("call_graph: " + p)
    if not problems:
        print("call_graph: no cycle of calls between the files of a module (%d modules)"
              % len(modules))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
