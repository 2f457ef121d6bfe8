"""Synthetic tool-using conversations for the tiny agent model.

  /usr/bin/python3 tools/train/gen_data.py --split train --seed 1 --count 30000 --out data/train.jsonl
  /usr/bin/python3 tools/train/gen_data.py --split eval --seed 2 --count 300 --out data/eval.jsonl

Each line is one task: the OpenAI-style `messages` of the full conversation
(system block omitted: the tools alone are the system block), the `tools`
array exactly as a client sends it, the task `kind`, and what a correct run
must do (`expect`: the tool calls in order and the value the final answer must
contain). Deterministic from --seed.

Kinds: calc (calculator), convert, lookup, chain (two calls: lookup or
convert, then calculator), plain (no tool). The reasoning restates what the
call will copy (the expression, value and units, the key, the word), so that
the values travel question -> reasoning -> arguments in short hops. The eval split uses phrasings,
numbers, unit pairs and table keys that the train split never produces (the
`split` decides the pools; the seed only draws from them).
"""

import argparse
import json
import random
import string

# The tools as a client sends them (the daemon renders tools[].function,
# compact, keys in this order). Kept to the minimum a client must send (no
# descriptions): every training sequence carries them.
TOOLS = [
    {"type": "function", "function": {
        "name": "calculator",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}},
    {"type": "function", "function": {
        "name": "convert",
        "parameters": {"type": "object", "properties": {
            "value": {"type": "number"}, "from": {"type": "string"}, "to": {"type": "string"}}}}},
    {"type": "function", "function": {
        "name": "lookup",
        "parameters": {"type": "object", "properties": {"key": {"type": "string"}}}}},
]

# Unit conversions: factor to multiply by. Pairs are split between train and eval.
UNITS_TRAIN = [("km", "m", 1000), ("m", "cm", 100), ("kg", "g", 1000), ("h", "min", 60),
               ("min", "s", 60), ("l", "ml", 1000), ("m", "mm", 1000), ("day", "h", 24),
               ("t", "kg", 1000), ("cm", "mm", 10),
               # Many more unit names, so that the model learns to copy a unit
               # from the question rather than recall a few (the eval split
               # has unit names the train split never writes: mg, week, kl, ft, in).
               ("mi", "yd", 1760), ("lb", "oz", 16), ("gal", "qt", 4), ("qt", "pt", 2), ("dm", "cm", 10),
               ("hm", "m", 100), ("dam", "m", 10), ("kB", "B", 1000), ("MB", "kB", 1000), ("GB", "MB", 1000),
               ("TB", "GB", 1000), ("s", "ms", 1000), ("ms", "us", 1000), ("hl", "l", 100), ("dl", "ml", 100),
               ("cl", "ml", 10), ("kW", "W", 1000), ("MW", "kW", 1000), ("kJ", "J", 1000), ("kHz", "Hz", 1000),
               ("MHz", "kHz", 1000), ("A", "mA", 1000), ("V", "mV", 1000), ("kV", "V", 1000),
               ("year", "month", 12), ("decade", "year", 10), ("century", "year", 100), ("mm", "um", 1000),
               ("mol", "mmol", 1000), ("kcal", "cal", 1000), ("ton", "lb", 2000), ("dozen", "egg", 12),
               ("kN", "N", 1000), ("kPa", "Pa", 1000), ("bar", "mbar", 1000), ("ha", "are", 100),
               ("yard", "foot", 3), ("mile", "yard", 1760), ("hour", "minute", 60), ("minute", "second", 60),
               ("gram", "milligram", 1000), ("liter", "cl", 100), ("pound", "ounce", 16), ("byte", "bit", 8),
               ("Gbit", "Mbit", 1000), ("sec", "msec", 1000), ("hr", "sec", 3600), ("km2", "ha", 100)]
UNITS_EVAL = [("km", "cm", 100000), ("h", "s", 3600), ("g", "mg", 1000), ("week", "day", 7),
              ("kl", "l", 1000), ("ft", "in", 12)]
UNIT_FACTORS = {(a, b): f for a, b, f in UNITS_TRAIN + UNITS_EVAL}

CALC_OPS = {"+": ["plus", "+", "added to"], "-": ["minus", "-", "less"], "*": ["times", "*", "multiplied by"]}

