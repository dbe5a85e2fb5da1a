#!/usr/bin/env python3
"""Unit test of bench/benchstats.py (standard library only; run by ctest as benchstats_unit)."""
import os
import random
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchstats as bs  # noqa: E402


class BenchStats(unittest.TestCase):
    def test_median(self):
        self.assertEqual(bs.median([3, 1, 2]), 2.0)
        self.assertEqual(bs.median([4, 1, 3, 2]), 2.5)
        self.assertEqual(bs.median([7]), 7.0)
        with self.assertRaises(ValueError):
            bs.median([])

    def test_percentile(self):
        v = [0.0, 10.0, 20.0, 30.0, 40.0]
        self.assertEqual(bs.percentile(v, 0.0), 0.0)
        self.assertEqual(bs.percentile(v, 1.0), 40.0)
        self.assertAlmostEqual(bs.percentile(v, 0.5), 20.0)
        self.assertAlmostEqual(bs.percentile(v, 0.125), 5.0)

    def test_bootstrap_constant_and_single(self):
        self.assertEqual(bs.bootstrap_ci([5.0] * 10), (5.0, 5.0))
        self.assertEqual(bs.bootstrap_ci([3.0]), (3.0, 3.0))

    def test_bootstrap_brackets_median_and_is_reproducible(self):
        rng = random.Random(7)
        xs = [100 + rng.gauss(0, 5) for _ in range(15)]
        lo, hi = bs.bootstrap_ci(xs, seed=3)
        self.assertLess(lo, bs.median(xs))
        self.assertGreater(hi, bs.median(xs))
        self.assertGreaterEqual(lo, min(xs))
        self.assertLessEqual(hi, max(xs))
        self.assertEqual((lo, hi), bs.bootstrap_ci(xs, seed=3))

    def test_bootstrap_coverage(self):
        # Over many samples of a known distribution, the 95% interval of the median should hold
        # the true median (100) most of the time; the percentile bootstrap of a median at n=15
        # is somewhat anti-conservative, so the bound is loose but catches a broken interval.
        rng = random.Random(11)
        hits = 0
        trials = 200
        for t in range(trials):
            xs = [100 + rng.gauss(0, 10) for _ in range(15)]
            lo, hi = bs.bootstrap_ci(xs, reps=400, seed=t)
            hits += lo <= 100 <= hi
        self.assertGreater(hits / trials, 0.85)

    def test_paired_ratios(self):
        a = {0: 10.0, 1: 12.0, 2: 9.0, 3: 5.0}
        b = {0: 5.0, 1: 6.0, 2: 0.0}
        self.assertEqual(bs.paired_ratios(a, b), [2.0, 2.0])

    def test_summary(self):
        s = bs.summary([1.0, 2.0, 3.0, 4.0, 100.0])
        self.assertEqual(s["n"], 5)
        self.assertEqual(s["median"], 3.0)
        self.assertEqual(s["min"], 1.0)
        self.assertEqual(s["max"], 100.0)
        self.assertLessEqual(s["lo"], 3.0)
        self.assertGreaterEqual(s["hi"], 3.0)

    def test_slope(self):
        ts = [0, 1, 2, 3, 4]
        self.assertAlmostEqual(bs.slope(ts, [2 * t + 1 for t in ts]), 2.0)
        self.assertAlmostEqual(bs.slope(ts, [5, 5, 5, 5, 5]), 0.0)
        self.assertAlmostEqual(bs.slope([0, 1, 2, 3], [0, 2, 0, 2]), 0.4)
        with self.assertRaises(ValueError):
            bs.slope([1], [1])
        with self.assertRaises(ValueError):
            bs.slope([2, 2], [1, 3])

    def test_verdict(self):
        self.assertEqual(bs.interval_verdict(0.5, 0.9), "below")
        self.assertEqual(bs.interval_verdict(1.1, 1.3), "above")
        self.assertEqual(bs.interval_verdict(0.9, 1.1), "overlaps")


if __name__ == "__main__":
    unittest.main()
