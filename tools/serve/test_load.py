#!/usr/bin/env python3
"""Unit tests of tools/serve/load.py's arithmetic and parsing (no server needed):
`python3 -m unittest tools/serve/test_load.py` (tools/test.sh runs it)."""
import argparse
import os
import random
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import load  # noqa: E402


class Percentiles(unittest.TestCase):
    def test_linear_interpolation_between_ranks(self):
        v = [4.0, 1.0, 3.0, 2.0]  # sorted: 1 2 3 4
        self.assertEqual(load.percentile(v, 0), 1.0)
        self.assertEqual(load.percentile(v, 100), 4.0)
        self.assertAlmostEqual(load.percentile(v, 50), 2.5)
        self.assertAlmostEqual(load.percentile(v, 90), 3.7)
        self.assertIsNone(load.percentile([], 50))

    def test_pcts_in_milliseconds(self):
        p = load.pcts([0.1] * 10 + [1.0])
        self.assertEqual(p["p50"], 100.0)
        self.assertEqual(p["p99"], 910.0)
        self.assertEqual(load.pcts([]), {"p50": None, "p90": None, "p99": None})


class Summary(unittest.TestCase):
    def test_only_normal_successes_enter_the_latencies(self):
        rs = [
            load.Result("normal", True, output_tokens=10, ttft=0.5, tpot=0.1, prompt_tokens=100),
            load.Result("normal", True, output_tokens=10, ttft=1.5, tpot=0.3, prompt_tokens=120),
            load.Result("disconnect", True, output_tokens=2, ttft=9.0),
            load.Result("overflow", True),
            load.Result("normal", False, error="HTTP 500"),
        ]
        s = load.summarize(rs, 2.0, 4)
        self.assertEqual((s["requests_ok"], s["requests_failed"]), (4, 1))
        self.assertEqual(s["output_tokens"], 22)
        self.assertEqual(s["output_tok_s"], 11.0)
        self.assertEqual(s["mean_prompt_tokens"], 110.0)
        self.assertEqual(s["ttft_ms"]["p50"], 1000.0)
        self.assertEqual(s["tpot_ms"]["p50"], 200.0)


class Parsing(unittest.TestCase):
    def test_levels(self):
        self.assertEqual(load.parse_levels("1,4,16"), [1, 4, 16])
        for bad in ("", "0", "1,x", "-2"):
            with self.assertRaises(argparse.ArgumentTypeError):
                load.parse_levels(bad)

    def test_server_root(self):
        self.assertEqual(load.server_root("http://h:1/v1"), "http://h:1")
        self.assertEqual(load.server_root("http://h:1/v1/"), "http://h:1")
        self.assertEqual(load.server_root("http://h:1"), "http://h:1")

    def test_synthetic_text_has_the_asked_number_of_words(self):
        t = load.synthetic_text(random.Random(1), 50)
        self.assertEqual(len(t.split()), 50)
        self.assertEqual(t, load.synthetic_text(random.Random(1), 50))


if __name__ == "__main__":
    unittest.main()
