"""Entry script of the py2app bundle: the same as ``tandem`` on the command line."""

import sys

from app.cli import main

if __name__ == "__main__":
    sys.exit(main())