PHRASES = {
    "train": {
        "calc": ["What is {e}?", "Compute {e}.", "Calculate {e}.", "{e} = ?", "How much is {e}?",
                 "Work out {e}.", "Tell me {e}.", "Evaluate {e}.", "Can you compute {e}?", "Solve {e}.",
                 "What do you get for {e}?", "Give me {e}.", "Please work out {e} for me.", "{e}?",
                 "I want to know {e}.", "Do the math: {e}.", "Quick math, {e}.", "Result of {e}?",
                 "What does {e} come to?", "Figure {e}.", "Calculate this: {e}", "How much does {e} make?"],
        "convert": ["Convert {v} {a} to {b}.", "How many {b} is {v} {a}?", "{v} {a} in {b}?",
                    "Express {v} {a} in {b}.", "What is {v} {a} in {b}?", "How many {b} are in {v} {a}?",
                    "Convert {v} {a} into {b}, please.", "{v} {a} to {b}?", "Give {v} {a} in {b}.",
                    "I have {v} {a}. How many {b} is that?", "Rewrite {v} {a} as {b}.",
                    "What are {v} {a} in {b}?", "Please convert {v} {a} to {b}.", "Switch {v} {a} to {b}."],
        "lookup": ["Look up {k}.", "What is the value of {k}?", "Find {k} in the table.",
                   "What does the table say for {k}?", "Get {k}.", "Fetch {k}.", "Look {k} up, please.",
                   "Which value does {k} have?", "Find the entry {k}.", "What is {k} in the table?",
                   "Tell me the value of {k}.", "Search the table for {k}.", "Value of {k}?", "Get me {k}."],
        "chain_lookup": [("Look up {k} and multiply it by {n}.", "*"), ("Take the value of {k} times {n}.", "*"),
                         ("Find {k}, then add {n}.", "+"), ("Get {k} plus {n}.", "+"),
                         ("Fetch {k} and add {n} to it.", "+"), ("What is {k} times {n}?", "*"),
                         ("Look {k} up and multiply by {n}.", "*"), ("Add {n} to the value of {k}.", "+"),
                         ("Find {k} and multiply it by {n}.", "*"), ("Value of {k} plus {n}?", "+")],
        "chain_convert": [("Convert {v} {a} to {b}, then add {n}.", "+"), ("How many {b} is {v} {a}, plus {n}?", "+"),
                          ("Convert {v} {a} to {b} and multiply by {n}.", "*"),
                          ("Express {v} {a} in {b}, then multiply by {n}.", "*"),
                          ("Take {v} {a} in {b} and add {n}.", "+"), ("{v} {a} in {b}, times {n}?", "*")],
        "plain": ["Say {w}.", "Repeat the word {w}.", "Reply with {w}.", "Echo {w}.", "Please say {w}.",
                  "Write {w}.", "Respond with {w}.", "Just write the word {w}.", "Say the word {w}, nothing else.",
                  "Type {w}."],
        "prefix": ["", "", "", "", "Please, ", "Hi! ", "Quick one: ", "Hello, ", "Question: ", "Thanks in advance. "],
    },
    "eval": {
        "calc": ["Could you figure out {e}?", "I need {e}.", "Find {e}, please.", "What's {e}?"],
        "convert": ["Turn {v} {a} into {b}.", "{v} {a} equals how many {b}?", "Change {v} {a} to {b}."],
        "lookup": ["Check the table for {k}.", "What is stored under {k}?", "Read {k}."],
        "chain_lookup": [("Read {k} and multiply it by {n}.", "*"), ("Check {k}, then add {n}.", "+")],
        "chain_convert": [("Turn {v} {a} into {b}, then add {n}.", "+"), ("Change {v} {a} to {b} and multiply by {n}.", "*")],
        "plain": ["Just say {w}.", "Answer with the word {w}."],
        "prefix": ["", "Hello. ", "Hey, "],
    },
}

