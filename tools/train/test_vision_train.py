"""Self tests of the synthetic image tasks (gen_images.py) and the vision
training path (chat.py's image parts, TrainModel's tower and image rows)."""

import base64
import json
import os
import struct
import sys
import unittest
import zlib

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import chat  # noqa: E402
import gen_images  # noqa: E402
import model as M  # noqa: E402
import train_vision  # noqa: E402


def decode_png(data):
    """The RGB8 pixels of a PNG that gen_images wrote (truecolour, filter 0)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, w, h = 8, b"", 0, 0
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        (crc,) = struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])
        assert crc == zlib.crc32(kind + body) & 0xFFFFFFFF
        if kind == b"IHDR":
            w, h, depth, colour = struct.unpack(">IIBB", body[:10])
            assert (depth, colour) == (8, 2)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw = zlib.decompress(idat)
    rows = [raw[y * (1 + 3 * w):(y + 1) * (1 + 3 * w)] for y in range(h)]
    assert all(r[0] == 0 for r in rows)
    return np.frombuffer(b"".join(r[1:] for r in rows), dtype=np.uint8).reshape(h, w, 3)


class GenImagesTest(unittest.TestCase):
    def test_deterministic_and_png_holds_the_pixels(self):
        a = gen_images.Generator("train", 4)
        b = gen_images.Generator("train", 4)
        for kind in gen_images.KINDS:
            (ta, ia), (tb, ib) = a.task(kind), b.task(kind)
            self.assertEqual(json.dumps(ta), json.dumps(tb))
            self.assertTrue(np.array_equal(ia, ib))
            url = ta["messages"][0]["content"][1]["image_url"]["url"]
            self.assertTrue(url.startswith("data:image/png;base64,"))
            pixels = decode_png(base64.b64decode(url.split(",", 1)[1]))
            self.assertEqual(pixels.shape, (64, 96, 3))
            self.assertTrue(np.array_equal(pixels, ia))
            self.assertGreater(len(np.unique(ia.reshape(-1, 3), axis=0)), 1, kind)  # something is drawn

    def test_held_out_split(self):
        train = gen_images.generate("train", 1, 200)
        held = gen_images.generate("eval", 2, 200)
        phr = lambda tasks: {t["messages"][0]["content"][0]["text"] for t in tasks}  # noqa: E731
        self.assertFalse(phr(train) & phr(held))
        for t in held:
            if t["kind"] == "read":
                self.assertGreaterEqual(int(t["expect"]["answer"]), 500)
            if t["kind"] == "sum":
                a, b = t["expect"]["calls"][0]["arguments"]["expression"].split("+")
                self.assertGreaterEqual(min(int(a), int(b)), 500)
                self.assertEqual(int(t["expect"]["answer"]), int(a) + int(b))
        self.assertEqual({t["kind"] for t in train}, set(gen_images.KINDS))

    def test_train_grammar_never_writes_an_eval_sentence(self):
        train = {s for phrases in gen_images.PHRASES["train"].values() for s in phrases}
        held = [s for phrases in gen_images.PHRASES["eval"].values() for s in phrases]
        self.assertEqual(len(held), 10)
        for s in held:
            self.assertNotIn(s, train)
            for lead in gen_images.TRAIN_LEADS:
                self.assertNotIn(lead + s, train)
        # The grammar is wide: hundreds of sentences per kind, both spellings of colour.
        for kind, phrases in gen_images.PHRASES["train"].items():
            self.assertGreater(len(phrases), 500, kind)
        self.assertTrue(any("color" in s for s in gen_images.PHRASES["train"]["colour"]))


class CaptionTest(unittest.TestCase):
    def test_captions_name_what_each_cell_holds(self):
        g = gen_images.Generator("train", 5)
        for _ in range(40):
            task, img = g.task("read")
            caption = "".join(task["cells"])
            self.assertEqual(len(task["cells"]), 4)
            self.assertEqual(caption.replace(" ", ""), task["expect"]["answer"])  # digits in reading order
            task, _ = g.task("sum")
            a, b = task["expect"]["calls"][0]["arguments"]["expression"].split("+")
            self.assertEqual("".join(task["cells"]).split(), [a, b])
            task, _ = g.task("count")
            codes = "".join(task["cells"]).replace(" ", "")
            self.assertEqual(codes, task["expect"]["answer"] * int(task["expect"]["answer"]))
            task, _ = g.task("colour")
            (code,) = "".join(task["cells"]).replace(" ", "")
            self.assertIn((code, task["expect"]["answer"]),
                          [(v, c) for (_, c), v in gen_images.SHAPE_CODES.items()])

    def test_conversation_is_the_tiny_agents_formats(self):
        g = gen_images.Generator("train", 6)
        task, _ = g.task("sum")
        expr = task["expect"]["calls"][0]["arguments"]["expression"]
        msgs = gen_images.conversation(task)
        self.assertEqual(msgs[1]["reasoning_content"], f"Compute {expr} with calculator.")
        self.assertEqual(msgs[2]["content"], str(eval(expr)))
        self.assertEqual(msgs[3]["content"], f"The answer is {eval(expr)}.")
        task, _ = g.task("shape")
        msgs = gen_images.conversation(task)
        self.assertEqual(msgs[-1]["content"], task["expect"]["answer"])

    def test_count_caption_holds_the_count_in_each_shape_cell(self):
        g = gen_images.Generator("train", 7)
        seen = set()
        for _ in range(30):
            task, _ = g.task("count")
            n = task["expect"]["answer"]
            seen.add(n)
            marks = "".join(task["cells"]).replace(" ", "")
            self.assertEqual(marks, n * int(n))  # n shapes, each cell holding n
            self.assertEqual(gen_images.conversation(task)[-1]["reasoning_content"],
                             f"Asked: count. Code {n}. Reply {n}, no tool needed.")
        self.assertEqual(seen, {"1", "2", "3", "4", "5"})

    def test_shape_and_colour_reasoning_copies_the_code(self):
        g = gen_images.Generator("train", 9)
        for kind in ("shape", "colour"):
            task, _ = g.task(kind)
            (code,) = "".join(task["cells"]).replace(" ", "")
            self.assertEqual(gen_images.conversation(task)[-1]["reasoning_content"],
                             f"Asked: {kind}. Code {code}. Reply {task['expect']['answer']}, no tool needed.")


class VisionTrainingTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with open(os.path.join(HERE, "config.json")) as f:
            raw = json.load(f)
        raw["vision"] = dict(train_vision.VISION)
        cls.cfg = M.Config(raw)
        cls.model = M.TrainModel(cls.cfg, seed=3)

    def test_image_part_renders_as_a_span(self):
        images = []
        msg = {"role": "user", "content": [{"type": "text", "text": "hi"},
                                           {"type": "image_url", "image_url": {"url": "u"}}]}
        ids, mask = chat.render([msg], [], image_tokens=lambda part: 4, images=images)
        self.assertEqual(ids, [chat.BOS, chat.USER, 104, 105, 269, 268, 268, 268, 268, 270, chat.END])
        self.assertEqual(images[0][0], 5)
        self.assertEqual(sum(mask), 0)

    def test_tower_is_the_reference_and_trains(self):
        task, img = gen_images.Generator("train", 1).task("sum")
        rgb = torch.from_numpy(img)
        rows = self.model.embed_image(rgb)
        weights = {k: v.detach() for k, v in self.model.state_dict_fp32().items()}
        want, _ = M._vision.tower(self.cfg.vision, weights, rgb)
        self.assertTrue(torch.allclose(rows, want))
        self.assertEqual(rows.shape, (24, self.cfg.hidden_size))
        for name, p in self.model.p.items():
            p.requires_grad = name.startswith("vision__")
        loss, _ = train_vision.loss_and_accuracy(self.model, [(task, img)])
        loss.backward()
        self.assertGreater(float(self.model.p["vision__patch_embed__weight"].grad.abs().sum()), 0)
        self.assertIsNone(self.model.p["embed__weight"].grad)

    def test_batched_tower_is_the_reference(self):
        g = gen_images.Generator("eval", 3)
        imgs = np.stack([g.task(k)[1] for k in gen_images.KINDS])
        got = self.model.embed_images(torch.from_numpy(imgs))
        weights = {k: v.detach() for k, v in self.model.state_dict_fp32().items()}
        for i, img in enumerate(imgs):
            want, _ = M._vision.tower(self.cfg.vision, weights, torch.from_numpy(img))
            self.assertLess(float((got[i] - want).abs().max()), 1e-5 * float(want.abs().max()))

    def test_first_turn_ends_at_the_first_assistant_end(self):
        task, _ = gen_images.Generator("train", 2).task("sum")
        ids, mask, _ = train_vision.render_vision(self.model, task)
        cut, cmask = train_vision.first_turn(ids, mask)
        self.assertEqual(cut[-1], chat.END)
        self.assertEqual(cut, ids[:len(cut)])
        self.assertIn(chat.TOOL_CALL, cut)
        self.assertNotIn(chat.TOOL, cut[train_vision.chat.shared_prefix_len(train_vision.gen_data.TOOLS):])
        self.assertLess(len(cut), len(ids))

    def test_tower_stage_loss_trains_the_tower_alone(self):
        g = gen_images.Generator("train", 8)
        tasks = [g.task(k) for k in gen_images.KINDS]
        for name, p in self.model.p.items():
            p.requires_grad = name.startswith("vision__")
            p.grad = None
        loss, flags, acc = train_vision.tower_loss(self.model, tasks)
        loss.backward()
        self.assertEqual(len(flags), len(tasks))
        self.assertGreater(float(self.model.p["vision__projector__w2__weight"].grad.abs().sum()), 0)
        self.assertIsNone(self.model.p["embed__weight"].grad)

    def test_image_rows_change_only_later_positions(self):
        ids = torch.tensor([[256, 259, 269] + [268] * 24 + [270, 104, 262]])
        rows = self.model.embed_image(torch.from_numpy(gen_images.Generator("eval", 1).task("shape")[1]))
        with torch.no_grad():
            plain, _ = self.model(ids)
            seen, _ = self.model(ids, image_rows=[(0, torch.arange(3, 27), rows.detach())])
        self.assertTrue(torch.equal(plain[0, :3], seen[0, :3]))
        self.assertFalse(torch.allclose(plain[0, -1], seen[0, -1]))


class MTPVisionDrafts(unittest.TestCase):
    """train_mtp's held-out path for image tasks (the tools block as a shared
    prefix) against whole sequences with the tower's rows in place. Dense
    attention: with a random indexer the top-k of a shared prefix and of a
    whole sequence may pick different keys; what is checked is the alignment
    of the drafts, the trunk's predictions and the masks."""

    def test_shared_prefix_drafts_are_the_whole_sequences(self):
        import train_mtp
        with open(os.path.join(HERE, "config.json")) as f:
            raw = json.load(f)
        raw["vision"] = dict(train_vision.VISION)
        raw["num_nextn_predict_layers"] = 1
        model = M.TrainModel(M.Config(raw), seed=5)
        part = train_mtp.vision_tasks("eval", 2, 3)
        with torch.no_grad():
            full, gen, trunk_next, first, chained = train_mtp.vision_drafts(model, part, True, "dense")
            seqs, rows = train_mtp.render_vision_tasks(model, part)
            ids, mask, valid = train_vision.pad(seqs)
            logits, aux = model(ids[:, :-1], valid[:, :-1], dsa_mode="dense", image_rows=rows)
            whole1, whole2 = model.mtp_sequence(torch.cat([aux["hidden"], aux["hidden"][:, -1:]], 1), ids, chain=True)
        P, n = chat.shared_prefix_len(train_mtp.gen_data.TOOLS), full.shape[1]
        self.assertTrue(torch.equal(full, ids[:, P - 1:P - 1 + n]))
        g1, g2 = gen[:, 2:], gen[:, 3:]
        self.assertGreater(int(g2.sum()), 100)
        self.assertTrue(torch.allclose(first[g1], whole1[:, P - 1:P - 1 + n - 2][g1], atol=1e-4))
        self.assertTrue(torch.allclose(chained[g2], whole2[:, P - 1:P - 1 + n - 3][g2], atol=1e-4))
        tn = logits[:, P - 1:P - 1 + n - 1, :train_mtp.NOT_GENERATED].argmax(-1)
        self.assertTrue(torch.equal(trunk_next[gen[:, 1:]], tn[gen[:, 1:]]))
        # The pictures are read: without the tower's rows the trunk's predictions move.
        with torch.no_grad():
            blind, _ = model(ids[:, :-1], valid[:, :-1], dsa_mode="dense")
        self.assertFalse(torch.allclose(blind[mask[:, 1:]], logits[mask[:, 1:]], atol=1e-4))


if __name__ == "__main__":
    unittest.main()
