#!/usr/bin/env python3
"""Fails when the modules of a crate import each other in a circle.

Each crate's modules (one per file under src/) must form layers: a module may use the ones
below it, never one that uses it back, directly or through others. A circle means two
concerns that cannot be read, tested or changed apart. Edges are `crate::` and `super::`
paths in code (comments and tests left out); a module's use of its own parent is not an
edge (the parent is its namespace).

Usage: scripts/import_cycles.py [crate directory ...]  (default: every crate under crates/)
"""
import os
import re
import sys


def modules(src):
    """Module path (`a::b`) -> file, for every .rs file under `src`."""
    found = {}
    for root, _, files in os.walk(src):
        for name in files:
            if not name.endswith(".rs"):
                continue
            path = os.path.join(root, name)
            parts = os.path.relpath(path, src)[:-3].split(os.sep)
            if parts[-1] in ("mod", "lib", "main"):
                parts = parts[:-1]
            found["::".join(parts)] = path
    return found


def resolve(mods, path):
    """The longest module prefix of `path`, or '' for the crate root."""
    parts = path.split("::")
    while parts:
        if "::".join(parts) in mods:
            return "::".join(parts)
        parts.pop()
    return ""


def code_of(path):
    text = open(path, encoding="utf-8").read().split("#[cfg(test)]")[0]
    lines = (line.split("//")[0] for line in text.split("\n"))
    return "\n".join(re.sub(r'"(?:[^"\\]|\\.)*"', '""', line) for line in lines)


def edges(mods):
    graph = {module: set() for module in mods}
    for module, path in mods.items():
        code = code_of(path)
        parent = module.split("::")[:-1]
        targets = [resolve(mods, m.strip(":")) for m in re.findall(r"\bcrate::([A-Za-z_:]+)", code)]
        targets += [resolve(mods, "::".join(parent + [m.strip(":")])) for m in re.findall(r"\bsuper::([A-Za-z_:]+)", code)]
        for target in targets:
            if target and target != module and not module.startswith(target + "::"):
                graph[module].add(target)
    return graph


def circles(graph):
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def main():
    crates = sys.argv[1:] or sorted(
        os.path.join("crates", name) for name in os.listdir("crates") if os.path.isdir(os.path.join("crates", name, "src"))
    )
    failed = False
    for crate in crates:
        graph = edges(modules(os.path.join(crate, "src")))
        for component in circles(graph):
            failed = True
            print(f"{crate}: these modules import each other in a circle: {', '.join(component)}")
            for module in component:
                print(f"  {module} -> {', '.join(sorted(t for t in graph[module] if t in component))}")
    if failed:
        sys.exit(1)
    print(f"import circles: none in {len(crates)} crates")


if __name__ == "__main__":
    main()
