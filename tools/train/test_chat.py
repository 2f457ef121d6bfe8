"""chat.py renders as the engine does (docs/model-format.md section 8).

  /usr/bin/python3 -m unittest discover -s tools/train
"""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chat  # noqa: E402
import gen_data  # noqa: E402

# The format's own worked example: system "S", user "hi", assistant with
# reasoning "r", content "", one tool call call_1 f({}), tool result "1".
SPEC_IDS = [int(x) for x in """256 258 83 262 259 104 105 262 260 263 114 264 265 123 34 105 100 34 58 34
99 97 108 108 95 49 34 44 34 110 97 109 101 34 58 34 102 34 44 34 97 114 103
117 109 101 110 116 115 34 58 123 125 125 266 262 261 123 34 116 111 111 108
95 99 97 108 108 95 105 100 34 58 34 99 97 108 108 95 49 34 44 34 99 111 110
116 101 110 116 34 58 34 49 34 125 262 260 263""".split()]


class ChatFormat(unittest.TestCase):
    def test_spec_example(self):
        messages = [
            {"role": "system", "content": "S"},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "", "reasoning_content": "r",
             "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "1"},
        ]
        self.assertEqual(chat.prompt_ids(messages, None), SPEC_IDS)

    def test_mask_leaves_the_engine_written_call_id_out(self):
        task = gen_data.generate("train", 1, 1)[0]
        ids, mask = chat.render(task["messages"], task["tools"])
        text = bytes(i if i < 256 else 0 for i in ids)
        start = text.index(b'{"id":"call_')
        end = text.index(b'"name"', start)
        self.assertEqual(set(mask[start:end]), {0})
        self.assertEqual(mask[end], 1)
        self.assertEqual(ids[start - 1], chat.TOOL_CALL)
        self.assertEqual(mask[start - 1], 1)

    def test_generation_is_deterministic_and_splits_are_disjoint(self):
        a = gen_data.generate("eval", 2, 50)
        self.assertEqual(a, gen_data.generate("eval", 2, 50))
        train_q = {t["messages"][0]["content"] for t in gen_data.generate("train", 1, 3000)}
        self.assertFalse(train_q & {t["messages"][0]["content"] for t in a})

    def test_held_out_pools_are_unseen_in_training(self):
        train_units = {u for a, b, _ in gen_data.UNITS_TRAIN for u in (a, b)}
        eval_units = {u for a, b, _ in gen_data.UNITS_EVAL for u in (a, b)}
        self.assertEqual(eval_units - train_units, {"mg", "week", "kl", "ft", "in"})
        train_pairs = {frozenset(p[:2]) for p in gen_data.UNITS_TRAIN}
        self.assertFalse(train_pairs & {frozenset(p[:2]) for p in gen_data.UNITS_EVAL})
        self.assertFalse(set(gen_data.WORDS_TRAIN) & set(gen_data.WORDS_EVAL))
        for kind, phrases in gen_data.PHRASES["eval"].items():
            if kind != "prefix":
                self.assertFalse(set(map(str, phrases)) & set(map(str, gen_data.PHRASES["train"][kind])), kind)


if __name__ == "__main__":
    unittest.main()
