"""`python -m goosedump.server ...`: the same as `goosedump serve ...`."""
import sys

from ..cli import main

sys.exit(main(["serve", *sys.argv[1:]]))
