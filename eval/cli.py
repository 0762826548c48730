"""The ``cosmos3-gym`` console script."""

from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cosmos3-gym")
    parser.parse_args(argv)
    return 0
