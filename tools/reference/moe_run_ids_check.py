"""moe-run --prompt-ids ... --print-ids against the fp32 references, for each
family: the generated ids must equal the reference's greedy tokens.

  python3 moe_run_ids_check.py --moe-run PATH --moe-model-gen PATH --workdir DIR
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def sh(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout}{r.stderr}")
    return r.stdout


def reference_greedy(script, model, prompt, decode, out):
    sh([sys.executable, os.path.join(HERE, script)] + (["run"] if script != "reference.py" else []) +
       ["--model", model, "--tokens", ",".join(map(str, prompt)), "--decode", str(decode), "--out", out])
    with open(os.path.join(out, "meta.json")) as f:
        greedy = json.load(f)["greedy_tokens"]
    # reference.py lists the `decode` decoded tokens, gpt_oss.py one more (the pick after the last).
    if len(greedy) < decode:
        sys.exit(f"{script}: {len(greedy)} greedy tokens, expected at least {decode}")
    return greedy[:decode]


def engine_ids(moe_run, model, prompt, n):
    out = sh([moe_run, "--model", model, "--prompt-ids", ",".join(map(str, prompt)), "--print-ids",
              "--max-tokens", str(n), "--ignore-eos"])
    lines = out.strip().splitlines()
    if len(lines) != 1:
        sys.exit(f"moe-run --print-ids printed {len(lines)} lines, expected one:\n{out}")
    return [int(x) for x in lines[0].split(",")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--moe-run", required=True)
    ap.add_argument("--moe-model-gen", required=True)
    ap.add_argument("--workdir", required=True)
    a = ap.parse_args()
    shutil.rmtree(a.workdir, ignore_errors=True)
    os.makedirs(a.workdir)
    n = 10
    checked = 0

    gpt = os.path.join(a.workdir, "gpt-oss")
    sh([sys.executable, os.path.join(HERE, "gpt_oss.py"), "write", "--out", gpt, "--layers", "2", "--window", "4",
        "--vocab", "2000", "--seed", "3"])
    prompt = [17, 400, 1999, 0, 5, 77, 1200, 33, 8, 900, 4, 61]  # three windows long
    ref = reference_greedy("gpt_oss.py", gpt, prompt, n, os.path.join(a.workdir, "gpt-oss-ref"))
    got = engine_ids(a.moe_run, gpt, prompt, n)
    if got != ref:
        sys.exit(f"gpt-oss: moe-run {got} != reference {ref}")
    checked += 1

    # --bf16-activations reaches gpt-oss's products (the kernel names it prints).
    out = sh([a.moe_run, "--model", gpt, "--prompt-ids", ",".join(map(str, prompt * 3)), "--max-tokens", "2",
              "--bf16-activations"])
    if "+bf16act" not in out:
        sys.exit(f"moe-run --bf16-activations on gpt-oss: no BF16-activation kernels named in\n{out}")
    checked += 1

    # Refusals: malformed ids, a gpt-oss model asked for a chat prompt, BF16
    # activations asked of the fp32-only reference kernels.
    for args, expect in ((["--prompt-ids", "1,2", "--bf16-activations", "--kernels", "reference"],
                          "--bf16-activations needs --kernels fast"),
                         (["--prompt-ids", "1,,2"], "comma-separated token ids"),
                         (["--prompt-ids", "-3"], "comma-separated token ids"),
                         (["--prompt", "hello"], "gpt-oss models take --prompt-ids"),
                         (["--prompt-ids", "1,2000"], "has id 2000, outside the vocabulary")):
        r = subprocess.run([a.moe_run, "--model", gpt, "--print-ids"] + args, capture_output=True, text=True)
        if r.returncode == 0 or expect not in r.stderr:
            sys.exit(f"moe-run {args}: rc {r.returncode}, stderr {r.stderr!r}; expected an error with {expect!r}")
        checked += 1

    dsa = os.path.join(a.workdir, "moe-dsa-v1")
    sh([a.moe_model_gen, "--preset", "tiny", "--out", dsa])
    prompt = [256, 258, 72, 105, 33]
    ref = reference_greedy("reference.py", dsa, prompt, n, os.path.join(a.workdir, "dsa-ref"))
    got = engine_ids(a.moe_run, dsa, prompt, n)
    if got != ref:
        sys.exit(f"moe-dsa-v1: moe-run {got} != reference {ref}")
    checked += 1

    # Qwen3-Next (Hugging Face layout), a prompt longer than the DeltaNet chunk.
    qwen = os.path.join(a.workdir, "qwen3-next")
    sh([sys.executable, os.path.join(HERE, "families", "qwen3_next.py"), "write", "--out", qwen, "--vocab", "4096",
        "--seed", "5"])
    prompt = [(i * 7919) % 4096 for i in range(40)]
    ref = reference_greedy(os.path.join("families", "qwen3_next.py"), qwen, prompt, n,
                           os.path.join(a.workdir, "qwen-ref"))
    got = engine_ids(a.moe_run, qwen, prompt, n)
    if got != ref:
        sys.exit(f"qwen3_next: moe-run {got} != reference {ref}")
    checked += 1

    shutil.rmtree(a.workdir, ignore_errors=True)
    print(f"moe-run --print-ids equals the reference's greedy ids for the three families ({n} tokens each); "
          f"{checked - 4} refusals checked; BF16 activations reach gpt-oss")
    if checked != 9:
        sys.exit("not every family was checked")


if __name__ == "__main__":
    main()
