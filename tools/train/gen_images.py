"""Synthetic image tasks for a tiny vision agent: digits, shapes and colours.

  /usr/bin/python3 tools/train/gen_images.py --split train --seed 1 --count 20000 --out data/vision_train.jsonl
  /usr/bin/python3 tools/train/gen_images.py --split eval --seed 2 --count 300 --out data/vision_eval.jsonl \
      [--png-dir DIR] [--kind sum]

Each line is one task in the OpenAI chat shape the daemon accepts: the user
message's `content` is a list of parts, a `text` part (the question) and an
`image_url` part whose URL is a `data:image/png;base64,...` PNG; `kind`,
`tools` and `env` (the tiny agent's three tools and their world), and `expect`
(the tool calls a correct run makes, in order, and the value the final answer
must contain), as tools/train/gen_data.py writes its tasks, so that
tools/eval/eval.mjs runs them alike.
`--png-dir` also writes each image as a file (NNNNN.png).

Kinds:
- read:   one number drawn on the image; "What number is shown?" -> the number.
- sum:    two numbers drawn; "Add the two numbers in the picture" ->
          calculator("A+B"), then the result (a tool called with values read
          from the image).
- shape:  one filled shape (circle, square, triangle) -> its name.
- colour: one filled shape -> its colour's name.
- count:  1 to 5 shapes of one kind -> how many (captioned with the count in
          each shape's cell: the tower counts, the language model copies).

Held out: the eval split uses phrasings the train split never writes, numbers
from 500 to 999 (train: 0 to 499), and background shades of its own; the
shapes, colours and the glyphs are shared (an unseen glyph could not be read).

Images are drawn with numpy only (a 5x7 bitmap font scaled by an integer
factor, shapes by their inequalities), so the same seed gives the same bytes
everywhere; PNG is written with zlib (no imaging library needed).

Characters are drawn at a pitch of 16 pixels, the width of one image token of
the small tower (8-pixel patches merged 2x2), at any pixel offset: each
character's centre then falls in its own token's cell. Each task also carries
`cells`, a caption of the image laid out on that 6x4 grid (one character per
cell, row by row; training only, for the tower's first stage): the digit whose
centre is in the cell, the code letter of a shape whose centre is in it
(SHAPE_CODES: one letter per shape and colour), or a space.

The answers use the tiny agent's own formats (gen_data.py): a sum is its calc
task (`Compute A+B with calculator.`, the call, `Result C.`, `The answer is
C.`); the other kinds are its plain task (`Reply X, no tool needed.`, X),
whose reasoning first names what is asked (`Asked: colour.`), then copies
what it needs off the picture (plain_reasoning: the caption code of a shape, or
the count the tower writes into each shape's cell).
"""

import argparse
import base64
import json
import os
import random
import struct
import zlib

import numpy as np

import gen_data

# 5x7 glyphs for the digits (rows top to bottom, '#' ink).
GLYPHS = {
    "0": [".###.", "#...#", "#..##", "#.#.#", "##..#", "#...#", ".###."],
    "1": ["..#..", ".##..", "..#..", "..#..", "..#..", "..#..", ".###."],
    "2": [".###.", "#...#", "....#", "...#.", "..#..", ".#...", "#####"],
    "3": ["#####", "...#.", "..#..", "...#.", "....#", "#...#", ".###."],
    "4": ["...#.", "..##.", ".#.#.", "#..#.", "#####", "...#.", "...#."],
    "5": ["#####", "#....", "####.", "....#", "....#", "#...#", ".###."],
    "6": ["..##.", ".#...", "#....", "####.", "#...#", "#...#", ".###."],
    "7": ["#####", "....#", "...#.", "..#..", ".#...", ".#...", ".#..."],
    "8": [".###.", "#...#", "#...#", ".###.", "#...#", "#...#", ".###."],
    "9": [".###.", "#...#", "#...#", ".####", "....#", "...#.", ".##.."],
}

COLOURS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 80, 220), "yellow": (235, 200, 30),
           "purple": (140, 60, 180), "orange": (245, 130, 20), "black": (20, 20, 20)}
SHAPES = ["circle", "square", "triangle"]
BACKGROUNDS = {"train": [(255, 255, 255), (240, 240, 235), (225, 235, 245), (245, 235, 225)],
               "eval": [(250, 250, 240), (235, 245, 235)]}

