"""The training loop's data and schedule: the same for any number of data
workers, and a timed run replayable from its logged decay step.

  /usr/bin/python3 -m unittest discover -s tools/train
"""

import argparse
import os
import sys
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train  # noqa: E402


def take(stream, n):
    out = []
    for _ in range(n):
        out.append(next(stream))
    stream.close()
    return out


class DataWindows(unittest.TestCase):
    def jobs(self, drills, windows=3, batch=4):
        return [(7, w, batch, drills, True, 0 if drills else 40) for w in range(windows)]

    def assert_same(self, a, b):
        self.assertEqual(len(a), len(b))
        for (ia, ma, la), (ib, mb, lb) in zip(a, b):
            np.testing.assert_array_equal(ia, ib)
            np.testing.assert_array_equal(ma, mb)
            np.testing.assert_array_equal(la, lb)

    def test_any_worker_count_gives_the_same_batches(self):
        for drills in (True, False):
            n = 3 * train.WINDOW_BATCHES
            one = take(train.batch_stream(iter(self.jobs(drills)), 1), n)
            two = take(train.batch_stream(iter(self.jobs(drills)), 2), n)
            self.assert_same(one, two)

    def test_windows_differ(self):
        a = train.make_window(self.jobs(True)[0])
        b = train.make_window(self.jobs(True)[1])
        self.assertFalse(all(np.array_equal(x[0], y[0]) for x, y in zip(a, b)))

    def test_tensors_mask_only_generated_positions_inside_each_row(self):
        ids, mask, lens = train.make_window(self.jobs(False)[0])[0]
        x, y, m, valid = train.tensors((ids, mask, lens), "cpu")
        for b in range(len(lens)):
            self.assertEqual(int(valid[b].sum()), int(lens[b]) - 1)
            self.assertFalse(bool((m[b] & ~valid[b]).any()))
            self.assertGreater(int(m[b].sum()), 0)


def args(**kw):
    base = dict(steps=1000, lr=1.0, warmup=10, time_budget=0.0, decay_start=0, decay_steps=20)
    base.update(kw)
    return argparse.Namespace(**base)


class Schedules(unittest.TestCase):
    def test_timed_decay_starts_where_the_budget_says_and_replays(self):
        timed = train.Schedule(args(time_budget=100.0))
        lrs, step, elapsed = [], 0, 0.0
        while step < timed.last_step():
            lrs.append(timed.lr(step))
            elapsed += 1.0  # one second a step: the decay (20 steps) must start by step 79
            timed.observe(step, elapsed, 1.0)
            step += 1
        self.assertEqual(timed.decay_start, 79)
        self.assertEqual(step, 99)
        replay = train.Schedule(args(decay_start=timed.decay_start))
        self.assertEqual(replay.last_step(), step)
        self.assertEqual([replay.lr(i) for i in range(step)], lrs)
        self.assertAlmostEqual(lrs[50], 1.0)
        self.assertLess(lrs[-1], 0.11)

    def test_untimed_decay_ends_at_steps(self):
        s = train.Schedule(args(steps=60, time_budget=1e9))
        step = 0
        while step < s.last_step():
            s.observe(step, 0.0, 0.0)
            step += 1
        self.assertEqual((s.decay_start, step), (40, 60))

    def test_cosine_without_budget(self):
        s = train.Schedule(args(steps=100, warmup=0))
        self.assertEqual(s.last_step(), 100)
        self.assertAlmostEqual(s.lr(5), 1.0)
        self.assertAlmostEqual(s.lr(99), 0.1, places=2)


if __name__ == "__main__":
    unittest.main()
