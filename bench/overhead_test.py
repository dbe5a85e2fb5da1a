#!/usr/bin/env python3
"""Unit test of bench/overhead.py's output checks, on the real formats of launch_loop, the floor,
scripts/count.lua and --record (run by ctest as overhead_check_unit; no GPU needed)."""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import overhead as oh  # noqa: E402

LOOP = "RESULT launch_loop launches 1000 wall_ns 4400.50 cpu_ns 3900.25\nLAUNCHED 2000\n"
COUNT = "kind                        records\nconcurrent_kernel              %d\nruntime                        %d\ntotal 0\n"
REC = "cuptimon-lua: recorded /tmp/x/rec.15745.cmcap: 7 frames, 2 batches, %d records, %d dropped\n"
FLOOR = "cupti_floor: kernels %d runtime %d other 0 dropped %d buffers 3\n"


class Check(unittest.TestCase):
    def test_figures(self):
        self.assertEqual(oh.parse_figures("launch", LOOP), (4400.5, 3900.25))
        self.assertEqual(oh.parse_figures("torch", "RESULT micro none ns_per_op 10180.5 "
                                          "cpu_ns_per_op 9000.0\n"), (10180.5, 9000.0))
        self.assertIsNone(oh.parse_figures("torch", "RESULT micro none ns_per_op 1\n"))
        self.assertEqual(oh.parse_figures("train", "RESULT steps none ns_per_op 1430000.0 "
                                          "cpu_ns_per_op 1200000.5\n"), (1430000.0, 1200000.5))

    def test_status_and_lost(self):
        self.assertFalse(oh.check("untraced", "launch", 1, LOOP, "")[0])
        self.assertTrue(oh.check("untraced", "launch", 0, LOOP, "")[0])
        self.assertFalse(oh.check("cm_top", "torch", 0, "", "cuptimon-lua: LOST 5 of 9 records")[0])
        self.assertFalse(oh.check("untraced", "launch", 0, "RESULT x\n", "")[0])  # no LAUNCHED

    def test_floor(self):
        self.assertTrue(oh.check("floor_k", "launch", 0, LOOP, FLOOR % (2000, 0, 0))[0])
        self.assertFalse(oh.check("floor_k", "launch", 0, LOOP, FLOOR % (1999, 0, 0))[0])
        self.assertFalse(oh.check("floor_k", "launch", 0, LOOP, FLOOR % (2000, 0, 4))[0])
        self.assertFalse(oh.check("floor_k", "launch", 0, LOOP, "")[0])
        self.assertTrue(oh.check("floor_kr", "launch", 0, LOOP, FLOOR % (2000, 2003, 0))[0])
        self.assertFalse(oh.check("floor_kr", "launch", 0, LOOP, FLOOR % (2000, 1999, 0))[0])
        self.assertFalse(oh.check("floor_kr", "torch", 0, "", FLOOR % (500, 0, 0))[0])
        self.assertTrue(oh.check("floor_kr", "torch", 0, "", FLOOR % (500, 900, 0))[0])

    def test_count(self):
        self.assertTrue(oh.check("cm_count", "launch", 0, LOOP + COUNT % (2000, 2001), "")[0])
        self.assertFalse(oh.check("cm_count", "launch", 0, LOOP + COUNT % (1999, 2001), "")[0])
        self.assertFalse(oh.check("cm_count", "torch", 0, COUNT % (100, 0), "")[0])
        self.assertTrue(oh.check("cm_count", "torch", 0, COUNT % (100, 500), "")[0])

    def test_duty(self):
        est = "estimated concurrent_kernel 1990 ± 40 (95%, 12 windows)\nduty 0.050 (50 of every 1000 ms)\n"
        ok, note, _ = oh.check("duty05", "launch", 0, LOOP + est, "")
        self.assertTrue(ok)
        self.assertIn("estimated 1990 ± 40 kernels in 12 windows (launched 2000)", note)
        self.assertFalse(oh.check("duty10", "launch", 0, LOOP, "")[0])  # no window, no estimate
        self.assertFalse(oh.check("duty05", "torch", 0, est, "cuptimon-lua: LOST 3 of 9 records")[0])
        argv, env = oh.Setup.command(type("S", (), {"lua": "L", "workload": lambda self, w: ["W"]})(),
                                     "duty10", "launch")
        self.assertEqual(argv[1:6], [os.path.join(oh.ROOT, "scripts", "count.lua"), "--duty", "0.1",
                                     "--period-ms", os.environ.get("DUTY_PERIOD_MS", "1000")])
        self.assertEqual(argv[-2:], ["--", "W"])
        self.assertEqual(env, {})
        argv, env = oh.Setup.command(type("S", (), {"lua": "L", "workload": lambda self, w: ["W"]})(),
                                     "duty05d", "launch")
        self.assertEqual(argv[3], "0.05")
        self.assertEqual(env, {"CUPTIMON_DETACH_IDLE": "1"})

    def test_record(self):
        self.assertTrue(oh.check("cm_record", "launch", 0, LOOP, REC % (4001, 0))[0])
        self.assertFalse(oh.check("cm_record", "launch", 0, LOOP, REC % (4001, 2))[0])
        self.assertFalse(oh.check("cm_record", "launch", 0, LOOP, REC % (3999, 0))[0])
        self.assertFalse(oh.check("cm_record", "launch", 0, LOOP, "")[0])


if __name__ == "__main__":
    unittest.main()
