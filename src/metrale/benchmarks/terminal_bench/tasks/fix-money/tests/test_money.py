import unittest

from ledger import format_amount, parse_amount, split


class ParseAmount(unittest.TestCase):
    def test_whole_numbers(self):
        self.assertEqual(parse_amount("12"), 1200)

    def test_cents_are_exact(self):
        self.assertEqual(parse_amount("0.29"), 29)
        self.assertEqual(parse_amount("19.99"), 1999)

    def test_sign(self):
        self.assertEqual(parse_amount("-1.5"), -150)


class FormatAmount(unittest.TestCase):
    def test_round_trip(self):
        for text in ("0.00", "0.05", "12.34", "-7.10"):
            self.assertEqual(format_amount(parse_amount(text)), text)


class Split(unittest.TestCase):
    def test_shares_add_up(self):
        self.assertEqual(split(1000, 3), [334, 333, 333])
        self.assertEqual(sum(split(101, 7)), 101)


if __name__ == "__main__":
    unittest.main()
