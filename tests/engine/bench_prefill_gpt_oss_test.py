"""bench_prefill --model on a gpt-oss checkpoint directory (Hugging Face
layout, written by tools/reference/gpt_oss.py): it loads, prefills in the
chunks asked and prints every run and the median against the work's FLOPs;
a checkpoint it cannot take is refused with the reason.

  python3 bench_prefill_gpt_oss_test.py --bench PATH --source DIR --workdir DIR
"""
import argparse
import os
import re
import shutil
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True)
    ap.add_argument("--source", required=True)
    ap.add_argument("--workdir", required=True)
    a = ap.parse_args()
    shutil.rmtree(a.workdir, ignore_errors=True)
    os.makedirs(a.workdir)
    model = os.path.join(a.workdir, "gpt-oss")
    subprocess.run([sys.executable, os.path.join(a.source, "tools", "reference", "gpt_oss.py"), "write", "--out", model,
                    "--layers", "2", "--window", "4", "--vocab", "1000", "--seed", "3"], check=True,
                   capture_output=True)
    r = subprocess.run([a.bench, "--model", model, "--tokens", "40,9", "--chunk", "16", "--repeat", "2",
                        "--no-ceilings"], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"bench_prefill on a gpt-oss directory: rc {r.returncode}\n{r.stdout}{r.stderr}")
    for tokens in (40, 9):
        runs = re.search(rf"prefill of {tokens} tokens, [0-9.]+ GFLOP .*runs, tokens/s: ([0-9. ]+)\n", r.stdout)
        if not runs or len(runs.group(1).split()) != 2:
            sys.exit(f"no two runs of the {tokens}-token prefill in:\n{r.stdout}")
    if "(gpt-oss, 2 layers)" not in r.stdout or "chunks of 16 tokens" not in r.stdout:
        sys.exit(f"the header does not name the family and the chunk:\n{r.stdout}")
    # A prompt longer than the model's context is refused, naming the flag.
    r = subprocess.run([a.bench, "--model", model, "--tokens", "99999999", "--no-ceilings"], capture_output=True,
                       text=True)
    if r.returncode == 0 or "--tokens 99999999 is outside" not in r.stderr:
        sys.exit(f"an over-long --tokens: rc {r.returncode}, stderr {r.stderr!r}")
    shutil.rmtree(a.workdir, ignore_errors=True)
    print("bench_prefill loads a gpt-oss directory, prefills in chunks and refuses an over-long prompt")


if __name__ == "__main__":
    main()