WORDS_TRAIN = """apple river stone green cloud tiger piano lemon house ocean maple candle silver rocket
garden winter pencil castle yellow bridge anchor basket bottle butter camera carpet cherry circle
cotton dinner doctor dragon engine finger forest friend frozen galaxy ginger guitar hammer helmet
island jacket jungle kettle kitten ladder letter marble mirror monkey needle number orange oyster
palace parrot pepper pickle planet pocket potato puzzle rabbit ribbon salmon sandal shadow
shovel signal spider spring summer sunset tablet teapot ticket tomato tunnel turtle velvet wallet
window wizard yogurt zebra acorn badge beach blade brick brush cabin chalk charm crane crown dream
eagle fable feast flame flute frost glove grape heart honey horse jewel juice knife koala lotus
magic mango medal melon moose mouse novel olive opera otter panda pearl piano pilot plum quilt radio
robin salad scarf sheep shell skirt snake spoon storm sugar swing table tulip uncle vapor whale
wheat yacht amber blue red black white purple silent gentle bright quick happy brave calm""".split()
WORDS_TRAIN = sorted(set(WORDS_TRAIN), key=WORDS_TRAIN.index)
WORDS_EVAL = ["violet", "harbor", "meadow", "falcon", "copper", "orchid", "thunder", "saddle"]


OP_WORDS = {"*": "multiply by", "+": "add"}


def number_is_eval(n):
    """Integers whose last two digits fall in 40..49 appear only in the eval split."""
    return n % 100 // 10 == 4


def key_is_eval(key):
    return sum(key.encode()) % 5 == 0


def fmt_number(x):
    """Canonical number text: integers without a point, others shortest."""
    if isinstance(x, float) and x.is_integer():
        x = int(x)
    return str(x)


def convert_value(value, a, b):
    f = UNIT_FACTORS.get((a, b))
    if f is not None:
        return value * f
    f = UNIT_FACTORS.get((b, a))
    if f is not None:
        q = value / f
        return int(q) if float(q).is_integer() else round(q, 6)
    return None


