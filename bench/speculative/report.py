"""One row of bench/speculative/run.sh: a mode's accuracy, decode tokens/s
from the /metrics difference (per sequence), its ratio to the `off` row of
the same round, end-to-end completion tokens/s, and its drafts."""
import json
import sys


def samples(path):
    out = {}
    for line in open(path):
        if line.startswith("#") or not line.strip():
            continue
        name, value = line.rsplit(" ", 1)
        out[name] = float(value)
    return out


mode, before_path, after_path, eval_json, off_rate_path = sys.argv[1:6]
before, after = samples(before_path), samples(after_path)
delta = lambda key: after.get(key, 0.0) - before.get(key, 0.0)
count, seconds = delta("moe_inter_token_latency_seconds_count"), delta("moe_inter_token_latency_seconds_sum")
rate = count / seconds if seconds > 0 else 0.0
if mode == "off":
    open(off_rate_path, "w").write(str(rate))
try:
    off = float(open(off_rate_path).read())
except OSError:
    off = 0.0
summary = json.load(open(eval_json))["summary"]
accuracy = "%.1f%%" % next(iter(next(iter(summary["accuracy"].values())).values()))
# End to end: every completion token over the run's wall time (prefill,
# tool round trips and client included), the figure for many at a time.
overall = summary["completion_tokens"] / summary["seconds"]
drafts = []
for kind in ("lookup", "mtp"):
    n = delta('moe_speculative_drafts_total{kind="%s"}' % kind)
    if n <= 0:
        continue
    proposed = delta('moe_speculative_draft_tokens_total{kind="%s",outcome="proposed"}' % kind)
    accepted = delta('moe_speculative_draft_tokens_total{kind="%s",outcome="accepted"}' % kind)
    drafts.append("%s: %d, %d, %d (%.0f%%, %.2f a draft)" % (kind, n, proposed, accepted, 100 * accepted / max(proposed, 1), accepted / n))
print("%-7s %9s %14.1f %8s %14.1f  %s" % (mode, accuracy, rate, ("%.2fx" % (rate / off)) if off > 0 else "-", overall,
                                         "; ".join(drafts) or "none"))
