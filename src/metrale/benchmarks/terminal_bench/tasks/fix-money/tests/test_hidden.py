"""The verifier's own cases for parse_amount's docstring (the agent never sees them)."""

import unittest

from ledger import format_amount, parse_amount


class Contract(unittest.TestCase):
    def test_exact_for_every_two_decimal_amount(self):
        for cents in range(0, 100_000, 7):
            text = f"{cents // 100}.{cents % 100:02d}"
            self.assertEqual(parse_amount(text), cents, text)
            self.assertEqual(parse_amount("-" + text), -cents, text)

    def test_forms(self):
        self.assertEqual(parse_amount(" 3.10 "), 310)
        self.assertEqual(parse_amount("+4.2"), 420)
        self.assertEqual(parse_amount("1234567890.12"), 123456789012)

    def test_rejects(self):
        for bad in ("", "-", "1.005", "abc", "1,50", "1e3", "nan", "inf", "1.2.3", ". 5"):
            with self.assertRaises(ValueError, msg=repr(bad)):
                parse_amount(bad)

    def test_format(self):
        self.assertEqual(format_amount(-5), "-0.05")


if __name__ == "__main__":
    unittest.main()
