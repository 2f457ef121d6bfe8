"""same_outputs.compare on hand-made eval.mjs results: equal outputs pass, and
each kind of difference (a byte of content, a tool call's id or arguments, a
turn more, an error on both sides, too few tasks, a run without turns) is
reported."""

import copy
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import same_outputs  # noqa: E402


def run(tasks):
    return {"model": {"high": tasks}}


def task(question, *turns, error=None):
    r = {"question": question, "turns": list(turns)}
    if error:
        r["error"] = error
    return r


def turn(content, calls=(), reasoning="r", finish="stop", tokens=7):
    return {"finish_reason": finish, "content": content, "reasoning_content": reasoning,
            "tool_calls": [{"id": i, "name": n, "arguments": a} for i, n, a in calls], "completion_tokens": tokens}


BASE = run([
    task("add", turn(None, [("call_A", "calculator", '{"expression":"1+2"}')], finish="tool_calls"), turn("3")),
    task("hello", turn("Hi there.")),
])


class SameOutputsTest(unittest.TestCase):
    def changed(self, edit):
        other = copy.deepcopy(BASE)
        edit(other["model"]["high"])
        return same_outputs.compare(BASE, other, 2)

    def test_identical_runs_agree(self):
        tasks, turns, problems = same_outputs.compare(BASE, copy.deepcopy(BASE), 2)
        self.assertEqual((tasks, turns, problems), (2, 3, []))

    def test_one_byte_of_content(self):
        _, _, problems = self.changed(lambda t: t[1]["turns"][0].update(content="Hi there!"))
        self.assertEqual(len(problems), 1)
        self.assertIn("task 1", problems[0])
        self.assertIn("content", problems[0])

    def test_a_call_id_and_its_arguments(self):
        _, _, ids = self.changed(lambda t: t[0]["turns"][0]["tool_calls"][0].update(id="call_B"))
        _, _, args = self.changed(lambda t: t[0]["turns"][0]["tool_calls"][0].update(arguments='{"expression":"1+3"}'))
        self.assertEqual([len(ids), len(args)], [1, 1])
        self.assertIn("call_B", ids[0])

    def test_token_count_and_an_extra_turn(self):
        _, _, count = self.changed(lambda t: t[1]["turns"][0].update(completion_tokens=8))
        _, _, extra = self.changed(lambda t: t[1]["turns"].append(turn("More.")))
        self.assertIn("completion_tokens", count[0])
        self.assertIn("1 turns against 2", extra[0])

    def test_errors_never_compare_equal(self):
        failed = run([task("add", error="timeout"), task("hello", turn("Hi there."))])
        _, _, problems = same_outputs.compare(failed, copy.deepcopy(failed), 2)
        self.assertEqual(len(problems), 2)  # the first run's and the second's
        self.assertTrue(all("timeout" in p for p in problems))

    def test_too_few_tasks_and_missing_turns(self):
        _, _, few = same_outputs.compare(BASE, copy.deepcopy(BASE), 3)
        self.assertIn("fewer than 3", few[0])
        bare = copy.deepcopy(BASE)
        del bare["model"]["high"][0]["turns"]
        _, _, missing = same_outputs.compare(BASE, bare, 2)
        self.assertTrue(any("no turns" in p for p in missing))

    def test_a_task_more_or_another_tier(self):
        longer = copy.deepcopy(BASE)
        longer["model"]["high"].append(task("x", turn("y")))
        self.assertIn("2 tasks against 3", same_outputs.compare(BASE, longer, 1)[2][0])
        self.assertIn("tiers", same_outputs.compare(BASE, {"model": {"low": []}}, 1)[2][0])


if __name__ == "__main__":
    unittest.main()