# Train phrasings: a small grammar (a frame per way of asking, with the thing
# asked about and where it is as slots), each sentence alone and after each
# lead-in, so that the model keys on the words that say what is asked (a
# number, a sum, a shape, a colour, how many) across many wordings rather than
# on a few whole sentences. A tiny model trained from nothing knows no word it
# never read, so the grammar's words are ordinary ones; the eval split's
# sentences are whole sentences it never writes (the grammar's output is
# filtered against them, and a test checks the splits are disjoint).
TRAIN_LEADS = ["", "Look at the image. ", "Quick question: ", "Here is a picture. ", "Please answer: "]
THINGS = ["shape", "figure", "object", "thing", "form", "item"]
PLACES = ["shown", "drawn", "written", "pictured", "painted", "here", "in the picture", "in the image",
          "in this image", "on this picture", "drawn here", "shown here", "written here", "painted here"]
FRAMES = {
    "read": ["What number is {p}?", "Which number is {p}?", "Read the number {p}.", "Read out the number {p}.",
             "Which digits are {p}?", "What digits are {p}?", "What value is {p}?", "Tell me the number {p}.",
             "What is the number {p}?"],
    "sum": ["Add the two numbers {p}.", "What is the sum of the two numbers {p}?", "Sum the two values {p}.",
            "Total the two numbers {p}.", "What do the two numbers {p} add up to?",
            "What do the two values {p} make together?", "Compute the total of the two values {p}.",
            "Use the calculator to add the numbers {p}."],
    "shape": ["What {t} is {p}?", "Which {t} is {p}?", "Name the {t} {p}.", "What kind of {t} is {p}?",
              "Identify the {t} {p}.", "What type of {t} is {p}?", "Tell me the {t} {p}.", "What is the {t} {p}?"],
    "colour": ["What colour is the {t} {p}?", "Which colour is the {t} {p}?", "Name the colour of the {t} {p}.",
               "Name the {t}'s colour.", "Tell me the colour of the {t} {p}.", "In which colour is the {t} {p}?",
               "In what colour is the {t} {p}?", "What is the colour of the {t} {p}?"],
    "count": ["How many {t}s are {p}?", "Count the {t}s {p}.", "What is the number of {t}s {p}?",
              "Tell me how many {t}s are {p}.", "How many {t}s do you see?", "Give the count of {t}s {p}.",
              "What is the count of {t}s {p}?", "How many {t}s can you find {p}?"],
}
EVAL_PHRASES = {
    "read": ["Which digits are written here?", "Please read out the number on this picture."],
    "sum": ["Total the two values in this image.", "What do the two numbers pictured add up to?"],
    "shape": ["What kind of shape is pictured?", "Identify the figure drawn here."],
    "colour": ["In what colour is the figure painted?", "Name the figure's colour."],
    "count": ["What is the number of figures pictured?", "Tell me how many figures are drawn."],
}


def grammar(kind):
    """Every sentence the train grammar writes for a kind (American spelling of
    colour too), less the eval split's sentences, in a fixed order."""
    out = []
    for frame in FRAMES[kind]:
        for t in THINGS if "{t}" in frame else [""]:
            for p in PLACES if "{p}" in frame else [""]:
                s = frame.format(t=t, p=p)
                out += [s, s.replace("colour", "color")] if "colour" in s else [s]
    held = {e for phrases in EVAL_PHRASES.values() for e in phrases}
    return [s for s in dict.fromkeys(out) if s not in held]


PHRASES = {
    "train": {k: [lead + core for lead in TRAIN_LEADS for core in grammar(k)] for k in FRAMES},
    "eval": EVAL_PHRASES,
}

CELL = 16  # pixels per image token along each side (patch 8, merge 2)
PITCH = 16  # character pitch: one character per cell along a row
# One code letter per (shape, colour) for the cell captions.
SHAPE_CODES = {(k, c): chr(ord("A") + i) for i, (k, c) in
               enumerate((k, c) for k in SHAPES for c in COLOURS if c != "black")}

KINDS = ["read", "sum", "shape", "colour", "count"]
WEIGHTS = [0.2, 0.3, 0.15, 0.15, 0.2]
SIZE = (96, 64)  # width, height: 6 x 4 units of 16 pixels with moe-model-gen --vision's tower (24 image tokens)


