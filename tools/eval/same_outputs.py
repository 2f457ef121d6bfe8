"""Whether two runs of tools/eval/eval.mjs (their --json files) produced the
same outputs byte for byte: every assistant message of every task (content,
reasoning, each tool call's id, name and arguments, the finish reason and
the completion token count), task by task, variant by variant, tier by tier.
The daemon draws tool-call ids from the request's seed (and the prompt), at
random without one; runs to be compared send the same seed (eval.mjs
--extra-body '{"seed":1}'), since an id goes back into the next turn's prompt.

  /usr/bin/python3 tools/eval/same_outputs.py A.json B.json [--min-tasks N]

Exit status 0 when they agree and at least N tasks (default 1) were compared
in each; 1 with the first difference printed otherwise. A task that ended in
an error (a refused or failed request) fails the comparison: an error on both
sides would otherwise compare equal without any output having been produced.
"""

import argparse
import json
import sys


def load(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)["details"]


def first_difference(a, b):
    """The first field where turn lists a and b differ, as text, or None."""
    if len(a) != len(b):
        return f"{len(a)} turns against {len(b)}"
    for i, (x, y) in enumerate(zip(a, b)):
        for key in sorted(set(x) | set(y)):
            if x.get(key) != y.get(key):
                return f"turn {i}, {key}: {json.dumps(x.get(key))} against {json.dumps(y.get(key))}"
    return None


def compare(a, b, min_tasks):
    """Returns (tasks compared, turns compared, list of problems)."""
    problems, tasks, turns = [], 0, 0
    if sorted(a) != sorted(b):
        return 0, 0, [f"variants {sorted(a)} against {sorted(b)}"]
    for variant in sorted(a):
        if sorted(a[variant]) != sorted(b[variant]):
            problems.append(f"{variant}: tiers {sorted(a[variant])} against {sorted(b[variant])}")
            continue
        for tier in sorted(a[variant]):
            left, right = a[variant][tier], b[variant][tier]
            if len(left) != len(right):
                problems.append(f"{variant} {tier}: {len(left)} tasks against {len(right)}")
                continue
            if len(left) < min_tasks:
                problems.append(f"{variant} {tier}: {len(left)} tasks, fewer than {min_tasks}")
            for i, (x, y) in enumerate(zip(left, right)):
                where = f"{variant} {tier} task {i} ({x.get('question', '')[:60]!r})"
                for side, r in (("first", x), ("second", y)):
                    if r.get("error"):
                        problems.append(f"{where}: the {side} run failed: {r['error']}")
                    if "turns" not in r:
                        problems.append(f"{where}: the {side} run recorded no turns (an eval.mjs without them?)")
                diff = first_difference(x.get("turns", []), y.get("turns", []))
                if diff:
                    problems.append(f"{where}: {diff}")
                tasks += 1
                turns += len(x.get("turns", []))
    return tasks, turns, problems


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("first")
    ap.add_argument("second")
    ap.add_argument("--min-tasks", type=int, default=1)
    a = ap.parse_args()
    tasks, turns, problems = compare(load(a.first), load(a.second), a.min_tasks)
    if problems:
        print(f"same_outputs: {len(problems)} difference(s) between {a.first} and {a.second}; the first 5:")
        for p in problems[:5]:
            print("  " + p)
        return 1
    print(f"same_outputs: {tasks} tasks, {turns} assistant messages, identical")
    return 0


if __name__ == "__main__":
    sys.exit(main())