class Gen:
    def __init__(self, split, seed):
        self.split = split
        self.r = random.Random(f"{split}:{seed}")
        self.p = PHRASES[split]

    def num(self, lo, hi):
        while True:
            n = self.r.randint(lo, hi)
            if number_is_eval(n) == (self.split == "eval") or (self.split == "eval" and self.r.random() < 0.5):
                return n

    def key(self):
        syll = ["ka", "lo", "mi", "ru", "ze", "po", "ta", "ne", "vi", "so", "du", "fe", "gi", "ba", "xo", "qu"]
        while True:
            k = "".join(self.r.choice(syll) for _ in range(self.r.randint(2, 3))) + str(self.r.randint(1, 99))
            if key_is_eval(k) == (self.split == "eval"):
                return k

    def call_id(self):
        return "call_" + "".join(self.r.choice(string.ascii_letters + string.digits) for _ in range(24))

    def phrase(self, kind, **kw):
        return self.r.choice(self.p["prefix"]) + self.r.choice(self.p[kind]).format(**kw)

    def units(self):
        pairs = UNITS_TRAIN if self.split == "train" else UNITS_EVAL
        a, b, _ = self.r.choice(pairs)
        if self.r.random() < 0.3:
            a, b = b, a
        return a, b

    def conv_value(self, a, b):
        if (a, b) in UNIT_FACTORS:
            return self.num(1, 60)
        f = UNIT_FACTORS[(b, a)]
        return self.num(1, 60) * f // self.r.choice([1, 2, 4, 10]) if f >= 10 else self.num(1, 60) * f

    # Each builder returns (user text, [(reasoning, tool name, args, result)], final reasoning, answer, expect value).
    def calc(self):
        n_ops = self.r.choice([1, 1, 2])
        nums = [self.num(1, 999) for _ in range(n_ops + 1)]
        ops = [self.r.choice("+-*") for _ in range(n_ops)]
        expr = str(nums[0])
        words = str(nums[0])
        for o, n in zip(ops, nums[1:]):
            expr += o + str(n)
            w = self.r.choice(CALC_OPS[o])
            words += (" " + w + " " if w.isalpha() or " " in w else " " + w + " ") + str(n)
        value = eval(expr)  # our own digits and operators only
        user = self.phrase("calc", e=words)
        think = f"Compute {expr} with calculator."
        steps = [(think, "calculator", {"expression": expr}, fmt_number(value))]
        return user, steps, f"Result {value}.", f"The answer is {value}.", fmt_number(value)

    def convert(self):
        a, b = self.units()
        v = self.conv_value(a, b)
        out = convert_value(v, a, b)
        user = self.phrase("convert", v=v, a=a, b=b)
        think = f"Convert {v} {a} to {b} with convert."
        steps = [(think, "convert", {"value": v, "from": a, "to": b}, fmt_number(out))]
        return user, steps, f"Got {fmt_number(out)}.", f"{v} {a} is {fmt_number(out)} {b}.", fmt_number(out)

    def lookup(self):
        k = self.key()
        val = self.num(1, 999)
        user = self.phrase("lookup", k=k)
        think = f"Read key {k} with lookup."
        steps = [(think, "lookup", {"key": k}, str(val))]
        return user, steps, f"Found {val}.", f"{k} is {val}.", str(val)

    def chain(self):
        n = self.num(2, 99)
        if self.r.random() < 0.5:
            k = self.key()
            val = self.num(1, 999)
            tmpl, op = self.r.choice(self.p["chain_lookup"])
            user = self.r.choice(self.p["prefix"]) + tmpl.format(k=k, n=n)
            first = (f"Two steps: lookup {k}, then {OP_WORDS[op]} {n}.", "lookup", {"key": k}, str(val))
            base, what = val, k
        else:
            a, b = self.units()
            v = self.conv_value(a, b)
            val = convert_value(v, a, b)
            tmpl, op = self.r.choice(self.p["chain_convert"])
            user = self.r.choice(self.p["prefix"]) + tmpl.format(v=v, a=a, b=b, n=n)
            first = (f"Two steps: convert {v} {a} to {b}, then {OP_WORDS[op]} {n}.", "convert",
                     {"value": v, "from": a, "to": b}, fmt_number(val))
            base, what = val, f"{v} {a}"
        expr = f"{fmt_number(base)}{op}{n}"
        value = eval(expr)
        value = fmt_number(round(value, 6) if isinstance(value, float) else value)
        second = (f"Now {expr}.", "calculator", {"expression": expr}, value)
        return user, [first, second], f"Result {value}.", f"The answer is {value}.", value

    def plain(self):
        w = self.r.choice(WORDS_TRAIN if self.split == "train" else WORDS_EVAL)
        user = self.phrase("plain", w=w)
        return user, [], f"Reply {w}, no tool needed.", w, w

    def task(self, kind):
        user, steps, final_think, answer, expect = getattr(self, kind)()
        messages = [{"role": "user", "content": user}]
        calls = []
        for think, name, args, result in steps:
            cid = self.call_id()
            messages.append({"role": "assistant", "content": "", "reasoning_content": think,
                             "tool_calls": [{"id": cid, "type": "function",
                                             "function": {"name": name, "arguments": json.dumps(args, separators=(",", ":"))}}]})
            messages.append({"role": "tool", "tool_call_id": cid, "content": result})
            calls.append({"name": name, "arguments": args, "result": result})
        first_think = steps[0][0] if steps else final_think
        if not steps:
            messages.append({"role": "assistant", "content": answer, "reasoning_content": final_think})
        else:
            messages.append({"role": "assistant", "content": answer, "reasoning_content": final_think})
        # What the tools answer in this task's world: the table rows it reads
        # and the conversion factors, so an evaluator runs the tools itself.
        env = {"table": {c["arguments"]["key"]: c["result"] for c in calls if c["name"] == "lookup"},
               "units": [list(u) for u in UNITS_TRAIN + UNITS_EVAL]}
        return {"kind": kind, "tools": TOOLS, "messages": messages, "env": env,
                "expect": {"calls": calls, "answer": expect, "first_reasoning": first_think}}


KINDS = ["calc", "convert", "lookup", "chain", "plain"]
WEIGHTS = [0.25, 0.2, 0.2, 0.25, 0.1]


def generate(split, seed, count):
    g = Gen(split, seed)
    out = []
    for i in range(count):
        # Eval cycles through the kinds so every kind has count/5 tasks.
        kind = KINDS[i % len(KINDS)] if split == "eval" else g.r.choices(KINDS, WEIGHTS)[0]
        out.append(g.task(kind))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--split", choices=["train", "eval"], required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--count", type=int, required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    with open(a.out, "w") as f:
        for t in generate(a.split, a.seed, a.count):
            f.write(json.dumps(t, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