def png_bytes(rgb):
    """RGB8 [H, W, 3] as a PNG file (8-bit truecolour, filter 0 on every row)."""
    h, w, _ = rgb.shape
    raw = b"".join(b"\x00" + rgb[y].tobytes() for y in range(h))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


class Canvas:
    def __init__(self, rng, split):
        w, h = SIZE
        self.img = np.empty((h, w, 3), dtype=np.uint8)
        self.img[:] = rng.choice(BACKGROUNDS[split])
        self.rng = rng
        self.marks = []  # (x, y, caption character) of each drawn thing's centre

    def text(self, s, x, y, scale, colour):
        for i, ch in enumerate(s):
            left = x + i * PITCH
            for r, row in enumerate(GLYPHS[ch]):
                for c, px in enumerate(row):
                    if px == "#":
                        x0, y0 = left + c * scale, y + r * scale
                        self.img[y0:y0 + scale, x0:x0 + scale] = colour
            self.marks.append((left + 5 * scale // 2, y + 7 * scale // 2, ch))

    def cells(self):
        """The caption grid: rows of characters, one per CELL x CELL cell."""
        h, w, _ = self.img.shape
        grid = [[" "] * (w // CELL) for _ in range(h // CELL)]
        for x, y, ch in self.marks:
            grid[min(y // CELL, h // CELL - 1)][min(x // CELL, w // CELL - 1)] = ch
        return ["".join(row) for row in grid]

    def shape(self, kind, cx, cy, r, colour_name):
        colour = COLOURS[colour_name]
        self.marks.append((cx, cy, SHAPE_CODES[(kind, colour_name)]))
        h, w, _ = self.img.shape
        yy, xx = np.mgrid[0:h, 0:w]
        if kind == "circle":
            mask = (xx - cx) ** 2 + (yy - cy) ** 2 <= r * r
        elif kind == "square":
            mask = (abs(xx - cx) <= r * 0.85) & (abs(yy - cy) <= r * 0.85)
        else:  # triangle, apex up
            mask = (yy <= cy + r * 0.8) & (yy >= cy - r) & (abs(xx - cx) <= (yy - (cy - r)) * 0.6)
        self.img[mask] = colour


class Generator:
    def __init__(self, split, seed):
        self.split = split
        self.rng = random.Random(seed)

    def number(self):
        return self.rng.randint(0, 499) if self.split == "train" else self.rng.randint(500, 999)

    def phrase(self, kind):
        return self.rng.choice(PHRASES[self.split][kind])

    def ink(self):
        return self.rng.choice(["black", "blue", "red"])

    def read(self):
        c = Canvas(self.rng, self.split)
        n = self.number()
        s = str(n)
        scale = 3 if len(s) <= 2 else 2
        x = self.rng.randint(2, SIZE[0] - (len(s) - 1) * PITCH - 5 * scale - 2)
        c.text(s, x, self.rng.randint(2, SIZE[1] - 7 * scale - 2), scale, COLOURS[self.ink()])
        return c, [], str(n)

    def sum(self):
        c = Canvas(self.rng, self.split)
        a, b = self.number(), self.number()
        ink = COLOURS[self.ink()]
        # a in the top half, b in the bottom half: read row by row, a comes first.
        c.text(str(a), self.rng.randint(2, 8), self.rng.randint(2, 12), 2, ink)
        c.text(str(b), self.rng.randint(40, SIZE[0] - (len(str(b)) - 1) * PITCH - 12), self.rng.randint(34, 48), 2, ink)
        expr = f"{a}+{b}"
        return c, [{"name": "calculator", "arguments": {"expression": expr}, "result": str(a + b)}], str(a + b)

    def one_shape(self):
        c = Canvas(self.rng, self.split)
        kind = self.rng.choice(SHAPES)
        colour = self.rng.choice([k for k in COLOURS if k != "black"])
        r = self.rng.randint(12, 22)
        c.shape(kind, self.rng.randint(r + 2, SIZE[0] - r - 2), self.rng.randint(r + 2, SIZE[1] - r - 2), r, colour)
        return c, kind, colour

    def shape(self):
        c, kind, _ = self.one_shape()
        return c, [], kind

    def colour(self):
        c, _, colour = self.one_shape()
        return c, [], colour

    def count(self):
        c = Canvas(self.rng, self.split)
        n = self.rng.randint(1, 5)
        kind = self.rng.choice(SHAPES)
        # Five cells of 19 pixels; each shape in its own cell, so none overlap.
        cells = self.rng.sample(range(5), n)
        for cell in cells:
            colour = self.rng.choice([k for k in COLOURS if k != "black"])
            c.shape(kind, 10 + cell * 19, self.rng.randint(12, SIZE[1] - 12), 8, colour)
        # A picture of several shapes is captioned with how many there are, in
        # each shape's cell: the tower's attention sees every cell at once and
        # counts; the language model then copies a digit, as it reads numbers.
        c.marks = [(x, y, str(n)) for x, y, _ in c.marks]
        return c, [], str(n)

    def task(self, kind):
        c, calls, value = getattr(self, kind)()
        url = "data:image/png;base64," + base64.b64encode(png_bytes(c.img)).decode()
        user = {"role": "user", "content": [{"type": "text", "text": self.phrase(kind)},
                                            {"type": "image_url", "image_url": {"url": url}}]}
        # gen_data.py's task shape (tools/eval/eval.mjs runs both): the three
        # tools of the tiny agent on every request, as an agent sends them.
        return {"kind": kind, "tools": gen_data.TOOLS, "messages": [user],
                "env": {"table": {}, "units": [list(u) for u in gen_data.UNITS_TRAIN + gen_data.UNITS_EVAL]},
                "expect": {"calls": calls, "answer": value}, "cells": c.cells()}, c.img


def conversation(task, call_id="call_" + "0" * 24):
    """The task's whole conversation in the tiny agent's formats (gen_data.py):
    a sum is its calc task, every other kind its plain task."""
    messages = list(task["messages"])
    value = task["expect"]["answer"]
    for call in task["expect"]["calls"]:
        expr = call["arguments"]["expression"]
        messages.append({"role": "assistant", "reasoning_content": f"Compute {expr} with calculator.", "content": "",
                         "tool_calls": [{"id": call_id, "type": "function",
                                         "function": {"name": "calculator",
                                                      "arguments": json.dumps(call["arguments"], separators=(",", ":"))}}]})
        messages.append({"role": "tool", "tool_call_id": call_id, "content": call["result"]})
    if task["expect"]["calls"]:
        messages.append({"role": "assistant", "reasoning_content": f"Result {value}.", "content": f"The answer is {value}."})
    else:
        messages.append({"role": "assistant", "reasoning_content": plain_reasoning(task), "content": value})
    return messages


# What a plain task's reasoning writes before the tiny agent's plain-task line:
# first what is asked, one short word decided from the question alone; then,
# for a shape, a colour or a count, `Code X.`: the one caption character of the
# picture (a shape's code, or the count the tower wrote into each shape's cell),
# copied before it is named, so that naming it is a look-up of the token just
# written rather than a search and a look-up in one step. (Writing the count
# out in the reasoning, shape by shape or as a running total per cell, had the
# model lose its place: the copy it needs is by position, which this model's
# short rotary dimensions place poorly; a copy by content it does well.)
ASKED = {"read": "number", "shape": "shape", "colour": "colour", "count": "count"}


def plain_reasoning(task):
    kind, value = task["kind"], task["expect"]["answer"]
    code = "".join(task["cells"]).replace(" ", "")[:1]
    steps = f"Code {code}. " if kind in ("shape", "colour", "count") else ""
    return f"Asked: {ASKED[kind]}. {steps}Reply {value}, no tool needed."


def generate(split, seed, count, png_dir=None, kind=None):
    g = Generator(split, seed)
    kinds = g.rng.choices(KINDS, WEIGHTS, k=count) if kind is None else [kind] * count
    out = []
    for i, kind in enumerate(kinds):
        task, img = g.task(kind)
        if png_dir:
            with open(os.path.join(png_dir, f"{i:05d}.png"), "wb") as f:
                f.write(png_bytes(img))
        out.append(task)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--split", choices=["train", "eval"], required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--count", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--png-dir", help="also write each image as a PNG file here")
    ap.add_argument("--kind", choices=KINDS, help="only tasks of this kind (default: the mix of WEIGHTS)")
    args = ap.parse_args()
    if args.png_dir:
        os.makedirs(args.png_dir, exist_ok=True)
    with open(args.out, "w") as f:
        for task in generate(args.split, args.seed, args.count, args.png_dir, args.kind):
            f.write(json.dumps(task) + "\n")


if __name__ == "__main__":
    main()
